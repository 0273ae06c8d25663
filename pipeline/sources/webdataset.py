"""The `webdataset` source: existing tar shards (img2dataset's output included), local or
remote, planned per tar and streamed member by member, big members spilled to local disk; a
damaged tar costs its remaining samples a named drop reason, never the build."""

from __future__ import annotations

import json
import tarfile
import time
from collections.abc import Iterator
from typing import Any

from mmcurate.core.config_io import ConfigError
from mmcurate.core.formats import IMAGE_COLUMNS, VIDEO_COLUMNS, meta_json
from mmcurate.core.storage import (
    filesystem,
    is_glob,
    is_local,
    local_version,
    matching,
    protocol_of,
    store_version,
    transient_errors,
    with_protocol,
)
from mmcurate.core.tario import LINKS, SpillTo, iter_tar_samples, safe_key, text_name
from mmcurate.pipeline.config import SourceConfig
from mmcurate.pipeline.sources.records import TarPartition
from mmcurate.pipeline.sources.samples import (
    SOURCE,
    WHOLE,
    Chunker,
    Reading,
    decode_caption,
    sanitize_key,
    whole_batch,
)
from mmcurate.stages.base import DROP, DROP_STAGE, Columns


def plan_webdataset(cfg: SourceConfig, storage_options: dict[str, Any]) -> list[TarPartition]:
    """One partition per tar matched by the glob (sorted, so order is deterministic). Each
    carries `inputs`, the tar's size and version (modification time, ETag), so a tar changed
    in place changes the build identity."""
    fs, pattern = filesystem(cfg.path, storage_options)
    tars = tar_versions(fs, pattern)
    if not tars:
        raise ConfigError(f"source.path: no tar files match {cfg.path}")
    protocol = protocol_of(cfg.path)
    return [
        TarPartition(kind="webdataset", number=i, tar=t, protocol=protocol, inputs=tars[t])
        for i, t in enumerate(sorted(tars))
    ]


def tar_versions(fs: Any, pattern: str) -> dict[str, str]:
    """The files `pattern` names, each with its version "size:tag" (as `find_versions`): on a
    local disk one stat each, on a store what its listing says (no request per file)."""
    if is_local(fs):
        return {t: local_version(t) for t in matching(fs, pattern) if fs.isfile(t)}
    fs.invalidate_cache()  # a listing cached in this process would hide a replaced tar
    if is_glob(fs, pattern):
        found = fs.glob(pattern, detail=True)
    else:
        found = {pattern: fs.info(pattern)} if fs.isfile(pattern) else {}
    return {
        path: f"{info.get('size')}:{store_version(info)}"
        for path, info in found.items()
        if info.get("type") == "file"
    }


def read_webdataset(part: TarPartition, storage_options: dict[str, Any]) -> Columns:
    """One tar's samples, as one batch."""
    return whole_batch(webdataset_chunks(part, storage_options, WHOLE))


def webdataset_chunks(
    part: TarPartition, storage_options: dict[str, Any], reading: Reading
) -> Iterator[Columns]:
    """Stream one tar in chunks. A transient storage error restarts the stream past the
    samples already read (bounded), so none is read twice; a damaged tar keeps the samples
    before the damage and counts one `corrupt_tar` error."""
    fs, path = filesystem(with_protocol(part.protocol, part.tar), storage_options)
    transient = transient_errors()
    chunker, seen = Chunker(reading), set()
    spill = None
    if reading.spill_bytes is not None and reading.folder is not None:
        spill = SpillTo(reading.folder, reading.spill_bytes, SPILLED_COLUMNS)
    for attempt in range(3):
        try:
            yield from chunker.feed(stream_tar(fs, path, part, seen, chunker.count, spill))
            break
        except tarfile.TarError as err:
            chunker.add(damage_row(part, path, err, chunker.count))
            break
        except transient as err:
            if isinstance(err, FileNotFoundError) or attempt == 2:
                chunker.add(damage_row(part, path, err, chunker.count))
                break
            time.sleep(0.5 * 2**attempt)
    yield from chunker.rest()


def stream_tar(
    fs: Any, path: str, part: TarPartition, seen: set[str], start: int, spill: SpillTo | None
) -> Iterator[dict[str, Any]]:
    """The tar's samples from sample `start` on (those before it are skipped unread)."""
    with fs.open(path, "rb") as fileobj:
        raws = iter_tar_samples(fileobj, start, links=True, spill=spill)
        for index, raw in enumerate(raws, start):
            sample = tar_sample(raw, part, index)
            if sample["__key__"] in seen:  # members of one key not adjacent, or repeated
                sample.update({DROP: "duplicate_key", DROP_STAGE: SOURCE})
            seen.add(sample["__key__"])
            yield sample


def damage_row(part: TarPartition, path: str, err: Exception, index: int) -> dict[str, Any]:
    stem = sanitize_key(path.rpartition("/")[2])
    return {
        "__key__": f"{stem}_damaged",
        "__part__": part.number,
        "__index__": index,
        "__source__": text_name(path),
        DROP: f"corrupt_tar:{type(err).__name__}",
        DROP_STAGE: SOURCE,
    }


CARRIED = (*IMAGE_COLUMNS, *VIDEO_COLUMNS, "cls")  # tar members copied as they are


# Members a big one of which is kept on disk: media only (captions and json are decoded here,
# `cls` goes into the signatures).
SPILLED_COLUMNS = frozenset((*IMAGE_COLUMNS, *VIDEO_COLUMNS))


def tar_sample(raw: dict[str, Any], part: TarPartition, index: int) -> dict[str, Any]:
    """A WebDataset sample. One with none of the members a build carries (images, videos,
    txt, json, cls; e.g. only `.npy`) is dropped as no_members: written, it would be a
    sample with no files that the manifest counts and readers never see. One with a member
    that is a link (symbolic or hard; or a device, a FIFO), whose data a stream cannot read,
    is dropped as link_member: kept, it would silently lack that member."""
    sample = {col: raw.get(col) for col in CARRIED}
    key = safe_key(raw["__key__"])
    sample.update(
        {
            "__key__": key,
            "__part__": part.number,
            "__index__": index,
            "__source__": text_name(part.tar),
        }
    )
    text, reason = decode_caption(raw.get("txt"))
    sample["txt"] = text
    meta, meta_ok = member_meta(raw.get("json"), raw["__key__"], key)
    sample["json"] = meta
    reason = reason or (None if meta_ok else "bad_json")
    if all(raw.get(col) is None for col in (*CARRIED, "txt", "json")):
        reason = "no_members"
    if raw.get(LINKS):
        reason = "link_member"
    if reason:
        sample.update({DROP: reason, DROP_STAGE: SOURCE})
    return sample


def member_meta(data: bytes | None, member_key: str, key: str) -> tuple[str | None, bool]:
    """(json text, usable): a `.json` member must be UTF-8 JSON holding an object, with no
    lone surrogate escapes (they cannot be written back as UTF-8). When the key had to change
    (dots, slashes, non-ASCII, too long), the tar's own key is kept as `source_member`."""
    text, meta, constants = None, {}, []
    if data is not None:
        try:
            text = data.decode("utf-8-sig")
            # NaN / Infinity: Python's json reads them, no other reader does: written as null
            meta = json.loads(text, parse_constant=lambda name: constants.append(name))
            if b"\\u" in data:  # escapes: check the value can be written out again
                json.dumps(meta, ensure_ascii=False).encode("utf-8")
        except (ValueError, RecursionError):  # UnicodeError is a ValueError
            return None, False
        if not isinstance(meta, dict):
            return None, False
    if key == member_key and not constants:
        return text, True
    meta.setdefault("source_member", text_name(member_key))
    return meta_json(meta, ensure_ascii=False, sort_keys=True), True

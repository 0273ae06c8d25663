"""Sources: plan input partitions on the driver (pure), read one partition in a task.

A partition is a small JSON-able dict. Reading it yields a batch (dict of column lists) with
`__key__`, `__part__`, `__index__` (position, which fixes output order), `__source__`, `txt`,
`json`, the image columns, and `__drop__`/`__drop_stage__` for samples the source rejects.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
import time
from collections.abc import Iterator
from typing import Any

from core.config_io import ConfigError
from core.formats import meta_json
from core.storage import (
    filesystem,
    find_versions,
    is_glob,
    is_local,
    local_version,
    matching,
    protocol_of,
    store_version,
    transient_errors,
    with_protocol,
)
from core.tario import EXT_ALIASES, LINKS, SpillTo, iter_tar_samples, safe_key, text_name
from pipeline.config import SourceConfig
from pipeline.samples import (
    SOURCE,
    WHOLE,
    Chunker,
    Reading,
    append_sample,
    decode_caption,
    empty_batch,
    sanitize_key,
    whole_batch,
)
from pipeline.source_files import fetch_files, file_groups, file_sizes
from pipeline.source_urls import plan_urls, read_urls
from pipeline.source_videos import (
    VIDEO_EXTS,
    disambiguate_keys,
    is_list_file,
    plan_video_glob,
    plan_video_list,
    video_list_chunks,
)
from stages.base import DROP, DROP_STAGE, IMAGE_COLUMNS, VIDEO_COLUMNS, Columns

IMAGE_EXTS = {"jpg", "jpeg", "png", "webp", "gif", "bmp", "tif", "tiff"}


# ---- images: a folder of image files with sidecar .txt captions and .json metadata -------

SIDECARS = ("txt", "json")


def plan_images(
    cfg: SourceConfig, storage_options: dict[str, Any], exts: set[str] = IMAGE_EXTS
) -> list[dict[str, Any]]:
    """List the folder once; split sorted media files into partitions of `files_per_task`.
    Each partition carries `inputs`, a hash of its files' sizes and versions (modification
    times, ETags), so a file changed in place changes the build identity."""
    fs, root = filesystem(cfg.path, storage_options)
    if not fs.isdir(root):
        raise ConfigError(f"source.path: folder not found: {cfg.path}")
    listing = find_versions(fs, root)  # once: on object stores every listing is many requests
    files = sorted(p for p in listing if p.rpartition(".")[2].lower() in exts)
    root = root.rstrip("/")
    entries, versions = [], []
    for path in files:
        rel = path[len(root) + 1 :]
        stem = rel.rpartition(".")[0]
        entry = {"rel": rel, "key": safe_key(stem), "size": listed_size(listing[path])}
        entry.update({ext: f"{root}/{stem}.{ext}" in listing for ext in SIDECARS})
        entries.append(entry)
        sidecars = [listing.get(f"{root}/{stem}.{ext}", "") for ext in SIDECARS]
        versions.append([rel, listing[path], *sidecars])
    disambiguate_keys(entries)
    size = cfg.files_per_task
    return [
        {
            "kind": cfg.kind,
            "part": i,
            "root": root,
            "protocol": protocol_of(cfg.path),
            "entries": entries[start : start + size],
            "inputs": digest(versions[start : start + size]),
        }
        for i, start in enumerate(range(0, len(entries), size))
    ]


def listed_size(version: str) -> int | None:
    """The size in a listing's "size:tag" version (None where the listing had none), so a
    task can plan its reads in bytes without a request per file."""
    size = version.partition(":")[0]
    return int(size) if size.isdigit() else None


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value).encode()).hexdigest()


def sidecar_path(root: str, entry: dict[str, Any], ext: str) -> str:
    return f"{root}/{entry['rel'].rpartition('.')[0]}.{ext}"


def read_images(part: dict[str, Any], storage_options: dict[str, Any]) -> Columns:
    """One partition's image bytes, captions and metadata, as one batch."""
    return whole_batch(image_chunks(part, storage_options, WHOLE))


def image_chunks(
    part: dict[str, Any], storage_options: dict[str, Any], reading: Reading
) -> Iterator[Columns]:
    """A folder partition in chunks: each a group of files bounded in count and bytes, read
    with one batched `cat` (files above `spill_bytes` by path or spilled, never whole)."""
    fs, _ = filesystem(with_protocol(part["protocol"], part["root"]), storage_options)
    root, entries = part["root"], part["entries"]
    sizes = [e.get("size") for e in entries]
    if reading != WHOLE and None in sizes:  # planned by a listing without sizes
        sizes = file_sizes(fs, [f"{root}/{e['rel']}" for e in entries])
    for group in file_groups(sizes, reading):
        chosen = [entries[i] for i in group]
        wanted = [f"{root}/{e['rel']}" for e in chosen]
        wanted_sizes = [sizes[i] for i in group]
        for ext in SIDECARS:
            found = [sidecar_path(root, e, ext) for e in chosen if e.get(ext)]
            wanted, wanted_sizes = wanted + found, wanted_sizes + [None] * len(found)
        blobs = fetch_files(fs, wanted, wanted_sizes, reading)
        yield image_batch(part, root, group, blobs)


def image_batch(part: dict[str, Any], root: str, group: range, blobs: dict) -> Columns:
    batch = empty_batch()
    for index in group:
        entry = part["entries"][index]
        path = f"{root}/{entry['rel']}"
        found = [
            blobs.get(sidecar_path(root, entry, ext)) if entry.get(ext) else None
            for ext in SIDECARS
        ]
        sample = image_sample(entry, blobs.get(path), *found)
        sample.update({"__part__": part["part"], "__index__": index, "__source__": text_name(path)})
        append_sample(batch, sample)
    return batch


def image_sample(
    entry: dict[str, Any], data: Any, caption: Any, meta: Any = None
) -> dict[str, Any]:
    """A folder's sample. A caption or metadata file that exists but cannot be read is a
    read_error (not a sample without them); metadata must be a JSON object (else bad_json)
    and `source`, the file's path, is added unless the metadata has its own."""
    ext = entry["rel"].rpartition(".")[2].lower()
    source = text_name(entry["rel"])
    sample: dict[str, Any] = {"__key__": entry["key"], "json": json.dumps({"source": source})}
    sidecars = [None if isinstance(b, FileNotFoundError) else b for b in (caption, meta)]
    caption, meta = sidecars  # gone since the listing (or a dangling link): none
    if any(isinstance(blob, Exception) for blob in (data, *sidecars)) or data is None:
        return sample | {DROP: "read_error", DROP_STAGE: SOURCE}
    sample[EXT_ALIASES.get(ext, ext)] = data
    text, reason = decode_caption(caption)
    sample["txt"] = text
    if meta is not None:
        sample["json"], usable = sidecar_meta(meta, source)
        reason = reason or (None if usable else "bad_json")
    if reason:
        sample.update({DROP: reason, DROP_STAGE: SOURCE})
    return sample


def sidecar_meta(data: bytes, source: str) -> tuple[str, bool]:
    """(json text, usable) of a `<stem>.json` beside an image, as a tar's `.json` member."""
    text, usable = member_meta(data, "", "")
    if not usable or text is None:
        return json.dumps({"source": source}), False
    meta = json.loads(text)
    meta.setdefault("source", source)
    return meta_json(meta, ensure_ascii=False, sort_keys=True), True


# ---- webdataset: tar shards, local or remote ------------------------------------------------


def plan_webdataset(cfg: SourceConfig, storage_options: dict[str, Any]) -> list[dict[str, Any]]:
    """One partition per tar matched by the glob (sorted, so order is deterministic). Each
    carries `inputs`, the tar's size and version (modification time, ETag), so a tar changed
    in place changes the build identity."""
    fs, pattern = filesystem(cfg.path, storage_options)
    tars = tar_versions(fs, pattern)
    if not tars:
        raise ConfigError(f"source.path: no tar files match {cfg.path}")
    protocol = protocol_of(cfg.path)
    return [
        {"kind": "webdataset", "part": i, "tar": t, "protocol": protocol, "inputs": tars[t]}
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


def read_webdataset(part: dict[str, Any], storage_options: dict[str, Any]) -> Columns:
    """One tar's samples, as one batch."""
    return whole_batch(webdataset_chunks(part, storage_options, WHOLE))


def webdataset_chunks(
    part: dict[str, Any], storage_options: dict[str, Any], reading: Reading
) -> Iterator[Columns]:
    """Stream one tar in chunks. A transient storage error restarts the stream past the
    samples already read (bounded), so none is read twice; a damaged tar keeps the samples
    before the damage and counts one `corrupt_tar` error."""
    fs, path = filesystem(with_protocol(part["protocol"], part["tar"]), storage_options)
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
    fs: Any, path: str, part: dict[str, Any], seen: set[str], start: int, spill: SpillTo | None
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


def damage_row(part: dict[str, Any], path: str, err: Exception, index: int) -> dict[str, Any]:
    stem = sanitize_key(path.rpartition("/")[2])
    return {
        "__key__": f"{stem}_damaged",
        "__part__": part["part"],
        "__index__": index,
        "__source__": text_name(path),
        DROP: f"corrupt_tar:{type(err).__name__}",
        DROP_STAGE: SOURCE,
    }


CARRIED = (*IMAGE_COLUMNS, *VIDEO_COLUMNS, "cls")  # tar members copied as they are
# Members a big one of which is kept on disk: media only (captions and json are decoded here,
# `cls` goes into the signatures).
SPILLED_COLUMNS = frozenset((*IMAGE_COLUMNS, *VIDEO_COLUMNS))


def tar_sample(raw: dict[str, Any], part: dict[str, Any], index: int) -> dict[str, Any]:
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
            "__part__": part["part"],
            "__index__": index,
            "__source__": text_name(part["tar"]),
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


def plan_videos(cfg: SourceConfig, storage_options: dict[str, Any]) -> list[dict[str, Any]]:
    """Video files (mp4, webm, avi, mkv, mov): a folder or a glob with sidecar .txt captions,
    or a list file of paths and captions (pipeline/source_videos.py)."""
    if is_list_file(cfg.path):
        return plan_video_list(cfg, storage_options)
    if is_glob(*filesystem(cfg.path, storage_options)):
        return plan_video_glob(cfg, storage_options)
    return plan_images(cfg, storage_options, VIDEO_EXTS)


def url_chunks(
    part: dict[str, Any], storage_options: dict[str, Any], reading: Reading
) -> Iterator[Columns]:
    """URL rows hold no media (download fetches it, a chunk at a time): read whole, split."""
    return iter_chunks(read_urls(part, storage_options), reading.batch_size)


PLANNERS = {
    "images": plan_images,
    "videos": plan_videos,
    "webdataset": plan_webdataset,
    "urls": plan_urls,
}
CHUNK_READERS = {
    "images": image_chunks,
    "videos": image_chunks,  # the same folder reader: bytes go to the column of their extension
    "video_list": video_list_chunks,
    "webdataset": webdataset_chunks,
    "urls": url_chunks,
}


def plan_source(cfg: SourceConfig, storage_options: dict[str, Any]) -> list[dict[str, Any]]:
    return PLANNERS[cfg.kind](cfg, storage_options)


def read_chunks(
    part: dict[str, Any], storage_options: dict[str, Any], reading: Reading
) -> Iterator[Columns]:
    """One partition in chunks (`Reading`): output order, keys, `__index__` and drop reasons
    are the same for any chunk size."""
    return CHUNK_READERS[part["kind"]](part, storage_options, reading)


def read_partition(part: dict[str, Any], storage_options: dict[str, Any]) -> Columns:
    """One partition as one batch, nothing spilled (for tools and tests; a build reads it in
    chunks)."""
    return whole_batch(read_chunks(part, storage_options, WHOLE))


def iter_chunks(batch: Columns, size: int) -> Iterator[Columns]:
    """Split a batch into batches of at most `size` rows."""
    total = len(batch["__key__"])
    for start in range(0, total, size):
        yield {col: values[start : start + size] for col, values in batch.items()}

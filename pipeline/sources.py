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
    cat_many,
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
    with_retries,
)
from core.tario import EXT_ALIASES, LINKS, iter_tar_samples, safe_key, text_name
from pipeline.config import SourceConfig
from pipeline.samples import SOURCE, append_sample, decode_caption, empty_batch, sanitize_key
from pipeline.source_urls import plan_urls, read_urls
from pipeline.source_videos import (
    VIDEO_EXTS,
    disambiguate_keys,
    is_list_file,
    plan_video_glob,
    plan_video_list,
    read_video_list,
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
        entry = {"rel": rel, "key": safe_key(stem)}
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


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value).encode()).hexdigest()


def sidecar_path(root: str, entry: dict[str, Any], ext: str) -> str:
    return f"{root}/{entry['rel'].rpartition('.')[0]}.{ext}"


def read_images(part: dict[str, Any], storage_options: dict[str, Any]) -> Columns:
    """Read one partition's image bytes, captions and metadata (one batched `cat`)."""
    fs, _ = filesystem(with_protocol(part["protocol"], part["root"]), storage_options)
    root = part["root"]
    wanted = [f"{root}/{e['rel']}" for e in part["entries"]]
    for ext in SIDECARS:
        wanted += [sidecar_path(root, e, ext) for e in part["entries"] if e.get(ext)]
    blobs = cat_many(fs, wanted)
    for path, value in blobs.items():  # a storage hiccup must not turn into read_error drops
        if isinstance(value, Exception) and not isinstance(value, FileNotFoundError):
            blobs[path] = read_or_error(fs, path)
    batch = empty_batch()
    for index, entry in enumerate(part["entries"]):
        path = f"{root}/{entry['rel']}"
        found = [
            blobs.get(sidecar_path(root, entry, ext)) if entry.get(ext) else None
            for ext in SIDECARS
        ]
        sample = image_sample(entry, blobs.get(path), *found)
        sample.update({"__part__": part["part"], "__index__": index, "__source__": text_name(path)})
        append_sample(batch, sample)
    return batch


def read_or_error(fs: Any, path: str) -> bytes | Exception:
    try:
        return with_retries(lambda: fs.cat_file(path))
    except transient_errors() as err:
        return err


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
    """Stream one tar. A transient storage error restarts the stream (bounded); a damaged tar
    keeps the samples before the damage and counts one `corrupt_tar` error."""
    fs, path = filesystem(with_protocol(part["protocol"], part["tar"]), storage_options)
    transient = transient_errors()
    for attempt in range(3):
        batch = empty_batch()
        try:
            stream_tar(fs, path, part, batch)
            return batch
        except tarfile.TarError as err:
            return with_damage_row(batch, part, path, err)
        except transient as err:
            if isinstance(err, FileNotFoundError) or attempt == 2:
                return with_damage_row(batch, part, path, err)
            time.sleep(0.5 * 2**attempt)
    raise AssertionError("unreachable")


def stream_tar(fs: Any, path: str, part: dict[str, Any], batch: Columns) -> None:
    seen: set[str] = set()
    with fs.open(path, "rb") as fileobj:
        for index, raw in enumerate(iter_tar_samples(fileobj, links=True)):
            sample = tar_sample(raw, part, index)
            if sample["__key__"] in seen:  # members of one key not adjacent, or repeated
                sample.update({DROP: "duplicate_key", DROP_STAGE: SOURCE})
            seen.add(sample["__key__"])
            append_sample(batch, sample)


def with_damage_row(batch: Columns, part: dict[str, Any], path: str, err: Exception) -> Columns:
    stem = sanitize_key(path.rpartition("/")[2])
    append_sample(
        batch,
        {
            "__key__": f"{stem}_damaged",
            "__part__": part["part"],
            "__index__": len(batch["__key__"]),
            "__source__": text_name(path),
            DROP: f"corrupt_tar:{type(err).__name__}",
            DROP_STAGE: SOURCE,
        },
    )
    return batch


CARRIED = (*IMAGE_COLUMNS, *VIDEO_COLUMNS, "cls")  # tar members copied as they are


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


PLANNERS = {
    "images": plan_images,
    "videos": plan_videos,
    "webdataset": plan_webdataset,
    "urls": plan_urls,
}
READERS = {
    "images": read_images,
    "videos": read_images,  # the same folder reader: bytes go to the column of their extension
    "video_list": read_video_list,
    "webdataset": read_webdataset,
    "urls": read_urls,
}


def plan_source(cfg: SourceConfig, storage_options: dict[str, Any]) -> list[dict[str, Any]]:
    return PLANNERS[cfg.kind](cfg, storage_options)


def read_partition(part: dict[str, Any], storage_options: dict[str, Any]) -> Columns:
    return READERS[part["kind"]](part, storage_options)


def iter_chunks(batch: Columns, size: int) -> Iterator[Columns]:
    """Split a batch into batches of at most `size` rows."""
    total = len(batch["__key__"])
    for start in range(0, total, size):
        yield {col: values[start : start + size] for col, values in batch.items()}

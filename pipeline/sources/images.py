"""The `images` source (and `videos` from a folder): a folder of media files, each with
optional sidecar `.txt` caption and `.json` metadata, planned on the driver from one listing and
read in byte-bounded groups of files (pipeline/sources/files.py)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

from mmcurate.core.config_io import ConfigError
from mmcurate.core.formats import meta_json
from mmcurate.core.storage import (
    filesystem,
    find_versions,
    protocol_of,
    with_protocol,
)
from mmcurate.core.tario import EXT_ALIASES, safe_key, text_name
from mmcurate.pipeline.config import SourceConfig
from mmcurate.pipeline.sources.files import fetch_files, file_groups, file_sizes
from mmcurate.pipeline.sources.records import FileEntry, FolderPartition, folder_partitions
from mmcurate.pipeline.sources.samples import (
    SOURCE,
    WHOLE,
    Reading,
    append_sample,
    decode_caption,
    empty_batch,
)
from mmcurate.pipeline.sources.videos import (
    disambiguate_keys,
)
from mmcurate.pipeline.sources.webdataset import member_meta
from mmcurate.stages.base import DROP, DROP_STAGE, Columns

IMAGE_EXTS = {"jpg", "jpeg", "png", "webp", "gif", "bmp", "tif", "tiff"}


SIDECARS = ("txt", "json")


def plan_images(
    cfg: SourceConfig, storage_options: dict[str, Any], exts: set[str] = IMAGE_EXTS
) -> list[FolderPartition]:
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
    files = [FileEntry(**entry) for entry in entries]
    where = (root, protocol_of(cfg.path))
    return folder_partitions(cfg.kind, where, files, versions, cfg.files_per_task, digest)


def listed_size(version: str) -> int | None:
    """The size in a listing's "size:tag" version (None where the listing had none), so a
    task can plan its reads in bytes without a request per file."""
    size = version.partition(":")[0]
    return int(size) if size.isdigit() else None


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value).encode()).hexdigest()


def sidecar_path(root: str, entry: FileEntry, ext: str) -> str:
    return f"{root}/{entry.rel.rpartition('.')[0]}.{ext}"


def image_chunks(
    part: FolderPartition, storage_options: dict[str, Any], reading: Reading
) -> Iterator[Columns]:
    """A folder partition in chunks: each a group of files bounded in count and bytes, read
    with one batched `cat` (files above `spill_bytes` by path or spilled, never whole)."""
    fs, _ = filesystem(with_protocol(part.protocol, part.root), storage_options)
    root, entries = part.root, part.entries
    sizes = [e.size for e in entries]
    if reading != WHOLE and None in sizes:  # planned by a listing without sizes
        sizes = file_sizes(fs, [f"{root}/{e.rel}" for e in entries])
    for group in file_groups(sizes, reading):
        chosen = [entries[i] for i in group]
        wanted = [f"{root}/{e.rel}" for e in chosen]
        wanted_sizes = [sizes[i] for i in group]
        for ext in SIDECARS:
            found = [sidecar_path(root, e, ext) for e in chosen if e.has(ext)]
            wanted, wanted_sizes = wanted + found, wanted_sizes + [None] * len(found)
        blobs = fetch_files(fs, wanted, wanted_sizes, reading)
        yield image_batch(part, root, group, blobs)


def image_batch(part: FolderPartition, root: str, group: range, blobs: dict) -> Columns:
    batch = empty_batch()
    for index in group:
        entry = part.entries[index]
        path = f"{root}/{entry.rel}"
        found = [
            blobs.get(sidecar_path(root, entry, ext)) if entry.has(ext) else None
            for ext in SIDECARS
        ]
        sample = image_sample(entry, blobs.get(path), *found)
        sample.update({"__part__": part.number, "__index__": index, "__source__": text_name(path)})
        append_sample(batch, sample)
    return batch


def image_sample(entry: FileEntry, data: Any, caption: Any, meta: Any = None) -> dict[str, Any]:
    """A folder's sample. A caption or metadata file that exists but cannot be read is a
    read_error (not a sample without them); metadata must be a JSON object (else bad_json)
    and `source`, the file's path, is added unless the metadata has its own."""
    ext = entry.rel.rpartition(".")[2].lower()
    source = text_name(entry.rel)
    sample: dict[str, Any] = {"__key__": entry.key, "json": json.dumps({"source": source})}
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

"""The `videos` source: a folder, a glob, or a list file (parquet/csv/tsv/jsonl) of videos.

- folder: every .mp4/.webm/.avi/.mkv/.mov under it, captions from sidecar `<name>.txt`
  (the same reader as `images`);
- glob (`s3://bucket/videos/*/*.mp4`): the matching video files, captions from sidecars;
- list file: one row per video, `path_column` (default `path`: absolute, a URL, or relative to
  the list's folder) and `caption_column`; keys are the row numbers (`000000042`), so a rerun
  gives the same keys.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from core.config_io import ConfigError
from core.pandas_probe import pandas_for_nanoseconds
from core.storage import GLOB_CHARS, cat_many, filesystem, protocol_of, store_version, with_protocol
from core.tario import safe_key
from pipeline.config import SourceConfig
from pipeline.samples import SOURCE, append_sample, decode_caption, empty_batch
from pipeline.source_csv import BAD_ROW
from pipeline.source_urls import FORMATS, file_format, read_table
from stages.base import DROP, DROP_STAGE, VIDEO_COLUMNS, Columns

VIDEO_EXTS = set(VIDEO_COLUMNS)


def is_list_file(path: str) -> bool:
    return any(path.removesuffix(".gz").endswith(suffix) for suffix in FORMATS)


def plan_video_glob(cfg: SourceConfig, storage_options: dict[str, Any]) -> list[dict[str, Any]]:
    """Matching video files under the glob's fixed prefix, as `images`-style partitions."""
    fs, pattern = filesystem(cfg.path, storage_options)
    prefix = pattern[: min(pattern.find(c) for c in GLOB_CHARS if c in pattern)]
    root = prefix.rpartition("/")[0]
    found = fs.glob(pattern, detail=True)
    files = sorted(p for p in found if p.rpartition(".")[2].lower() in VIDEO_EXTS)
    if not files:
        raise ConfigError(f"source.path: no video files match {cfg.path}")
    entries = []
    for path in files:
        rel = path[len(root) + 1 :] if root else path
        entries.append({"rel": rel, "key": safe_key(rel.rpartition(".")[0]), "txt": True})
    versions = [f"{found[p].get('size')}:{store_version(found[p])}" for p in files]
    disambiguate_keys(entries)
    size = cfg.files_per_task
    return [
        {
            "kind": "videos",
            "part": i,
            "root": root,
            "protocol": protocol_of(cfg.path),
            "entries": entries[start : start + size],
            "inputs": versions[start : start + size],  # a video changed in place: another build
        }
        for i, start in enumerate(range(0, len(entries), size))
    ]


def disambiguate_keys(entries: list[dict[str, Any]]) -> None:
    """`a.jpg` and `a.png` share a stem (and `a b` and `a_b` a readable form): every key
    of such a group becomes the key of its whole relative path, which is unique. Again until
    no key is shared: a file may already be named like such a key."""
    while True:
        seen = Counter(entry["key"] for entry in entries)
        clashing = [e for e in entries if seen[e["key"]] > 1 and e["key"] != safe_key(e["rel"])]
        if not clashing:
            return
        for entry in clashing:
            entry["key"] = safe_key(entry["rel"])


def plan_video_list(cfg: SourceConfig, storage_options: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows of the list file in partitions of `files_per_task`: (key, video URL, caption)."""
    fs, path = filesystem(cfg.path, storage_options)
    if not fs.isfile(path):
        raise ConfigError(f"source.path: file not found: {cfg.path}")
    table = read_table(fs, path, (cfg.path_column, cfg.caption_column))
    for column in (cfg.path_column, cfg.caption_column):
        if column not in table.column_names:
            raise ConfigError(f"source: column {column!r} not in {cfg.path}")
    folder = cfg.path.rpartition("/")[0]
    rows = []
    pandas_for_nanoseconds(table.schema)
    columns = zip(
        table[cfg.path_column].to_pylist(), table[cfg.caption_column].to_pylist(), strict=True
    )
    bad = table[BAD_ROW].to_pylist() if BAD_ROW in table.column_names else [None] * len(table)
    bad_reason = "bad_json_row" if file_format(path) == "jsonl" else "bad_csv_row"
    for index, (raw_path, raw_caption) in enumerate(columns):
        video, _ = decode_caption(raw_path) if isinstance(raw_path, bytes) else (raw_path, None)
        caption, reason = (
            decode_caption(raw_caption) if isinstance(raw_caption, bytes) else (raw_caption, None)
        )
        reason = bad_reason if bad[index] else reason
        url = video if not video or "://" in video or video.startswith("/") else f"{folder}/{video}"
        rows.append({"key": f"{index:09d}", "url": url, "caption": caption, "reason": reason})
    size = cfg.files_per_task
    return [
        {"kind": "video_list", "part": i, "rows": rows[start : start + size]}
        for i, start in enumerate(range(0, len(rows), size))
    ]


def read_video_list(part: dict[str, Any], storage_options: dict[str, Any]) -> Columns:
    """Fetch one partition's videos (one batched `cat` per filesystem)."""
    batch = empty_batch()
    by_protocol: dict[str, list[str]] = {}
    for row in part["rows"]:
        if row["url"]:
            by_protocol.setdefault(protocol_of(row["url"]), []).append(row["url"])
    blobs: dict[str, Any] = {}
    for protocol, urls in by_protocol.items():
        fs, _ = filesystem(with_protocol(protocol, "/"), storage_options)
        paths = [filesystem(url, storage_options)[1] for url in urls]
        fetched = cat_many(fs, paths)
        blobs.update({url: fetched.get(p) for url, p in zip(urls, paths, strict=True)})
    for index, row in enumerate(part["rows"]):
        append_sample(batch, video_row(row, blobs.get(row["url"]), part["part"], index))
    return batch


def video_row(row: dict[str, Any], data: Any, part: int, index: int) -> dict[str, Any]:
    sample: dict[str, Any] = {
        "__key__": row["key"],
        "__part__": part,
        "__index__": index,
        "__source__": row["url"],
        "txt": row["caption"],
        "json": json.dumps({"source": row["url"]}),
    }
    ext = (row["url"] or "").rpartition(".")[2].lower()
    if row.get("reason"):
        return sample | {DROP: row["reason"], DROP_STAGE: SOURCE}
    if not row["url"] or isinstance(data, Exception) or data is None:
        return sample | {DROP: "read_error", DROP_STAGE: SOURCE}
    return sample | {ext if ext in VIDEO_EXTS else "mp4": data}

"""The `videos` source: a folder, a glob, or a list file (parquet/csv/tsv/jsonl) of videos.

- folder: every .mp4/.webm/.avi/.mkv/.mov under it, captions from sidecar `<name>.txt`
  (the same reader as `images`); keys from file names, unique with clip_split's too
  (`disambiguate_keys`);
- glob (`s3://bucket/videos/*/*.mp4`): the matching video files, captions from sidecars;
- list file: one row per video, `path_column` (default `path`: absolute, a URL, or relative to
  the list's folder) and `caption_column`; keys are the row numbers (`000000042`), so a rerun
  gives the same keys.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

from mmcurate.core.config_io import ConfigError
from mmcurate.core.formats import VIDEO_COLUMNS
from mmcurate.core.pandas_probe import pandas_for_nanoseconds
from mmcurate.core.storage import GLOB_CHARS, filesystem, protocol_of, store_version, with_protocol
from mmcurate.core.tario import safe_key
from mmcurate.pipeline.config import SourceConfig
from mmcurate.pipeline.sources.csv_lists import BAD_ROW
from mmcurate.pipeline.sources.files import fetch_files, file_groups, file_sizes
from mmcurate.pipeline.sources.records import (
    FileEntry,
    FolderPartition,
    VideoListPartition,
    VideoRow,
    folder_partitions,
)
from mmcurate.pipeline.sources.samples import (
    SOURCE,
    WHOLE,
    Reading,
    append_sample,
    decode_caption,
    empty_batch,
    whole_batch,
)
from mmcurate.pipeline.sources.tables import FORMATS, file_format, read_table
from mmcurate.stages.base import DROP, DROP_STAGE, Columns

VIDEO_EXTS = set(VIDEO_COLUMNS)
# A key clip_split makes, `<key>_0000` (stages/clip_split.py; up to 5 digits: max_clips)
CLIP_KEY = re.compile(r"(.+)_[0-9]{4,5}")


def is_list_file(path: str) -> bool:
    return any(path.removesuffix(".gz").endswith(suffix) for suffix in FORMATS)


def plan_video_glob(cfg: SourceConfig, storage_options: dict[str, Any]) -> list[FolderPartition]:
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
    files = [FileEntry(e["rel"], e["key"], e["txt"], listed=False) for e in entries]
    where = (root, protocol_of(cfg.path))  # a video changed in place: another build
    return folder_partitions("videos", where, files, versions, cfg.files_per_task, tuple)


def disambiguate_keys(entries: list[dict[str, Any]]) -> None:
    """`a.jpg` and `a.png` share a stem (and `a b` and `a_b` a readable form): every key
    of such a group becomes the key of its whole relative path, which is unique. So does a
    key clip_split could also make from a video's key (`a_0001` beside `a.mp4`): a whole-path
    key ends in a hash, never in a clip number. Again until no key clashes: a file may already
    be named like such a key. Planning sees every file, so keys do not depend on partitions."""
    while True:
        seen = Counter(entry["key"] for entry in entries)
        videos = {e["key"] for e in entries if e["rel"].rpartition(".")[2].lower() in VIDEO_EXTS}
        clashing = [
            e
            for e in entries
            if (seen[e["key"]] > 1 or is_clip_key_of(e["key"], videos))
            and e["key"] != safe_key(e["rel"])
        ]
        if not clashing:
            return
        for entry in clashing:
            entry["key"] = safe_key(entry["rel"])


def is_clip_key_of(key: str, videos: set[str]) -> bool:
    """Whether clip_split (once or more) could make `key` from one of these video keys."""
    while found := CLIP_KEY.fullmatch(key):
        key = found.group(1)
        if key in videos:
            return True
    return False


def plan_video_list(cfg: SourceConfig, storage_options: dict[str, Any]) -> list[VideoListPartition]:
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
        rows.append(VideoRow(f"{index:09d}", url, caption, reason))
    size = cfg.files_per_task
    return [
        VideoListPartition(kind="video_list", number=i, rows=tuple(rows[start : start + size]))
        for i, start in enumerate(range(0, len(rows), size))
    ]


def read_video_list(part: VideoListPartition, storage_options: dict[str, Any]) -> Columns:
    """One partition's videos, as one batch."""
    return whole_batch(video_list_chunks(part, storage_options, WHOLE))


def video_list_chunks(
    part: VideoListPartition, storage_options: dict[str, Any], reading: Reading
) -> Iterator[Columns]:
    """A list partition in chunks of rows bounded in count and bytes; each chunk's videos
    fetched with one batched `cat` per filesystem (those above `spill_bytes` by path or
    spilled, never whole)."""
    rows = part.rows
    sizes: list[int | None] = [None] * len(rows)
    if reading != WHOLE:
        sizes = list_sizes(rows, storage_options)
    for group in file_groups(sizes, reading):
        chosen = [(rows[i], sizes[i]) for i in group]
        blobs = fetch_rows(chosen, storage_options, reading)
        batch = empty_batch()
        for index in group:
            row = rows[index]
            append_sample(batch, video_row(row, blobs.get(row.url), part.number, index))
        yield batch


def by_protocol(rows: Sequence[VideoRow]) -> dict[str, list[int]]:
    """Positions of the rows with a video, by the protocol of its URL."""
    found: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        if row.url:
            found.setdefault(protocol_of(row.url), []).append(i)
    return found


def list_sizes(rows: Sequence[VideoRow], storage_options: dict[str, Any]) -> list[int | None]:
    sizes: list[int | None] = [None] * len(rows)
    for protocol, places in by_protocol(rows).items():
        fs, _ = filesystem(with_protocol(protocol, "/"), storage_options)
        paths = [filesystem(rows[i].url, storage_options)[1] for i in places]
        for i, size in zip(places, file_sizes(fs, paths), strict=True):
            sizes[i] = size
    return sizes


def fetch_rows(
    chosen: list[tuple[VideoRow, int | None]],
    storage_options: dict[str, Any],
    reading: Reading,
) -> dict[str, Any]:
    """The videos of some rows by URL (bytes, Spilled, or the error that reading gave)."""
    rows = [row for row, _ in chosen]
    blobs: dict[str, Any] = {}
    for protocol, places in by_protocol(rows).items():
        fs, _ = filesystem(with_protocol(protocol, "/"), storage_options)
        urls = [rows[i].url for i in places]
        paths = [filesystem(url, storage_options)[1] for url in urls]
        fetched = fetch_files(fs, paths, [chosen[i][1] for i in places], reading)
        blobs.update({url: fetched.get(p) for url, p in zip(urls, paths, strict=True)})
    return blobs


def video_row(row: VideoRow, data: Any, part: int, index: int) -> dict[str, Any]:
    sample: dict[str, Any] = {
        "__key__": row.key,
        "__part__": part,
        "__index__": index,
        "__source__": row.url,
        "txt": row.caption,
        "json": json.dumps({"source": row.url}),
    }
    ext = (row.url or "").rpartition(".")[2].lower()
    if row.reason:
        return sample | {DROP: row.reason, DROP_STAGE: SOURCE}
    if not row.url or isinstance(data, Exception) or data is None:
        return sample | {DROP: "read_error", DROP_STAGE: SOURCE}
    return sample | {ext if ext in VIDEO_EXTS else "mp4": data}

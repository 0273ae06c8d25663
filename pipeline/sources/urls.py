"""The `urls` source: LAION-style URL lists (parquet, csv, tsv, jsonl; optionally gzipped).

Keys come from the row's position across the sorted input files (`000000042`), so a rerun of
the same list gives the same keys. Every column other than url and caption is carried into
`<key>.json`, as img2dataset's `save_additional_columns` does (or those `carry_columns` names);
the sample's own `key`, `url` and `caption` win there, a list column of such a name is kept as
`source_key` (img2dataset's output has one), `source_url`, `source_caption`. An empty list
file counts as 0 rows; lists with no row at all are a ConfigError.

A partition reads only its rows: planning (plan_file) decides how, per file; see
pipeline/sources/ranges.py (row groups, byte ranges) and pipeline/sources/staging.py (a parquet
copy under `_work/` for lists without random access: gzip, quoted newlines, huge row groups).
Planning streams each text list (list_shape, pipeline/sources/infer.py: memory bounded by a few
blocks) and finds the rows, columns and schema the whole-file read would (read_table,
pipeline/sources/tables.py).
"""

from __future__ import annotations

import gzip
import io
import logging
import shutil
import tempfile
import zlib
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from mmcurate.core.config_io import ConfigError, one_line
from mmcurate.core.formats import meta_json
from mmcurate.core.pandas_probe import pandas_for_nanoseconds
from mmcurate.core.storage import (
    filesystem,
    matching,
    protocol_of,
    store_version,
    with_protocol,
    with_retries,
)
from mmcurate.pipeline.config import SourceConfig
from mmcurate.pipeline.sources.csv_lists import BAD_ROW
from mmcurate.pipeline.sources.infer import ListShape, csv_names, csv_rows, csv_schema
from mmcurate.pipeline.sources.infer_json import json_shape
from mmcurate.pipeline.sources.ranges import (
    binary_where_not_utf8,
    group_starts,
    groups_for,
    pack_schema,
    read_byte_range,
    read_row_groups,
    scan_rows,
)
from mmcurate.pipeline.sources.records import Partition, UrlPartition
from mmcurate.pipeline.sources.samples import SOURCE, append_sample, decode_caption, empty_batch
from mmcurate.pipeline.sources.staging import stage_folder
from mmcurate.pipeline.sources.tables import file_format, is_empty, opener, read_table
from mmcurate.stages.base import DROP, DROP_STAGE

KEY_DIGITS = 9
OWN_FIELDS = ("key", "url", "caption")  # the sample's in <key>.json; a list's: `source_<name>`
STAGE_RATIO = 2  # parquet row groups above this many partitions: staged (reads ~ r+1 vs ~3)
# What backends report that changes with a file's content (s3fs, gcsfs, local, http, ...)
UNREADABLE = (pa.ArrowException, EOFError, gzip.BadGzipFile, zlib.error, UnicodeDecodeError)
log = logging.getLogger("mmcurate.sources")


def list_url_files(cfg: SourceConfig, storage_options: dict[str, Any]) -> tuple[Any, list[str]]:
    fs, pattern = filesystem(cfg.path, storage_options)
    paths = [p for p in matching(fs, pattern) if fs.isfile(p)]
    if not paths:
        raise ConfigError(f"source.path: no URL list matches {cfg.path}")
    return fs, paths


def needed_columns(names: list[str], path: str, cfg: SourceConfig) -> list[str] | None:
    """The columns partitions read (file order): None for all; checks the configured ones."""
    if names == [BAD_ROW]:
        raise ConfigError(
            f"source.path: {path}: not a readable jsonl list (no line is a JSON object)"
        )
    names_shown = [name for name in names if name != BAD_ROW]
    for option, column in (("url_column", cfg.url_column), ("caption_column", cfg.caption_column)):
        if column not in names:
            raise ConfigError(
                f"source.{option}: no column {column!r} in {path} "
                f"(columns: {', '.join(names_shown)})"
            )
    if cfg.carry_columns is None:
        return None
    missing = [c for c in cfg.carry_columns if c not in names]
    if missing:
        raise ConfigError(f"source.carry_columns: no column {missing[0]!r} in {path}")
    keep = {cfg.url_column, cfg.caption_column, *cfg.carry_columns, BAD_ROW}
    return [name for name in names if name in keep]


def file_version(fs: Any, path: str) -> dict[str, Any]:
    """The file's size and its ETag, else modification time (whatever the backend reports, as
    a string): in every plan entry, so a changed list changes the build identity, and in the
    staged copy's folder name, so a stale copy is never reused."""
    info = fs.info(path)
    return {"file_size": int(info["size"]), "file_version": store_version(info)}


def plan_file(fs: Any, path: str, cfg: SourceConfig) -> tuple[int, Callable[[int, int], dict]]:
    """(rows, how partition (start, count) of this file is read): its row groups (parquet),
    its byte range (plain text, rows one line each), else a staged copy (pipeline/source_staging)
    and, until it exists, the whole file. An unreadable list: a ConfigError naming it."""
    fmt = file_format(path)
    try:
        version = file_version(fs, path)
        if fmt == "parquet" and not path.endswith(".gz"):
            rows, how = plan_parquet(fs, path, cfg, version)
        else:
            rows, how = plan_text(fs, path, cfg, version)
    except UNREADABLE as err:
        reason = one_line(err)
        reason = reason if len(reason) <= 120 else reason[:117] + "..."
        raise ConfigError(f"source.path: {path}: not a readable {fmt} list ({reason})") from None
    return rows, lambda start, count: version | how(start, count)


def check_some_row_fits(shape: ListShape, path: str, fmt: str) -> None:
    """A csv/tsv list whose every row has the wrong field count is not a list of that shape
    (another delimiter?): a ConfigError, as a jsonl list with no object is."""
    if fmt != "jsonl" and shape.rows and shape.bad_rows == shape.rows:
        fields = len(shape.names) - 1
        why = f"no row has the header's {fields} fields"
        raise ConfigError(f"source.path: {path}: not a readable {fmt} list ({why})")


def list_shape(fs: Any, path: str) -> ListShape:
    """Rows and column names as a whole-file read (read_table) finds them, streamed
    (pipeline/sources/infer.py); jsonl: its schema too. An empty file: no rows, no columns."""
    fmt = file_format(path)
    open_ = opener(fs, path)
    if fmt == "jsonl":
        return json_shape(open_)
    if fmt == "parquet":  # gzipped: its footer is at the end of the unpacked bytes
        return gzipped_parquet_shape(open_)
    try:
        names = csv_names(open_, fmt)
    except pa.ArrowInvalid:
        if not is_empty(open_):
            raise
        return ListShape(0, [])
    return csv_rows(open_, fmt, names)


def gzipped_parquet_shape(open_: Callable[[], Any]) -> ListShape:
    """Rows and columns of a gzipped parquet file, unpacked to a local temporary file."""
    with tempfile.TemporaryFile() as copy:
        with open_() as src:
            shutil.copyfileobj(src, copy, 1 << 20)
        copy.seek(0)
        meta = pq.ParquetFile(copy)
        return ListShape(meta.metadata.num_rows, meta.schema_arrow.names)


def plan_text(
    fs: Any, path: str, cfg: SourceConfig, version: dict[str, Any]
) -> tuple[int, Callable[[int, int], dict]]:
    """csv / tsv / jsonl, gzipped or not: byte ranges where rows are one line each, else staged."""
    fmt, every = file_format(path), cfg.files_per_task
    shape = list_shape(fs, path)
    if not shape.rows and not shape.names:  # an empty file: 0 rows, no partition
        return 0, lambda start, count: {}
    columns = needed_columns(shape.names, path, cfg)
    check_some_row_fits(shape, path, fmt)
    common = {"format": fmt, "columns": columns}
    folder = stage_folder(path, every, columns, version)
    staged = {**common, "read": "whole", "stage": folder, "stage_rows": every}
    if path.endswith(".gz"):
        return shape.rows, lambda start, count: staged | {"stage_index": start // every}
    scan = scan_rows(fs, path, every, header=fmt != "jsonl", json=fmt == "jsonl")
    if scan.lone_cr or scan.data_rows != shape.rows or not scan.one_per_line:
        why = "rows not one per line (quoted newlines? objects sharing a line?)"
        log.warning("source: %s: %s: staged as parquet", path, why)
        return shape.rows, lambda start, count: staged | {"stage_index": start // every}
    size = version["file_size"]
    ends = [*scan.starts[1:], size]
    header = scan.data_start if fmt != "jsonl" else 0
    schema = shape.schema or text_schema(fs, path, cfg, shape, header or 0)
    common |= {"read": "bytes", "schema": pack_schema(schema), "header": header}

    def byte_range(start: int, count: int) -> dict:
        index = start // every
        return common | {"range": [scan.starts[index], ends[index]]}

    return shape.rows, byte_range


def text_schema(fs: Any, path: str, cfg: SourceConfig, shape: ListShape, header: int) -> pa.Schema:
    """A plain csv/tsv list's schema as read_table reads it: url and caption as bytes."""
    fmt = file_format(path)
    explicit = {c: pa.binary() for c in (cfg.url_column, cfg.caption_column) if c in shape.names}
    return csv_schema(lambda: fs.open(path, "rb"), fmt, header, shape, explicit)


def plan_parquet(
    fs: Any, path: str, cfg: SourceConfig, version: dict[str, Any]
) -> tuple[int, Callable[[int, int], dict]]:
    every = cfg.files_per_task
    with fs.open(path, "rb") as src:
        meta = pq.ParquetFile(src)
        names, info = meta.schema_arrow.names, meta.metadata
    columns = needed_columns(names, path, cfg)
    starts = group_starts(info)
    largest = max((b - a for a, b in zip(starts, starts[1:], strict=False)), default=0)
    common = {"format": "parquet", "columns": columns, "read": "row_groups"}
    common["footer"] = info.serialized_size + 8  # the footer and its length and magic
    common["size"] = version["file_size"]
    if largest > STAGE_RATIO * every:  # a partition would read far more than its rows
        common |= {"stage": stage_folder(path, every, columns, version), "stage_rows": every}

    def row_groups(start: int, count: int) -> dict:
        groups, skip = groups_for(starts, start, count)
        extra = {"stage_index": start // every} if "stage" in common else {}
        return common | {"groups": groups, "skip": skip} | extra

    return info.num_rows, row_groups


def plan_urls(cfg: SourceConfig, storage_options: dict[str, Any]) -> list[UrlPartition]:
    """Partitions of `files_per_task` rows: (file, first row in file, rows, first global row),
    and how to read just those rows (plan_file)."""
    fs, paths = list_url_files(cfg, storage_options)
    protocol = protocol_of(cfg.path)
    parts: list[UrlPartition] = []
    first_global = 0
    for path in paths:
        rows, how = plan_file(fs, path, cfg)
        for start in range(0, rows, cfg.files_per_task):
            count = min(cfg.files_per_task, rows - start)
            parts.append(  # the plan entry as a dict: `how` gives the keys of its kind of read
                url_partition(
                    {
                        "kind": "urls",
                        "part": len(parts),
                        "file": path,
                        "start": start,
                        "count": count,
                        "first_key": first_global + start,
                        "protocol": protocol,
                        "url_column": cfg.url_column,
                        "caption_column": cfg.caption_column,
                        **how(start, count),
                    }
                )
            )
        first_global += rows
    if not parts:  # one empty list (a header, or 0 bytes) is 0 rows; all of them: an error
        lists = "the URL list has" if len(paths) == 1 else f"the {len(paths)} URL lists it matches"
        raise ConfigError(f"source.path: {cfg.path}: {lists} no rows")
    return parts


def url_partition(entry: dict[str, Any]) -> UrlPartition:
    """The record of a plan entry (the dict that its `to_dict` gives back)."""
    record = Partition.from_dict(entry)
    assert isinstance(record, UrlPartition)
    return record


def part_table(part: UrlPartition, storage_options: dict[str, Any]) -> pa.Table:
    """Just this partition's rows (and used columns)."""
    if part.staged_url:
        fs, path = filesystem(part.staged_url, storage_options)
        return pq.ParquetFile(io.BytesIO(with_retries(lambda: fs.cat_file(path)))).read()
    fs, path = filesystem(with_protocol(part.protocol, part.file), storage_options)
    columns = None if part.columns is None else list(part.columns)
    if part.read == "row_groups":
        groups, size, footer = list(part.groups or ()), part.size or 0, part.footer or 0
        table = with_retries(lambda: read_row_groups(fs, path, groups, columns, size, footer))
        return table.slice(part.skip, part.count)
    if part.read == "bytes":
        return with_retries(lambda: read_byte_range(fs, path, part))
    # "whole" (or a hand-made partition with no plan of its read)
    table = read_table(fs, path, (part.url_column, part.caption_column))
    table = table.slice(part.start, part.count)
    return table if columns is None else table.select(columns)


def read_urls(part: UrlPartition, storage_options: dict[str, Any]) -> dict[str, list]:
    """One partition's rows as samples: key, url, caption and the other columns as JSON."""
    table = part_table(part, storage_options)
    if table.num_rows != part.count:
        raise RuntimeError(
            f"{part.file}: partition {part.number} read {table.num_rows} rows, "
            f"planned {part.count} (the file changed since planning?)"
        )
    path = filesystem(with_protocol(part.protocol, part.file), storage_options)[1]
    batch = empty_batch()
    table = binary_where_not_utf8(table)
    pandas_for_nanoseconds(table.schema)
    for index, row in enumerate(table.to_pylist()):
        sample = url_sample(row, part, part.first_key + index)
        sample.update({"__part__": part.number, "__index__": index, "__source__": path})
        append_sample(batch, sample)
    return batch


def as_text(value: Any) -> tuple[str | None, str | None]:
    """(text, drop reason) for a url/caption cell of any type."""
    if value is None or isinstance(value, str):
        return value, None
    if isinstance(value, bytes):
        return decode_caption(value)
    return str(value), None


def readable(value: Any) -> Any:
    """A carried cell as JSON can hold it: bytes as text, undecodable bytes replaced (U+FFFD)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def bad_row_reason(part: UrlPartition) -> str:
    return "bad_json_row" if (part.format or "jsonl") == "jsonl" else "bad_csv_row"


def url_sample(row: dict[str, Any], part: UrlPartition, position: int) -> dict[str, Any]:
    key = f"{position:0{KEY_DIGITS}d}"
    bad_line = row.pop(BAD_ROW, None)
    url, url_problem = as_text(row.pop(part.url_column, None))
    caption, caption_problem = as_text(row.pop(part.caption_column, None))
    for name in OWN_FIELDS:  # the list's own `key` (img2dataset's), `url`, `caption` columns
        if name in row:
            row.setdefault(f"source_{name}", row.pop(name))
    row = {name: readable(value) for name, value in row.items()}
    meta = {**row, "key": key, "url": url, "caption": caption}
    sample = {
        "__key__": key,
        "url": url,
        "txt": caption,
        "json": meta_json(meta, default=str, ensure_ascii=False, sort_keys=True),
    }
    problem = (
        bad_row_reason(part) if bad_line else "url_not_utf8" if url_problem else caption_problem
    )
    if url is None and not problem:
        problem = "missing_url"
    if problem:
        sample.update({DROP: problem, DROP_STAGE: SOURCE})
    return sample

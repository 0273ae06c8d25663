"""The `urls` source: LAION-style URL lists (parquet, csv, tsv, jsonl; optionally gzipped).

Keys come from the row's position across the sorted input files (`000000042`), so a rerun of
the same list gives the same keys. Every column other than url and caption is carried into
`<key>.json`, as img2dataset's `save_additional_columns` does.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from core.config_io import ConfigError
from core.storage import filesystem, protocol_of, with_protocol
from pipeline.config import SourceConfig
from pipeline.samples import SOURCE, append_sample, decode_caption, empty_batch
from stages.base import DROP, DROP_STAGE

FORMATS = {".parquet": "parquet", ".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl"}
KEY_DIGITS = 9


def file_format(path: str) -> str:
    name = path.removesuffix(".gz")
    for suffix, fmt in FORMATS.items():
        if name.endswith(suffix):
            return fmt
    raise ConfigError(f"source.path: {path}: not a parquet, csv, tsv or jsonl file")


def read_table(fs: Any, path: str, text_columns: tuple[str, ...] = ()) -> pa.Table:
    """The whole table; url/caption columns of text formats read as bytes (UTF-8 checked later)."""
    fmt = file_format(path)
    compression = "gzip" if path.endswith(".gz") else None
    with fs.open(path, "rb", compression=compression) as src:
        if fmt == "parquet":
            return pq.read_table(src)
        if fmt == "jsonl":
            return pajson.read_json(src)
        names = pacsv.open_csv(src, parse_options=csv_parse(fmt)).schema.names  # first block
    columns = {c: pa.binary() for c in text_columns if c in names}
    with fs.open(path, "rb", compression=compression) as src:
        return pacsv.read_csv(
            src,
            parse_options=csv_parse(fmt),
            convert_options=pacsv.ConvertOptions(column_types=columns),
        )


def csv_parse(fmt: str) -> pacsv.ParseOptions:
    return pacsv.ParseOptions(delimiter="\t" if fmt == "tsv" else ",", newlines_in_values=True)


def list_url_files(cfg: SourceConfig, storage_options: dict[str, Any]) -> tuple[Any, list[str]]:
    fs, pattern = filesystem(cfg.path, storage_options)
    paths = sorted(fs.glob(pattern)) if any(c in pattern for c in "*?[") else [pattern]
    paths = [p for p in paths if fs.isfile(p)]
    if not paths:
        raise ConfigError(f"source.path: no URL list matches {cfg.path}")
    return fs, paths


def count_rows(fs: Any, path: str, cfg: SourceConfig) -> int:
    """Rows in one file; checks that the configured columns exist."""
    if file_format(path) == "parquet" and not path.endswith(".gz"):
        with fs.open(path, "rb") as src:
            meta = pq.ParquetFile(src)
            names, rows = meta.schema_arrow.names, meta.metadata.num_rows
    else:
        table = read_table(fs, path, (cfg.url_column, cfg.caption_column))
        names, rows = table.column_names, table.num_rows
    for option, column in (("url_column", cfg.url_column), ("caption_column", cfg.caption_column)):
        if column not in names:
            raise ConfigError(
                f"source.{option}: no column {column!r} in {path} (columns: {', '.join(names)})"
            )
    return rows


def plan_urls(cfg: SourceConfig, storage_options: dict[str, Any]) -> list[dict[str, Any]]:
    """Partitions of `files_per_task` rows: (file, first row in file, rows, first global row)."""
    fs, paths = list_url_files(cfg, storage_options)
    protocol = protocol_of(cfg.path)
    parts: list[dict[str, Any]] = []
    first_global = 0
    for path in paths:
        rows = count_rows(fs, path, cfg)
        for start in range(0, rows, cfg.files_per_task):
            count = min(cfg.files_per_task, rows - start)
            parts.append(
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
                }
            )
        first_global += rows
    return parts


def read_urls(part: dict[str, Any], storage_options: dict[str, Any]) -> dict[str, list]:
    """One partition's rows as samples: key, url, caption and the other columns as JSON."""
    fs, path = filesystem(with_protocol(part["protocol"], part["file"]), storage_options)
    columns = (part["url_column"], part["caption_column"])
    rows = read_table(fs, path, columns).slice(part["start"], part["count"]).to_pylist()
    batch = empty_batch()
    for index, row in enumerate(rows):
        sample = url_sample(row, part, part["first_key"] + index)
        sample.update({"__part__": part["part"], "__index__": index, "__source__": path})
        append_sample(batch, sample)
    return batch


def as_text(value: Any) -> tuple[str | None, str | None]:
    """(text, drop reason) for a url/caption cell of any type."""
    if value is None or isinstance(value, str):
        return value, None
    if isinstance(value, bytes):
        return decode_caption(value)
    return str(value), None


def url_sample(row: dict[str, Any], part: dict[str, Any], position: int) -> dict[str, Any]:
    key = f"{position:0{KEY_DIGITS}d}"
    url, url_problem = as_text(row.pop(part["url_column"], None))
    caption, caption_problem = as_text(row.pop(part["caption_column"], None))
    meta = {"key": key, "url": url, "caption": caption, **row}
    sample = {
        "__key__": key,
        "url": url,
        "txt": caption,
        "json": json.dumps(meta, default=str, ensure_ascii=False, sort_keys=True),
    }
    problem = "url_not_utf8" if url_problem else caption_problem
    if url is None and not problem:
        problem = "missing_url"
    if problem:
        sample.update({DROP: problem, DROP_STAGE: SOURCE})
    return sample

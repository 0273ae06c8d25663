"""A URL or video list file read whole: its format from its name, and its table as pyarrow
reads it (url/caption columns of csv/tsv as bytes, UTF-8 checked later).

The one parse of a list: the `urls` source reads a partition's file with it when nothing
smaller can be read (pipeline/sources/urls.py), staging copies a list through it
(pipeline/sources/staging.py), and the `videos` source reads a list of paths with it
(pipeline/sources/videos.py). Below all three, so none of them imports another for it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from mmcurate.core.config_io import ConfigError
from mmcurate.pipeline.sources.csv_lists import parse_options, read_csv_rows
from mmcurate.pipeline.sources.ranges import json_table, widened

FORMATS = {".parquet": "parquet", ".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl"}


def file_format(path: str) -> str:
    name = path.removesuffix(".gz")
    for suffix, fmt in FORMATS.items():
        if name.endswith(suffix):
            return fmt
    raise ConfigError(f"source.path: {path}: not a parquet, csv, tsv or jsonl file")


def opener(fs: Any, path: str) -> Callable[[], Any]:
    """A function opening `path` for reading, unpacked when it ends in .gz (a list may be
    opened more than once: streamed readers start over)."""
    compression = "gzip" if path.endswith(".gz") else None
    return lambda: fs.open(path, "rb", compression=compression)


def read_table(fs: Any, path: str, text_columns: tuple[str, ...] = ()) -> pa.Table:
    """The whole table; url/caption columns of csv/tsv read as bytes (UTF-8 checked later),
    jsonl as json_table reads it. An empty csv/tsv/jsonl file: no columns, no rows."""
    fmt = file_format(path)
    open_ = opener(fs, path)
    if fmt == "jsonl":
        return json_table(open_)
    with open_() as src:
        if fmt == "parquet":  # ParquetFile: read_table imports pyarrow.dataset (~35 ms)
            return pq.ParquetFile(src).read()
        try:
            names = pacsv.open_csv(src, parse_options=parse_options(fmt, skip)).schema.names
        except pa.ArrowInvalid:
            if not is_empty(open_):
                raise
            return pa.table({})
    columns = {c: pa.binary() for c in text_columns if c in names}
    table = read_csv(open_, fmt, columns)
    exact = {name: pa.string() for name in widened(table)}  # 20-digit ids: as written
    return read_csv(open_, fmt, columns | exact) if exact else table


def read_csv(open_: Callable[[], Any], fmt: str, types: dict[str, pa.DataType]) -> pa.Table:
    return read_csv_rows(open_, fmt, pacsv.ConvertOptions(column_types=types))


def skip(row: Any) -> str:
    return "skip"  # the header's names are all planning needs here


def is_empty(open_: Callable[[], Any]) -> bool:
    with open_() as src:
        return not src.read(1)

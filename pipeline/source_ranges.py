"""Reading one partition of a URL list without reading the whole file (pipeline/source_urls.py).

- parquet: only the row groups that hold the partition's rows, only the columns it uses: the
  footer, then exactly those column chunks.
- plain csv / tsv / jsonl: the planning pass finds the byte offset where every partition's first
  row starts (rows are non-blank lines); a partition reads the header and its own byte range and
  parses them with the column types the whole-file read inferred, so every value converts as it
  did when each task read the whole file. A file whose rows are not one line each (quoted
  newlines) is planned for staging instead (pipeline/source_staging.py).
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

BLOCK = 8 << 20  # bytes per read of the planning scan
NEWLINE, CR = 10, 13


# ---- parquet: row groups ---------------------------------------------------------------------


def group_starts(meta: pq.FileMetaData) -> list[int]:
    """First row of every row group, plus the row count at the end."""
    starts = [0]
    for index in range(meta.num_row_groups):
        starts.append(starts[-1] + meta.row_group(index).num_rows)
    return starts


def groups_for(starts: list[int], first: int, count: int) -> tuple[list[int], int]:
    """(row groups holding rows [first, first+count), rows to skip in the first of them)."""
    groups = [
        g
        for g in range(len(starts) - 1)
        if starts[g] < first + count and starts[g + 1] > first and starts[g + 1] > starts[g]
    ]
    return groups, first - starts[groups[0]]


def read_row_groups(
    fs: Any, path: str, groups: list[int], columns: list[str] | None, size: int, footer: int
) -> pa.Table:
    """These row groups (and columns) of a parquet file of `size` bytes whose footer (with its
    length and magic) is `footer` bytes: one read of the footer, then pyarrow reads just the
    column chunks it needs (coalesced: usually one request) through an uncached file."""
    meta = pq.read_metadata(io.BytesIO(fs.cat_file(path, start=size - footer, end=size)))
    with fs.open(path, "rb", cache_type="none") as src:
        reader = pq.ParquetFile(src, metadata=meta, pre_buffer=True)
        return reader.read_row_groups(groups, columns=columns)


# ---- plain text: byte ranges at row starts ---------------------------------------------------


@dataclass
class LineScan:
    """Where rows start in a text file: rows are non-blank lines (`\\n` or `\\r\\n` ended)."""

    every: int  # record the start of every `every`-th data row
    header: bool  # the first row is a csv header
    rows: int = 0  # rows seen, header included
    starts: list[int] = field(default_factory=list)  # data rows 0, every, 2*every, ...
    data_start: int | None = None  # where the first data row starts
    line_start: int = 0  # where the line in progress starts
    previous: int = -1  # the byte before the current block
    carriage_returns: int = 0  # `\\r` and `\\r\\n` seen: unequal means a lone `\\r` line end
    crlf: int = 0

    @property
    def data_rows(self) -> int:
        return max(0, self.rows - (1 if self.header else 0))

    @property
    def lone_cr(self) -> bool:
        return self.carriage_returns != self.crlf

    def feed(self, block: bytes, offset: int) -> None:
        """The next block of the file, which starts at byte `offset`."""
        if not block:
            return
        self.carriage_returns += block.count(b"\r")
        self.crlf += block.count(b"\r\n") + (self.previous == CR and block[0] == NEWLINE)
        data = np.frombuffer(block, np.uint8)
        ends = np.flatnonzero(data == NEWLINE) + offset
        starts = np.concatenate(([self.line_start], ends[:-1] + 1)).astype(np.int64)
        inside = ends - 1 >= offset
        before = np.where(inside, data[np.clip(ends - 1 - offset, 0, None)], self.previous)
        lengths = ends - starts[: ends.size]
        blank = (lengths == 0) | ((lengths == 1) & (before == CR))
        self.take(starts[: ends.size][~blank])
        if ends.size:
            self.line_start = int(ends[-1]) + 1
        self.previous = int(data[-1])

    def take(self, row_starts: np.ndarray) -> None:
        """Count rows starting at these offsets; note every `every`-th data row's start."""
        index = np.arange(self.rows, self.rows + row_starts.size) - (1 if self.header else 0)
        data = index >= 0
        if self.data_start is None and data.any():
            self.data_start = int(row_starts[data][0])
        self.starts.extend(int(s) for s in row_starts[data & (index % self.every == 0)])
        self.rows += int(row_starts.size)

    def finish(self, size: int) -> None:
        """The last line, when the file does not end in a newline."""
        length = size - self.line_start
        if length > 1 or (length == 1 and self.previous != CR):
            self.take(np.array([self.line_start], np.int64))


def scan_rows(fs: Any, path: str, every: int, header: bool) -> LineScan:
    """One pass over a plain text file: row count and every `every`-th row's start."""
    scan = LineScan(every, header)
    offset = 0
    with fs.open(path, "rb") as src:
        while block := src.read(BLOCK):
            scan.feed(block, offset)
            offset += len(block)
    scan.finish(offset)
    return scan


def pack_schema(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def unpack_schema(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def read_byte_range(fs: Any, path: str, part: dict[str, Any]) -> pa.Table:
    """A plain text partition: its header and byte range, parsed with the whole file's types."""
    schema = unpack_schema(part["schema"])
    start, end = part["range"]
    body = fs.cat_file(path, start=start, end=end)
    columns = part["columns"] or schema.names
    if part["format"] == "jsonl":
        options = pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
        return pajson.read_json(io.BytesIO(body), parse_options=options).select(columns)
    header = fs.cat_file(path, start=0, end=part["header"]) if part["header"] else b""
    return pacsv.read_csv(
        io.BytesIO(header + body),
        parse_options=pacsv.ParseOptions(
            delimiter="\t" if part["format"] == "tsv" else ",", newlines_in_values=True
        ),
        convert_options=pacsv.ConvertOptions(
            column_types=dict(zip(schema.names, schema.types, strict=True)),
            include_columns=columns,
        ),
    )

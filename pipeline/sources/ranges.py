"""Reading one partition of a URL list without reading the whole file (pipeline/sources/urls.py).

- parquet: only the row groups that hold the partition's rows, only the columns it uses: the
  footer, then exactly those column chunks.
- plain csv / tsv / jsonl: the planning pass finds the byte offset where every partition's first
  row starts (rows are non-blank lines; for jsonl, whitespace-only lines are blank and every
  line must be one `{...}`); a partition reads the header and its own byte range and
  parses them with the column types the whole-file read inferred, so every value converts as it
  did when each task read the whole file. A file whose rows are not one line each (quoted
  newlines) is planned for staging instead (pipeline/sources/staging.py).
- jsonl (json_table): pyarrow's reader, which wants one JSON type per column; where a value
  breaks that (`"caption": 2019` among strings, `"year": "unknown"` after numbers), Python's
  json reads the text instead and such a column becomes text: strings as they are, other
  values as their JSON text. A partition parses only the columns it uses. Text that is not
  UTF-8 (bytes, or an escaped lone surrogate such as `"\ud800"`) makes its column binary, so the
  rows holding it can be dropped one by one (`caption_not_utf8`) instead of failing the file.
  A line that is not a JSON object is a row of its own, marked in the BAD_ROW column (a csv
  row with the wrong number of fields too: pipeline/sources/csv_lists.py).
"""

from __future__ import annotations

import base64
import io
import json as pyjson
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq
from mmcurate.pipeline.sources.csv_lists import BAD_ROW, read_csv_rows, with_bad_row_column
from mmcurate.pipeline.sources.records import UrlPartition

BLOCK = 256 << 10  # bytes per read of the planning scan (its numpy arrays: ~30x that)
NEWLINE, CR = 10, 13
OPEN, CLOSE = ord("{"), ord("}")
SPACE = np.array([32, 9, CR], np.uint8)  # JSON whitespace within a line
JSON_SPACE = re.compile(r"[ \t\r\n]*")
TEXT_TYPES = (pa.string(), pa.large_string())
BINARY_TYPES = (pa.binary(), pa.large_binary())
log = logging.getLogger("mmcurate.sources")


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
    """Where rows start in a text file: rows are non-blank lines (`\\n` or `\\r\\n` ended).
    jsonl: whitespace-only lines are blank too (pyarrow's json reader skips them), and
    `one_per_line` says whether every non-blank line starts with `{` and ends with `}`
    (then a line holds whole objects only, and equal line and object counts mean one each)."""

    every: int  # record the start of every `every`-th data row
    header: bool  # the first row is a csv header
    json: bool = False  # jsonl: whitespace-only lines are blank; line shapes checked
    rows: int = 0  # rows seen, header included
    starts: list[int] = field(default_factory=list)  # data rows 0, every, 2*every, ...
    data_start: int | None = None  # where the first data row starts
    line_start: int = 0  # where the line in progress starts
    previous: int = -1  # the byte before the current block
    carriage_returns: int = 0  # `\\r` and `\\r\\n` seen: unequal means a lone `\\r` line end
    crlf: int = 0
    line_content: bool = False  # jsonl: the line in progress has a non-whitespace byte
    last_token: int = -1  # jsonl: the last non-whitespace byte before this block
    broken: bool = True  # jsonl: a line ended since then (or the file starts)
    one_per_line: bool = True  # jsonl: every line so far is `{ ... }`

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
        if self.json:
            blank = self.json_blank(data, starts[: ends.size] - offset, ends - offset)
            self.json_shape(data)
        self.take(starts[: ends.size][~blank])
        if ends.size:
            self.line_start = int(ends[-1]) + 1
        self.previous = int(data[-1])

    def json_blank(self, data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """jsonl: which lines ending in this block (local offsets) hold only whitespace."""
        content = ~np.isin(data, SPACE) & (data != NEWLINE)
        seen = np.concatenate(([0], np.cumsum(content)))
        has = seen[ends] - seen[np.clip(starts, 0, None)] > 0
        if has.size:
            has[0] |= self.line_content
            self.line_content = bool(seen[-1] - seen[ends[-1] + 1] > 0)
        else:
            self.line_content |= bool(seen[-1] > 0)
        return ~has

    def json_shape(self, data: np.ndarray) -> None:
        """jsonl: check that each line's first non-whitespace byte is `{`, its last `}`."""
        seq = data[~np.isin(data, SPACE)]
        newlines = np.cumsum(seq == NEWLINE)
        where = np.flatnonzero(seq != NEWLINE)
        if not where.size:
            self.broken |= bool(seq.size)
            return
        tokens, counts = seq[where], newlines[where]
        breaks = np.diff(np.concatenate(([0], counts))) > 0
        breaks[0] |= self.broken
        previous = np.concatenate(([self.last_token], tokens[:-1]))
        bad = breaks & ((tokens != OPEN) | ((previous != CLOSE) & (previous >= 0)))
        self.one_per_line &= not bool(bad.any())
        self.last_token = int(tokens[-1])
        self.broken = bool(counts[-1] < newlines[-1])

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
        last = (
            self.line_content if self.json else length > 1 or (length == 1 and self.previous != CR)
        )
        if length > 0 and last:
            self.take(np.array([self.line_start], np.int64))
        if self.json and self.last_token not in (-1, CLOSE):
            self.one_per_line = False


def scan_rows(fs: Any, path: str, every: int, header: bool, json: bool = False) -> LineScan:
    """One pass over a plain text file: row count and every `every`-th row's start."""
    scan = LineScan(every, header, json)
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


def read_byte_range(fs: Any, path: str, part: UrlPartition) -> pa.Table:
    """A plain text partition: its header and byte range, parsed with the whole file's types."""
    assert part.schema is not None and part.byte_range is not None, "a planned byte range"
    schema = unpack_schema(part.schema)
    start, end = part.byte_range
    body = fs.cat_file(path, start=start, end=end)
    columns = list(part.columns or schema.names)
    if part.format == "jsonl":  # only the used columns: the others are never converted
        used = pa.schema([schema.field(name) for name in columns])
        return json_table(lambda: io.BytesIO(body), used).select(columns)
    header = fs.cat_file(path, start=0, end=part.header) if part.header else b""
    convert = pacsv.ConvertOptions(
        column_types=dict(zip(schema.names, schema.types, strict=True)),
        include_columns=[name for name in columns if name != BAD_ROW],
    )
    table = read_csv_rows(lambda: io.BytesIO(header + body), part.format or "csv", convert)
    return with_bad_row_column(table, columns)


# ---- jsonl: one type per column ---------------------------------------------------------------


def json_table(open_: Callable[[], Any], schema: pa.Schema | None = None) -> pa.Table:
    """A jsonl text (`open_()` opens it) as a table. pyarrow's reader infers the columns (or,
    given `schema`, reads just those, with those types); where it cannot (a column whose JSON
    type changes, a number in a text column, an empty file), Python's json reads the text
    (json_rows) and columns are built as json_column does."""
    options = pajson.ParseOptions(
        explicit_schema=schema, unexpected_field_behavior="ignore" if schema else "infer"
    )
    try:
        with open_() as src:
            table = pajson.read_json(src, parse_options=options)
        if not widened(table):
            return table
    except pa.ArrowInvalid:
        pass
    with open_() as src:
        data = src.read()
    return rows_table(list(json_rows(data)), schema)


def widened(table: pa.Table) -> list[str]:
    """Float columns holding a value of 2**63 or more: where pyarrow's json and csv readers put
    integers that do not fit int64, and every integer of the column with them, as doubles
    (two distinct 20-digit ids became one number). Such columns are read again exactly."""
    names = []
    for name, column in zip(table.column_names, table.columns, strict=True):
        if pa.types.is_floating(column.type) and column.null_count < len(column):
            largest = pc.max(pc.abs(column)).as_py()
            if largest is not None and largest >= 2.0**63:
                names.append(name)
    return names


def rows_table(rows: list[dict[str, Any]], schema: pa.Schema | None) -> pa.Table:
    """Parsed jsonl rows as a table: the planned columns and types (a partition), else every
    column, typed as json_column infers."""
    if schema is not None:  # a text column may come back binary (text that is not UTF-8)
        columns = [json_column([r.get(f.name) for r in rows], f.type) for f in schema]
        return pa.Table.from_arrays(columns, names=schema.names)
    names = list(dict.fromkeys(name for row in rows for name in row))
    columns = [json_column([r.get(name) for r in rows]) for name in names]
    texts = [n for n, c in zip(names, columns, strict=True) if c.type == pa.string()]
    mixed = [n for n in texts if any(json_kind(r.get(n)) not in ("str", "null") for r in rows)]
    if mixed:
        log.warning("jsonl: values of more than one JSON type in %s: read as text", mixed)
    return pa.Table.from_arrays(columns, names=names) if names else pa.table({})


def json_rows(data: bytes) -> Iterator[dict[str, Any]]:
    """The objects of a jsonl text, as pyarrow reads them: JSON whitespace between objects.
    Where no object can be read, the rest of that line is one row `{BAD_ROW: True}`, so one
    broken line costs one row, not the list."""
    # bytes that are not UTF-8 stay in the strings as lone surrogates (text_array's to find)
    text, decoder = data.decode("utf-8", "surrogateescape"), pyjson.JSONDecoder()
    at = JSON_SPACE.match(text).end()
    while at < len(text):
        try:
            value, end = decoder.raw_decode(text, at)
        except (pyjson.JSONDecodeError, RecursionError):  # RecursionError: [[[[... too deep
            value, end = None, len(text)
        if not isinstance(value, dict):
            line_end = text.find("\n", at)
            value, end = {BAD_ROW: True}, len(text) if line_end < 0 else line_end
        yield value
        at = JSON_SPACE.match(text, end).end()


def json_column(values: list[Any], type_: pa.DataType | None = None) -> pa.Array:
    """One column of parsed JSON values. Given a type (a partition: the planned column), that
    type, text columns as json_text; else the type pyarrow infers when every value has the
    same JSON type (numbers: one), else text."""
    if type_ is not None:
        if type_ in TEXT_TYPES or type_ in BINARY_TYPES:
            return text_array(values, type_)
        return pa.array(values, type_)
    kinds = {json_kind(v) for v in values} - {"null"}
    if len(kinds) <= 1:
        try:
            return pa.array(values)
        except (pa.ArrowException, OverflowError, TypeError, ValueError):
            pass  # e.g. nested values whose inner types differ, integers beyond 64 bits
    return text_array(values)


def text_array(values: list[Any], type_: pa.DataType = TEXT_TYPES[0]) -> pa.Array:
    """A text column of JSON values (json_text), binary when asked for or when some text is not
    UTF-8 (a lone surrogate: undecodable bytes or a `\ud800` escape), so that only the rows
    holding such text fail their UTF-8 check later."""
    texts = [json_text(v) for v in values]
    if type_ in TEXT_TYPES:
        try:
            return pa.array(texts, type_)
        except UnicodeEncodeError:
            type_ = pa.binary()
    return pa.array([t if t is None else raw_bytes(t) for t in texts], type_)


def raw_bytes(text: str) -> bytes:
    """Text back to the bytes it was read from (json_rows keeps undecodable bytes as lone
    surrogates); an escaped lone surrogate becomes bytes that are not UTF-8 either."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def binary_where_not_utf8(table: pa.Table) -> pa.Table:
    """The table with every text column that holds bytes which are not UTF-8 (pyarrow's json
    reader does not check) cast to binary, which converts each value to Python bytes rather
    than failing the whole conversion."""
    for index, column in enumerate(table.schema):
        if column.type in TEXT_TYPES:
            try:
                table.column(index).validate(full=True)
            except pa.ArrowInvalid:
                binary = pa.large_binary() if column.type == pa.large_string() else pa.binary()
                table = table.set_column(index, column.name, table.column(index).cast(binary))
    return table


def json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):  # before numbers: a bool is an int in Python
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__  # str, list, dict


def json_text(value: Any) -> str | None:
    """A value of a text column: strings as they are, other values as their JSON text."""
    if value is None or isinstance(value, str):
        return value
    return pyjson.dumps(value, ensure_ascii=False)

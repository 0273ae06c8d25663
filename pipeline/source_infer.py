"""The shape of a csv / tsv / jsonl URL list (rows, column names, column types) found while
streaming it, in memory bounded by a few blocks rather than by the file.

The answer is the one a whole-file read (pipeline/source_tables.read_table) gives, so plans do
not change: a whole-file read infers each column over all of its values; here each block of
lines is read on its own and the blocks' answers are unified as that read unifies its own
internal blocks:

- csv / tsv: pyarrow's reader tries kinds in a fixed order (null, int64, bool, double, ...,
  string, binary) and takes the first under which every value converts. Each block's kind is
  inferred, the latest of them is the candidate, and blocks of another kind are parsed again
  with the candidate type until one converts them all (the reader's own rule, so a column of
  `1` and `true` blocks comes out bool, as it does whole). Row counts and bad rows come from a
  streaming parse that handles quoted newlines.
- jsonl: pyarrow's reader where every block reads and the blocks' types unify as its reader
  promotes them (null to any, int64 to double, timestamp to string, lists and structs field by
  field); else Python's json over the stream (json_objects: json_rows' objects and bad rows),
  columns typed as json_column types them, block by block.
"""

from __future__ import annotations

import codecs
import io
import json as pyjson
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.json as pajson

from pipeline.source_csv import BAD_ROW, parse_options, read_csv_rows
from pipeline.source_ranges import JSON_SPACE, text_array

BLOCK = 1 << 20  # bytes of text parsed at once by pyarrow
STREAM_BLOCK = 256 << 10  # bytes pyarrow's streaming csv reader parses at once (counting rows)
TEXT_BLOCK = 1 << 20  # bytes of text Python's json holds at once (its objects cost ~10x)
GROUP_ROWS = 4096  # parsed rows typed at once
WIDE = 2.0**63  # a float column holding this or more was an integer too big for int64
# The kinds pyarrow's csv inference tries, in its order (arrow/csv/inference_internal.h).
CSV_KINDS = (
    pa.null(),
    pa.int64(),
    pa.bool_(),
    pa.float64(),
    pa.date32(),
    pa.time32("s"),
    pa.timestamp("s"),
    pa.timestamp("ns"),
    pa.timestamp("s", "UTC"),
    pa.timestamp("ns", "UTC"),
    pa.string(),
    pa.binary(),
)
TEXT_KIND = CSV_KINDS.index(pa.string())
ONE_THREAD = pajson.ReadOptions(use_threads=False)
# json_kind by Python type (json's values are of these only); `other` never unifies
JSON_KINDS = {type(None): "null", bool: "bool", int: "number", float: "number"}
JSON_KINDS |= {str: "str", list: "list", dict: "dict"}
TEXT_KINDS = {"str", "list", "dict"}  # values whose JSON text may hold text that is not UTF-8
log = logging.getLogger("mmcurate.sources")


@dataclass
class ListShape:
    """What planning needs of a text list: the whole-file read's row count, column names (in
    its order, BAD_ROW included where some row is bad) and, where asked for, its schema."""

    rows: int
    names: list[str]
    bad_rows: int = 0
    schema: pa.Schema | None = None


def line_blocks(src: Any, size: int | None = None) -> Iterator[bytes]:
    """The rest of a stream in pieces of about `size` (BLOCK) bytes, each ending after a
    newline (the last one where the stream ends)."""
    carry = b""
    while data := src.read(size or BLOCK):
        data = carry + data
        cut = data.rfind(b"\n") + 1
        carry = data[cut:]
        if cut:
            yield data[:cut]
    if carry:
        yield carry


# ---- csv / tsv ---------------------------------------------------------------------------------


def csv_names(open_: Callable[[], Any], fmt: str) -> list[str]:
    """The header's column names (pyarrow's ArrowInvalid where there is none)."""
    with open_() as src:
        return pacsv.open_csv(
            src, parse_options=parse_options(fmt, lambda row: "skip")
        ).schema.names


def csv_rows(open_: Callable[[], Any], fmt: str, names: list[str]) -> ListShape:
    """Rows (bad ones included) and names of a csv/tsv text, streamed with every value kept
    as bytes (nothing converted), quoted newlines and all."""
    bad = [0]

    def skip(row: Any) -> str:
        bad[0] += 1
        return "skip"

    convert = pacsv.ConvertOptions(column_types={name: pa.binary() for name in names})
    with open_() as src:
        reader = pacsv.open_csv(
            src,
            read_options=pacsv.ReadOptions(block_size=STREAM_BLOCK, use_threads=False),
            parse_options=parse_options(fmt, skip),
            convert_options=convert,
        )
        good = sum(batch.num_rows for batch in reader)
    return ListShape(good + bad[0], names + ([BAD_ROW] if bad[0] else []), bad[0])


@dataclass
class CsvBlock:
    start: int  # where the block's lines start in the file
    size: int
    types: dict[str, pa.DataType]  # as this block alone infers them
    largest: dict[str, float]  # numeric columns: the largest magnitude, as a double


def csv_schema(
    open_: Callable[[], Any], fmt: str, header_end: int, shape: ListShape, explicit: dict
) -> pa.Schema:
    """The whole-file read's schema of a plain csv/tsv whose rows are one line each: its
    header is bytes [0, header_end); `explicit` columns are read as those types."""
    with open_() as src:
        header = src.read(header_end)
        blocks, offset = [], header_end
        for body in line_blocks(src):
            blocks.append(csv_block(header + body, fmt, explicit, offset, len(body)))
            offset += len(body)

        def converts(block: CsvBlock, name: str, type_: pa.DataType) -> bool:
            src.seek(block.start)
            text = header + src.read(block.size)
            convert = pacsv.ConvertOptions(column_types={name: type_}, include_columns=[name])
            try:
                read_csv_rows(lambda: io.BytesIO(text), fmt, convert, threads=False)
            except pa.ArrowInvalid:
                return False
            return True

        names = [name for name in shape.names if name != BAD_ROW]
        fields = [pa.field(n, explicit.get(n) or csv_type(n, blocks, converts)) for n in names]
    if shape.bad_rows:
        fields.append(pa.field(BAD_ROW, pa.bool_()))
    return pa.schema(fields)


def csv_block(text: bytes, fmt: str, explicit: dict, start: int, size: int) -> CsvBlock:
    convert = pacsv.ConvertOptions(column_types=explicit)
    table = read_csv_rows(lambda: io.BytesIO(text), fmt, convert, threads=False)
    types, largest = {}, {}
    for name, column in zip(table.column_names, table.columns, strict=True):
        types[name] = column.type
        if pa.types.is_integer(column.type) or pa.types.is_floating(column.type):
            top = pc.max(pc.abs(column.cast(pa.float64()))).as_py()
            largest[name] = 0.0 if top is None else top
    return CsvBlock(start, size, types, largest)


def csv_type(name: str, blocks: list[CsvBlock], converts: Callable[..., bool]) -> pa.DataType:
    """The first kind, from the latest any block needs on, under which every block converts;
    a double column holding an integer beyond int64 is read as text (read_table's rule)."""
    types = [block.types.get(name, pa.null()) for block in blocks]
    kinds = [CSV_KINDS.index(t) if t in CSV_KINDS else TEXT_KIND for t in types]
    if len(set(types)) <= 1:
        chosen = types[0] if types else pa.null()
    else:
        kind = max(kinds)
        pairs = list(zip(blocks, kinds, strict=True))
        while kind < TEXT_KIND and not all(
            k == kind or converts(b, name, CSV_KINDS[kind]) for b, k in pairs
        ):
            kind += 1
        chosen = CSV_KINDS[kind]
    top = max((b.largest.get(name, 0.0) for b in blocks), default=0.0)
    if chosen == pa.float64() and top >= WIDE:
        return pa.string()
    return chosen


# ---- jsonl: pyarrow's reader --------------------------------------------------------------------


def arrow_json_shape(open_: Callable[[], Any]) -> ListShape | None:
    """The shape as pyarrow's json reader gives it for the whole text, or None where that read
    fails (a block that does not read, types that do not unify) or widens a column."""
    schema, rows, largest = None, 0, {}
    with open_() as src:
        for body in line_blocks(src):
            if not body.strip(b" \t\r\n"):
                continue  # blank lines only: the reader skips them
            try:  # one thread: on a driver, threads only add buffers
                table = pajson.read_json(io.BytesIO(body), read_options=ONE_THREAD)
            except pa.ArrowInvalid:
                return None
            schema = table.schema if schema is None else merged_schema(schema, table.schema)
            if schema is None:
                return None
            rows += table.num_rows
            note_largest(table, largest)
    if schema is None:
        return None
    for name in schema.names:
        if pa.types.is_floating(schema.field(name).type) and largest.get(name, 0.0) >= WIDE:
            return None
    return ListShape(rows, schema.names, 0, schema)


def note_largest(table: pa.Table, largest: dict[str, float]) -> None:
    for name, column in zip(table.column_names, table.columns, strict=True):
        if pa.types.is_integer(column.type) or pa.types.is_floating(column.type):
            top = pc.max(pc.abs(column.cast(pa.float64()))).as_py() or 0.0
            largest[name] = max(largest.get(name, 0.0), top)


def merged_schema(a: pa.Schema, b: pa.Schema, strings: bool = True) -> pa.Schema | None:
    fields = merged_fields(list(a), list(b), strings)
    return None if fields is None else pa.schema(fields)


def merged_fields(a: list[pa.Field], b: list[pa.Field], strings: bool) -> list[pa.Field] | None:
    """Fields of a then b's new ones (first appearance), each of the unified type."""
    out = {f.name: f.type for f in a}
    for f in b:
        type_ = merged_type(out[f.name], f.type, strings) if f.name in out else f.type
        if type_ is None:
            return None
        out[f.name] = type_
    return [pa.field(name, type_) for name, type_ in out.items()]


def merged_type(a: pa.DataType, b: pa.DataType, strings: bool = True) -> pa.DataType | None:
    """One type for values read as `a` in some blocks and `b` in others, as pyarrow's json
    reader promotes (`strings`: a timestamp column meeting text becomes text) and pa.array
    infers over all of them; None where they do not unify."""
    if a == b or pa.types.is_null(b):
        return a
    if pa.types.is_null(a):
        return b
    pair = {a, b}
    if pair == {pa.int64(), pa.float64()}:
        return pa.float64()
    if strings and pa.types.is_timestamp(a) and b == pa.string():
        return b
    if strings and pa.types.is_timestamp(b) and a == pa.string():
        return a
    if pa.types.is_list(a) and pa.types.is_list(b):
        inner = merged_type(a.value_type, b.value_type, strings)
        return None if inner is None else pa.list_(inner)
    if pa.types.is_struct(a) and pa.types.is_struct(b):
        fields = merged_fields(list(a), list(b), strings)
        return None if fields is None else pa.struct(fields)
    return None


# ---- jsonl: Python's json -----------------------------------------------------------------------


def json_objects(src: Any, block: int | None = None) -> Iterator[dict[str, Any]]:
    """The rows json_rows gives for the whole text of `src`, read a block at a time: an object
    is decoded once the text holds all of it; where none can be read, the rest of the line is
    one `{BAD_ROW: True}` row."""
    decoder, parser = codecs.getincrementaldecoder("utf-8")("surrogateescape"), pyjson.JSONDecoder()
    text, at, ended = "", 0, False
    while True:
        at = JSON_SPACE.match(text, at).end()
        if at >= len(text) and ended:
            return
        value, end, short = None, len(text), at >= len(text)
        if not short:
            try:
                value, end = parser.raw_decode(text, at)
            except pyjson.JSONDecodeError as err:
                short = not ended and cut_short(err, len(text))
            except RecursionError:  # [[[[... too deep: no more text makes it readable
                pass
        if not short and not isinstance(value, dict):
            line_end = text.find("\n", at)
            short = line_end < 0 and not ended
            value, end = {BAD_ROW: True}, len(text) if line_end < 0 else line_end
        if short:  # more text is needed to decide: keep the rest, read on
            data = src.read(block or TEXT_BLOCK)
            text, at, ended = text[at:] + decoder.decode(data, final=not data), 0, not data
            continue
        yield value
        at = end


def cut_short(err: pyjson.JSONDecodeError, length: int) -> bool:
    """Whether a decode failed for want of text (the error at the text's end, within the
    longest literal, or a string still open) rather than at something broken."""
    return err.pos >= length - 16 or err.msg.startswith("Unterminated string")


@dataclass
class JsonColumns:
    """Columns of parsed rows as json_column types them over all rows, fed a group at a time."""

    rows: int = 0
    bad_rows: int = 0
    kinds: dict[str, set[str]] = field(default_factory=dict)  # JSON types seen, null aside
    types: dict[str, pa.DataType | None] = field(default_factory=dict)  # None: pa.array fails
    binary: dict[str, bool] = field(default_factory=dict)  # as text, some is not UTF-8

    def add(self, rows: list[dict[str, Any]]) -> None:
        known = self.kinds.keys()
        for row in rows:
            if not known >= row.keys():  # a new name: kept in order of first appearance
                for name in row:
                    if name not in self.kinds:
                        self.kinds[name], self.types[name] = set(), pa.null()
                        self.binary[name] = False
        for name in self.kinds:
            self.add_column(name, [row.get(name) for row in rows])
        self.rows += len(rows)

    def add_column(self, name: str, values: list[Any]) -> None:
        kinds = {JSON_KINDS.get(t, "other") for t in {type(v) for v in values}} - {"null"}
        self.kinds[name] |= kinds
        type_ = self.types[name]
        if name == BAD_ROW:
            self.bad_rows += len(values) - values.count(None)
        if len(self.kinds[name]) <= 1 and type_ is not None:
            chunk = array_type(values)
            self.types[name] = None if chunk is None else merged_type(type_, chunk, False)
            if chunk == pa.string() or not kinds & TEXT_KINDS:
                return  # all this group's text is UTF-8 (or it has none)
        texts = [v for v in values if isinstance(v, str | list | dict)]
        if texts and not self.binary[name]:
            self.binary[name] = text_array(texts).type != pa.string()

    def shape(self) -> ListShape:
        fields = []
        for name, kinds in self.kinds.items():
            type_ = self.types[name] if len(kinds) <= 1 else None
            if type_ is None:  # json_column's text: binary where some text is not UTF-8
                type_ = pa.binary() if self.binary[name] else pa.string()
            fields.append(pa.field(name, type_))
        mixed = [f.name for f in fields if f.type == pa.string() and self.kinds[f.name] - {"str"}]
        if mixed:
            log.warning("jsonl: values of more than one JSON type in %s: read as text", mixed)
        names = [f.name for f in fields]
        return ListShape(self.rows if fields else 0, names, self.bad_rows, pa.schema(fields))


def array_type(values: list[Any]) -> pa.DataType | None:
    try:
        return pa.array(values).type
    except (pa.ArrowException, OverflowError, TypeError, ValueError):
        return None


def python_json_shape(open_: Callable[[], Any]) -> ListShape:
    columns, group = JsonColumns(), []
    with open_() as src:
        for row in json_objects(src):
            group.append(row)
            if len(group) >= GROUP_ROWS:
                columns.add(group)
                group = []
    if group:
        columns.add(group)
    return columns.shape()


def json_shape(open_: Callable[[], Any]) -> ListShape:
    """A jsonl text's shape as json_table reads it: pyarrow's, else Python json's."""
    return arrow_json_shape(open_) or python_json_shape(open_)

"""The shape of a jsonl URL list (pipeline/sources/infer.py says what a shape is and why it is
found block by block): pyarrow's reader where every block reads and the blocks' types unify as
its reader promotes them, else Python's json over the stream, columns typed block by block."""

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
import pyarrow.json as pajson
from mmcurate.pipeline.sources.csv_lists import BAD_ROW
from mmcurate.pipeline.sources.infer import GROUP_ROWS, WIDE, ListShape, line_blocks
from mmcurate.pipeline.sources.ranges import JSON_SPACE, text_array

log = logging.getLogger("mmcurate.sources")


TEXT_BLOCK = 1 << 20  # bytes of text Python's json holds at once (its objects cost ~10x)


ONE_THREAD = pajson.ReadOptions(use_threads=False)


# json_kind by Python type (json's values are of these only); `other` never unifies
JSON_KINDS = {type(None): "null", bool: "bool", int: "number", float: "number"} | {
    str: "str",
    list: "list",
    dict: "dict",
}


TEXT_KINDS = {"str", "list", "dict"}  # values whose JSON text may hold text that is not UTF-8


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

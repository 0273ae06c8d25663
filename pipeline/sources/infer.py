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

import io
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
from mmcurate.pipeline.sources.csv_lists import BAD_ROW, parse_options, read_csv_rows

BLOCK = 1 << 20  # bytes of text parsed at once by pyarrow
STREAM_BLOCK = 256 << 10  # bytes pyarrow's streaming csv reader parses at once (counting rows)
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

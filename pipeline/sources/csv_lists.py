"""Reading csv / tsv URL lists with pyarrow, one malformed row costing only that row.

A row with more or fewer fields than the header (a stray comma in an unquoted caption, a line
cut short) made pyarrow fail the whole list. Here such a row is skipped by the parser and put
back in its place as a row marked in the BAD_ROW column, so keys of later rows do not move and
the row is dropped and counted (`bad_csv_row`) like a jsonl line that is not an object.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

# A column marking rows that could not be read as a row of the list (jsonl: not a JSON
# object; csv/tsv: the wrong number of fields). Never a column of a user's list.
BAD_ROW = "__mmcurate_bad_row__"


def parse_options(fmt: str, on_bad_row: Callable[[Any], str] | None = None) -> pacsv.ParseOptions:
    return pacsv.ParseOptions(
        delimiter="\t" if fmt == "tsv" else ",",
        newlines_in_values=True,
        invalid_row_handler=on_bad_row,
    )


def read_csv_rows(
    open_: Callable[[], Any],
    fmt: str,
    convert: pacsv.ConvertOptions | None = None,
    threads: bool = True,
) -> pa.Table:
    """The csv/tsv text `open_()` opens (with its header row) as a table; rows with the wrong
    number of fields are kept in place as BAD_ROW rows (their other cells null). `threads`
    False: one thread (a planning pass over small blocks, where threads only add buffers)."""
    bad: list[int | None] = []

    def skip(row: Any) -> str:
        bad.append(row.number)  # the row's number among non-blank rows, header = 1
        return "skip"

    table = parse(open_, fmt, convert, skip, threads=threads)
    if not bad:
        return table
    if None in bad:  # the threaded parser does not number rows: parse again, in one thread
        bad.clear()
        table = parse(open_, fmt, convert, skip, threads=False)
    return with_bad_rows(table, [number - 2 for number in bad])


def parse(
    open_: Callable[[], Any],
    fmt: str,
    convert: pacsv.ConvertOptions | None,
    on_bad_row: Callable[[Any], str],
    threads: bool,
) -> pa.Table:
    with open_() as src:
        return pacsv.read_csv(
            src,
            read_options=pacsv.ReadOptions(use_threads=threads),
            parse_options=parse_options(fmt, on_bad_row),
            convert_options=convert,
        )


def with_bad_rows(table: pa.Table, bad: list[int]) -> pa.Table:
    """`table` (the good rows) with a null row at each of the `bad` positions, marked BAD_ROW."""
    total = table.num_rows + len(bad)
    is_bad = np.zeros(total, bool)
    is_bad[bad] = True
    take = np.zeros(total, np.int64)
    take[~is_bad] = np.arange(table.num_rows)
    rows = table.take(pa.array(take, mask=is_bad))
    return rows.append_column(BAD_ROW, pa.array(is_bad, mask=~is_bad))


def with_bad_row_column(table: pa.Table, columns: list[str]) -> pa.Table:
    """A partition's table with the BAD_ROW column where its plan has one (its own rows may
    all be good) and the columns in planned order."""
    if BAD_ROW in columns and BAD_ROW not in table.column_names:
        table = table.append_column(BAD_ROW, pa.nulls(table.num_rows, pa.bool_()))
    return table.select(columns)

"""The grow commands' decisions: the build's published signature rows and the new samples'
rows as one table in output order, every global decision made again over it by phase B
itself (pipeline/decide/phase_b.py), and what that changes.

Output order: `retry` puts each fetched-again row where its failed row was; `append` puts the
new rows after every earlier one (earlier rows win ties). A row that a global decision had
dropped is live again for the new decisions; one the new decisions keep whose media the
build no longer has (dropped by a threshold the new rows moved) keeps its old fate and is
counted as `not_restored`.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from mmcurate.core.atomic import write_parquet
from mmcurate.core.mapreduce import LocalRunner
from mmcurate.core.storage import filesystem, join
from mmcurate.pipeline.decide.phase_b import decide
from mmcurate.pipeline.output.groups import Groups, read_fate, read_small_parquets, with_fate
from mmcurate.pipeline.output.names import SIGNATURES, part_file
from mmcurate.pipeline.output.signatures import published_table
from mmcurate.stages.base import DROP, DROP_STAGE, Stage
from mmcurate.stages.lib.decisions import REPEATED_KEYS

MERGE_ROWS = 100_000  # rows per merged signature file (one decide group each)
PUBLISHED = {  # published name -> internal name (pipeline/output/signatures.py)
    "key": "__key__",
    "source": "__source__",
    "drop_reason": DROP,
    "drop_stage": DROP_STAGE,
    "bytes": "__bytes__",
    "parent": "__parent__",
    "shard": "__old_shard__",
    "duplicate_of": "__old_dup__",
}


def read_published(url: str, storage_options: dict) -> pa.Table:
    """Every row a finished build published (signatures/part-*.parquet, in output order)."""
    fs, root = filesystem(join(url, SIGNATURES), storage_options)
    fs.invalidate_cache(root)
    paths = sorted(fs.glob(join(root, "part-*.parquet")))
    tables = read_small_parquets(fs, paths) if paths else []
    return pa.concat_tables(tables, promote_options="permissive") if tables else pa.table({})


def internal(old: pa.Table) -> pa.Table:
    """Published rows under their internal names, marked old, with their fate kept aside."""
    if "duplicate_of" not in old.column_names:
        old = old.append_column("duplicate_of", pa.nulls(old.num_rows, pa.string()))
    old = old.rename_columns([PUBLISHED.get(c, c) for c in old.column_names])
    old = old.append_column("__old_drop__", old[DROP]).append_column(
        "__old_stage__", old[DROP_STAGE]
    )
    return old.append_column("__origin__", pa.array(["old"] * old.num_rows, pa.string()))


def union_table(old: pa.Table, new: pa.Table, command: str) -> pa.Table:
    """Old and new rows in output order, `__part__`/`__index__` renumbered over the union; a
    new row keeps where its media is (`__cand_part__`, `__offset__`, `__bytes__`)."""
    old = internal(old)
    old = old.append_column("__rank__", pa.array(np.arange(old.num_rows, dtype=np.float64)))
    new = new.append_column("__cand_part__", new["__part__"])
    new = new.append_column("__origin__", pa.array(["new"] * new.num_rows, pa.string()))
    if command == "retry":  # at the failed row's place, which it replaces
        place = {key: i for i, key in enumerate(old["__key__"].to_pylist())}
        ranks = [float(place[key]) for key in new["__key__"].to_pylist()]
        old = old.filter(pc.invert(pc.is_in(old["__key__"], new["__key__"])))
    else:
        ranks = [old.num_rows + i for i in range(new.num_rows)]
    new = new.append_column("__rank__", pa.array(ranks, pa.float64()))
    both = pa.concat_tables([old, new], promote_options="permissive").sort_by("__rank__")
    both = both.drop_columns(["__rank__", "__part__", "__index__"])
    position = np.arange(both.num_rows, dtype=np.int64)
    both = both.append_column("__part__", pa.array(position // MERGE_ROWS))
    return both.append_column("__index__", pa.array(position % MERGE_ROWS))


def undecided(table: pa.Table, stages: list[Stage]) -> pa.Table:
    """Rows that a global decision had dropped are live again: the decisions run anew."""
    labels = sorted({s.label for s in stages if s.is_global})
    again = pc.fill_null(
        pc.or_(
            pc.is_in(table[DROP_STAGE], pa.array(labels, pa.string())),
            pc.equal(table[DROP], REPEATED_KEYS.reason),
        ),
        False,
    )
    for name in (DROP, DROP_STAGE):
        column = pc.if_else(again, pa.nulls(table.num_rows, pa.string()), table[name])
        table = table.set_column(table.column_names.index(name), name, column)
    return table


def decide_union(table: pa.Table, stages: list[Stage], merge_url: str, options: dict) -> pa.Table:
    """Phase B over the union, written as signature files of MERGE_ROWS rows (one group
    each); returns the union with its final fates."""
    parts = sorted(set(table["__part__"].to_pylist()))
    rows = []
    for part in parts:
        piece = table.filter(pc.equal(table["__part__"], part))
        write_parquet(piece, join(merge_url, SIGNATURES, part_file(part, "parquet")), options)
        rows.append(piece.num_rows)
    groups = Groups(merge_url, options, [[p] for p in parts], rows)
    final = decide(groups, stages, LocalRunner())
    fates = [read_fate(groups, final, g) for g in range(groups.count)]
    return with_fate(table, pa.concat_tables(fates)) if fates else table


def kept_back(table: pa.Table, command: str) -> tuple[pa.Table, int]:
    """Old rows the new decisions keep but whose media is gone keep their old fate (how many
    such rows: `not_restored`); for `append`, every old row does (its shards stay as they are)."""
    old = pc.equal(table["__origin__"], "old")
    lost = pc.and_(old, pc.is_valid(table["__old_drop__"]))
    restored = pc.fill_null(pc.and_(lost, pc.is_null(table[DROP])), False)
    back = old if command == "append" else restored
    kept_aside = ((DROP, "__old_drop__"), (DROP_STAGE, "__old_stage__"))
    for name, before in (*kept_aside, ("duplicate_of", "__old_dup__")):
        column = pc.if_else(back, table[before], table[name])
        table = table.set_column(table.column_names.index(name), name, column)
    return table, int(pc.sum(restored).as_py() or 0)


def published_rows(table: pa.Table, shards: list) -> pa.Table:
    """The union's rows as the build publishes them, with each kept row's shard."""
    table = table.append_column("shard", pa.array(shards, pa.string()))
    return published_table(table)

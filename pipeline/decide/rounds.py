"""The machinery every decision round shares: a group's live rows, the shuffle's file names,
and applying a round's decisions to the fates (pipeline/decide/phase_b.py says how rounds run)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from mmcurate.core.atomic import write_parquet
from mmcurate.core.mapreduce import Runner
from mmcurate.pipeline.output.groups import (
    FATE_COLUMNS,
    Groups,
    read_fate,
    read_group,
    read_parquet,
    write_fate,
)
from mmcurate.pipeline.output.names import round_folder
from mmcurate.stages.base import DROP, DROP_STAGE
from mmcurate.stages.lib.decisions import split_by

ROW_ID = ["__key__", "__part__", "__index__"]


def live_table(
    groups: Groups, round_name: str, group: int, columns: list[str], optional: tuple[str, ...] = ()
) -> pa.Table:
    """A group's rows still live after `round_name` that have every one of `columns` set
    (and the `optional` columns, null where unset)."""
    wanted = list(dict.fromkeys([*ROW_ID, *columns, *optional]))
    table = read_group(groups, group, wanted)
    mask = pc.is_null(read_fate(groups, round_name, group)[DROP])
    for column in columns:
        mask = pc.and_(mask, pc.is_valid(table[column]))
    return table.filter(mask)


def shuffle_url(groups: Groups, round_name: str, name: str) -> str:
    return groups.scratch(round_folder("shuffle", round_name), f"{name}.parquet")


def decision_url(groups: Groups, round_name: str, source: int, group: int) -> str:
    return shuffle_url(groups, round_name, f"d{source:04d}-g{group:06d}")


def write_decisions(groups: Groups, round_name: str, source: int, decisions: pa.Table) -> list[int]:
    """Decision rows split by the group their partition belongs to; returns those groups."""
    if decisions.num_rows == 0:
        return []
    firsts = np.array([parts[0] for parts in groups.parts])
    group_of = np.searchsorted(firsts, decisions["__part__"].to_numpy(), side="right") - 1
    written = []
    # One sort splits every group's rows (a filter per group would scan them all each time).
    for group, rows in enumerate(split_by(decisions, group_of, groups.count)):
        if rows.num_rows:
            url = decision_url(groups, round_name, source, group)
            write_parquet(rows, url, groups.storage_options)
            written.append(group)
    return written


def apply_round(
    groups: Groups,
    names: tuple[str, str],
    label: str,
    written: list[set[int]],
    runner: Runner,
    replaces: frozenset[str] = frozenset(),
) -> None:
    """Every group's next fate: `written[source]` are the groups source `source` decided on.
    A decision also replaces a drop by one of the stages labelled in `replaces`."""
    sources = [[s for s, gs in enumerate(written) if g in gs] for g in range(groups.count)]
    calls = [(groups, names, g, sources[g], label, replaces) for g in range(groups.count)]
    runner.run(apply_group, calls)


def apply_group(
    groups: Groups,
    names: tuple[str, str],
    group: int,
    sources: list[int],
    label: str,
    replaces: frozenset[str] = frozenset(),
) -> None:
    """Task body: one group's fate after this round's decisions."""
    current, following = names
    fate = read_fate(groups, current, group)
    if sources:
        tables = [
            read_parquet(decision_url(groups, following, s, group), groups.storage_options)
            for s in sources
        ]
        fate = apply_decisions(fate, pa.concat_tables(tables), label, replaces)
    write_fate(groups, following, group, fate)


def apply_decisions(
    fate: pa.Table, decisions: pa.Table, label: str, replaces: frozenset[str] = frozenset()
) -> pa.Table:
    """Set drop reason, stage and kept key of the decided rows that are still live (or
    dropped by a stage in `replaces`: listed after this one, its drop came second)."""
    rows = fate.select(["__part__", "__index__"]).append_column(
        "__row__", pa.array(np.arange(fate.num_rows))
    )
    matched = decisions.join(rows, ["__part__", "__index__"], join_type="inner")
    at = matched["__row__"].to_numpy()
    drop = fate[DROP].to_numpy(zero_copy_only=False).astype(object)
    stage = fate[DROP_STAGE].to_numpy(zero_copy_only=False).astype(object)
    kept = fate["duplicate_of"].to_numpy(zero_copy_only=False).astype(object)
    live = np.array([drop[i] is None or stage[i] in replaces for i in at], dtype=bool)
    at = at[live]
    drop[at] = np.asarray(matched["reason"].to_numpy(zero_copy_only=False), object)[live]
    stage[at] = label
    kept[at] = np.asarray(matched["kept"].to_numpy(zero_copy_only=False), object)[live]
    columns = {DROP: drop, DROP_STAGE: stage, "duplicate_of": kept}
    for name, values in columns.items():
        fate = fate.set_column(fate.column_names.index(name), name, pa.array(values, pa.string()))
    return fate.select(list(FATE_COLUMNS))

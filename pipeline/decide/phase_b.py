"""Phase B on partitioned signatures: every global decision as rounds of tasks (issue 19).

Rounds, each reading one fate per group and writing the next (pipeline/output/groups.py):
- `000`: the fates as phase A left them;
- `001`: repeated keys (keys are unique in the output: the first live row in input order keeps
  a key);
- one round per global stage, in stage order, run as its `decide_plan()` says
  (stages/lib/decisions.py): a keyed shuffle, an exact top fraction (of the rows that reached
  the stage, pipeline/decide/top_fraction.py), or its whole-table
  `decide()` on the live rows' `decide_columns` gathered into one task.
A round's decisions are tables of (`__part__`, `__index__`, `reason`, `kept`) per group;
applying them sets the drop reason, the stage label and `duplicate_of` of rows still live.
The driver passes file lists and small counts only: its memory does not grow with samples.
"""

from __future__ import annotations

import logging
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from mmcurate.core.atomic import write_parquet
from mmcurate.core.mapreduce import LocalRunner, RayRunner, Runner, partitions_for
from mmcurate.core.storage import filesystem, remove_tree
from mmcurate.pipeline.decide.rounds import (
    ROW_ID,
    apply_round,
    live_table,
    shuffle_url,
    write_decisions,
)
from mmcurate.pipeline.decide.top_fraction import top_round
from mmcurate.pipeline.output.groups import (
    Groups,
    gather_group,
    read_fate,
    read_parquet,
    write_fate,
)
from mmcurate.pipeline.output.names import round_folder, round_name
from mmcurate.stages.base import DROP, DROP_STAGE, Stage
from mmcurate.stages.lib.decisions import REPEATED_KEYS, KeyedDecision, TopFraction
from mmcurate.stages.registry import stage_order

log = logging.getLogger("mmcurate.decide")


def decide(groups: Groups, stages: list[Stage], runner: Runner) -> str:
    """Run every global decision; returns the name of the round holding the final fates."""
    fs, scratch = filesystem(groups.scratch(), groups.storage_options)
    if fs.exists(scratch):
        remove_tree(fs, scratch)  # a crashed run's rounds: recomputed, never trusted
    runner.run(init_fate, [(groups, g) for g in range(groups.count)])
    current = "000"
    rounds: list[tuple[str, Any, Stage | None]] = [("source", REPEATED_KEYS, None)]
    rounds += [(s.label, s.decide_plan(), s) for s in stages if s.is_global and s.decides()]
    for number, (label, plan, stage) in enumerate(rounds, start=1):
        following = round_name(number)
        if isinstance(plan, KeyedDecision):
            keyed_round(groups, (current, following), label, plan, runner)
        elif isinstance(plan, TopFraction):
            top_round(groups, (current, following), label, plan, runner, reached_by(stage, stages))
        else:
            gather_round(groups, (current, following), label, stage, runner)
        drop_scratch(groups, [round_folder("fate", current), round_folder("shuffle", following)])
        current = following
    return current


def reached_by(stage: Stage | None, stages: list[Stage]) -> frozenset[str]:
    """Labels of the stages listed after `stage` whose per-sample work ran after its own: the
    rows they dropped had reached `stage` (its keep_top_fraction counts them)."""
    if stage is None:
        return frozenset()
    ordered = stage_order(stages)
    after = ordered[ordered.index(stage) + 1 :]
    return frozenset(s.label for s in after if s.index > stage.index)


def drop_scratch(groups: Groups, folders: list[str]) -> None:
    """A finished round's inputs and payloads: nothing reads them again."""
    for folder in folders:
        fs, path = filesystem(groups.scratch(folder), groups.storage_options)
        if fs.exists(path):
            remove_tree(fs, path)


def init_fate(groups: Groups, group: int) -> None:
    """Task body: the group's signatures as one file (later rounds read only the columns they
    need from it), and round 000: the drops phase A recorded."""
    table = gather_group(groups, group)
    write_parquet(table, groups.group_url(group), groups.storage_options)
    fate = table.select([*ROW_ID, DROP, DROP_STAGE])
    fate = fate.append_column("duplicate_of", pa.nulls(fate.num_rows, pa.string()))
    write_fate(groups, "000", group, fate)


# ---- keyed shuffle -------------------------------------------------------------------------


def keyed_round(
    groups: Groups, names: tuple[str, str], label: str, plan: KeyedDecision, runner: Runner
) -> None:
    """Map (route live rows), reduce (decide per key), apply (per group), through files."""
    current, following = names
    reduces = partitions_for(sum(groups.rows) * plan.row_bytes, runner)
    calls = [(groups, names, g, plan, reduces) for g in range(groups.count)]
    filled = runner.run(map_keyed, calls)
    senders = [[g for g, ids in enumerate(filled) if q in ids] for q in range(reduces)]
    calls = [(groups, following, q, senders[q], plan) for q in range(reduces)]
    written = runner.run(reduce_keyed, calls)
    apply_round(groups, names, label, [set(w) for w in written], runner)


def map_keyed(
    groups: Groups, names: tuple[str, str], group: int, plan: KeyedDecision, reduces: int
) -> list[int]:
    """Task body: route a group's live rows; returns the reduces it wrote a payload for."""
    table = live_table(groups, names[0], group, list(plan.columns), plan.optional)
    if table.num_rows == 0:
        return []
    written = []
    for reduce, payload in enumerate(plan.route(table, reduces)):
        if payload.num_rows:
            url = shuffle_url(groups, names[1], f"m{group:06d}-r{reduce:04d}")
            write_parquet(payload, url, groups.storage_options)
            written.append(reduce)
    return written


def reduce_keyed(
    groups: Groups, round_name: str, reduce: int, senders: list[int], plan: KeyedDecision
) -> list[int]:
    """Task body: one reduce's decisions, split by group; returns the groups it wrote for."""
    tables = [
        read_parquet(
            shuffle_url(groups, round_name, f"m{g:06d}-r{reduce:04d}"), groups.storage_options
        )
        for g in senders
    ]
    if not tables:
        return []
    dropped = plan.reduce(tables)
    reasons = pa.array([plan.reason] * dropped.num_rows, pa.string())
    decisions = pa.table(
        {
            "__part__": dropped["__part__"],
            "__index__": dropped["__index__"],
            "reason": reasons,
            "kept": dropped["kept"].cast(pa.string()),
        }
    )
    return write_decisions(groups, round_name, reduce, decisions)


# ---- a whole-table decide() on gathered rows -----------------------------------------------


def gather_round(
    groups: Groups, names: tuple[str, str], label: str, stage: Stage, runner: Runner
) -> None:
    """The stage's live rows (its columns only) in one task that runs its `decide()`."""
    columns = stage.decide_columns
    calls = [(groups, names, g, columns) for g in range(groups.count)]
    senders = [g for g, rows in enumerate(runner.run(map_gather, calls)) if rows]
    written = runner.run(decide_gathered, [(groups, names[1], senders, stage)])
    apply_round(groups, names, label, written, runner)


def map_gather(
    groups: Groups, names: tuple[str, str], group: int, columns: tuple[str, ...] | None
) -> int:
    """Task body: write a group's live rows (the listed columns, else all); returns rows."""
    wanted = None if columns is None else list(dict.fromkeys([*ROW_ID, *columns]))
    # Only columns the group has: decide() tells "no embeddings" from a column of nulls.
    table = read_parquet(groups.group_url(group), groups.storage_options, wanted)
    table = table.filter(pc.is_null(read_fate(groups, names[0], group)[DROP]))
    table = table.drop_columns([c for c in (DROP, DROP_STAGE) if c in table.column_names])
    table = table.append_column(DROP, pa.nulls(table.num_rows, pa.string()))  # all live
    if table.num_rows:
        write_parquet(table, shuffle_url(groups, names[1], f"m{group:06d}"), groups.storage_options)
    return table.num_rows


def decide_gathered(groups: Groups, round_name: str, senders: list[int], stage: Stage) -> list[int]:
    """Task body: the stage's decide() over every gathered row; decisions split by group."""
    tables = [
        read_parquet(shuffle_url(groups, round_name, f"m{g:06d}"), groups.storage_options)
        for g in senders
    ]
    if not tables:
        return []
    table = pa.concat_tables(tables, promote_options="permissive")
    decided = stage.decide(table, inner_runner())
    keys = table["__key__"].to_pylist()
    rows = pa.array([i for i, key in enumerate(keys) if key in decided], pa.int64())
    decisions = pa.table(
        {
            "__part__": table["__part__"].take(rows),
            "__index__": table["__index__"].take(rows),
            "reason": pa.array([decided[keys[i]][0] for i in rows.to_pylist()], pa.string()),
            "kept": pa.array([decided[keys[i]][1] for i in rows.to_pylist()], pa.string()),
        }
    )
    return write_decisions(groups, round_name, 0, decisions)


def inner_runner() -> Runner:
    """Ray tasks for a stage's own map-reduce when Ray runs (also inside a task), else here."""
    from mmcurate.pipeline.runtime.session import ray_running

    return RayRunner() if ray_running() else LocalRunner()

"""Per-stage counts: in, out, and drops by reason, summed from each signature group's share
(counted in the task that publishes the group). A stage is counted under its label: its name,
or `<position>:<name>` when its name is listed twice."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from stages.base import DROP, DROP_STAGE, Stage
from stages.registry import stage_order


def count_rows(table: pa.Table, timing: dict[str, str]) -> dict[str, Any]:
    """One group's share of the stats (a task body's result): rows, kept, drops by (stage,
    reason), split videos, and worker seconds per stage label (`timing`: label -> column)."""
    drops = Counter(zip(table[DROP_STAGE].to_pylist(), table[DROP].to_pylist(), strict=True))
    parents = []
    if "__parent__" in table.column_names:
        parents = [p for p in table["__parent__"].to_pylist() if p is not None]
    seconds = {
        label: float(pc.sum(table[column]).as_py() or 0.0)
        for label, column in timing.items()
        if column in table.column_names
    }
    return {
        "rows": table.num_rows,
        "kept": drops.get((None, None), 0),
        "drops": [[stage, reason, n] for (stage, reason), n in drops.items() if reason is not None],
        "clips": len(parents),
        "parents": len(set(parents)),  # a video's clips never span two groups (one partition)
        "seconds": seconds,
    }


def merge_counts(pieces: list[dict[str, Any]]) -> dict[str, Any]:
    """The build's counts from its groups' shares."""
    total: dict[str, Any] = {"rows": 0, "kept": 0, "clips": 0, "parents": 0}
    drops: Counter = Counter()
    seconds: Counter = Counter()
    for piece in pieces:
        for name in total:
            total[name] += piece[name]
        drops.update({(stage, reason): n for stage, reason, n in piece["drops"]})
        seconds.update(piece["seconds"])
    return total | {"drops": drops, "seconds": dict(seconds)}


def build_stats(counts: dict[str, Any], stages: list[Stage]) -> dict:
    """stats.json content; every input sample is counted once, as kept or under a reason."""
    total = counts["rows"] - counts["clips"] + counts["parents"]  # samples before any split
    entries: list[dict[str, Any]] = []
    stage_by_name = {s.label: s for s in stages}
    remaining = total
    for name in ["source", *[s.label for s in stage_order(stages)]]:
        dropped = {
            reason: n
            for (stage, reason), n in sorted(counts["drops"].items(), key=str)
            if stage == name
        }
        out = remaining - sum(dropped.values())
        if getattr(stage_by_name.get(name), "expands", False):
            out += counts["clips"] - counts["parents"]  # each split video became its clips
        entries.append(
            {
                "name": name,
                "in": remaining,
                "out": out,
                "dropped": dropped,
                "seconds": round(counts["seconds"].get(name, 0.0), 3),
            }
        )
        remaining = out
    if counts["kept"] != remaining:
        raise RuntimeError(
            f"stats do not add up: {counts['kept']} kept, {remaining} by stage counts"
        )
    return {"stages": entries, "samples_in": total, "samples_out": counts["kept"], "phases": {}}


def timing_columns(stages: list[Stage]) -> dict[str, str]:
    """Stage label -> the per-row timing column phase A wrote for it."""
    return {stage.label: stage.timing_column for stage in stages}


def stage_table(stats: dict) -> str:
    """The per-stage counts as a small terminal table."""
    lines = [f"  {'stage':<16} {'in':>7} {'out':>7}  dropped"]
    for stage in stats["stages"]:
        dropped = ", ".join(f"{k}={v}" for k, v in stage["dropped"].items()) or "-"
        lines.append(f"  {stage['name']:<16} {stage['in']:>7} {stage['out']:>7}  {dropped}")
    return "\n".join(lines)

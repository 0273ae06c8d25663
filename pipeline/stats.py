"""Per-stage counts from the signatures table: in, out, and drops by reason. A stage is
counted under its label: its name, or `<position>:<name>` when its name is listed twice."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa

from stages.base import DROP, DROP_STAGE, Stage
from stages.registry import stage_order


def build_stats(signatures: pa.Table, stages: list[Stage], seconds: dict[str, float]) -> dict:
    """stats.json content; every input sample is counted once, as kept or under a reason."""
    clips, parents = expanded_rows(signatures)
    total = signatures.num_rows - clips + parents  # samples that came in, before any split
    drops = Counter(
        zip(signatures[DROP_STAGE].to_pylist(), signatures[DROP].to_pylist(), strict=True)
    )
    entries: list[dict[str, Any]] = []
    stage_by_name = {s.label: s for s in stages}
    remaining = total
    for name in ["source", *[s.label for s in stage_order(stages)]]:
        dropped = {
            reason: n
            for (stage, reason), n in sorted(drops.items(), key=str)
            if stage == name and reason is not None
        }
        out = remaining - sum(dropped.values())
        if getattr(stage_by_name.get(name), "expands", False):
            out += clips - parents  # each split video became its clips
        entries.append(
            {
                "name": name,
                "in": remaining,
                "out": out,
                "dropped": dropped,
                "seconds": round(seconds.get(name, 0.0), 3),
            }
        )
        remaining = out
    kept = sum(1 for reason in signatures[DROP].to_pylist() if reason is None)
    if kept != remaining:
        raise RuntimeError(f"stats do not add up: {kept} kept, {remaining} by stage counts")
    return {"stages": entries, "samples_in": total, "samples_out": kept, "phases": {}}


def expanded_rows(signatures: pa.Table) -> tuple[int, int]:
    """(rows made by a splitting stage, distinct samples they came from)."""
    if "__parent__" not in signatures.column_names:
        return 0, 0
    parents = [p for p in signatures["__parent__"].to_pylist() if p is not None]
    return len(parents), len(set(parents))


def stage_seconds(signatures: pa.Table, stages: list[Stage]) -> dict[str, float]:
    """Total worker seconds per per-sample stage, from the per-row timing columns."""
    out: dict[str, float] = {}
    for stage in stages:
        col = stage.timing_column
        if col in signatures.column_names:
            out[stage.label] = float(sum(v or 0.0 for v in signatures[col].to_pylist()))
    return out


def stage_table(stats: dict) -> str:
    """The per-stage counts as a small terminal table."""
    lines = [f"  {'stage':<16} {'in':>7} {'out':>7}  dropped"]
    for stage in stats["stages"]:
        dropped = ", ".join(f"{k}={v}" for k, v in stage["dropped"].items()) or "-"
        lines.append(f"  {stage['name']:<16} {stage['in']:>7} {stage['out']:>7}  {dropped}")
    return "\n".join(lines)

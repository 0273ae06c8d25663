"""Per-stage counts: in, out, and drops by reason, summed from each signature group's share
(counted in the task that publishes the group). A stage is counted under its label: its name,
or `<position>:<name>` when its name is listed twice."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from mmcurate.pipeline.sources.samples import SOURCE
from mmcurate.stages.base import DROP, DROP_STAGE, Stage
from mmcurate.stages.clip_split import CLIP_SLOTS
from mmcurate.stages.registry import stage_order


def count_rows(table: pa.Table, timing: dict[str, str]) -> dict[str, Any]:
    """One group's share of the stats (a task body's result): rows, kept, drops by (stage,
    reason), split videos, and worker seconds per stage label (`timing`: label -> column)."""
    drops = Counter(zip(table[DROP_STAGE].to_pylist(), table[DROP].to_pylist(), strict=True))
    split = split_counts(table) if "__parent__" in table.column_names else None
    rows, clips, parents = table.num_rows, 0, 0
    if split is not None:
        drops -= split["clip_drops"]
        drops += split["video_drops"]
        rows -= sum(split["clip_drops"].values()) - sum(split["video_drops"].values())
        clips, parents = split["clips"], split["parents"]
    seconds = {
        label: float(pc.sum(table[column]).as_py() or 0.0)
        for label, column in timing.items()
        if column in table.column_names
    }
    return {
        "rows": rows,
        "kept": drops.get((None, None), 0),
        "drops": [[stage, reason, n] for (stage, reason), n in drops.items() if reason is not None],
        "clips": clips,
        "parents": parents,  # a video's clips never span two groups (one partition)
        "seconds": seconds,
    }


def split_counts(table: pa.Table) -> dict[str, Any]:
    """Clips and the videos they were cut from, told apart by partition and source index
    (two videos may share a key, e.g. in two tars). A video whose every clip the source
    rejected after the split (`duplicate_key` of a repeated video key) counts as one input
    dropped at the source, not as its clips: it was one sample in, and was never split."""
    videos: dict[tuple[int, int], list[tuple[str | None, str | None]]] = {}
    columns = ("__parent__", "__part__", "__index__", DROP_STAGE, DROP)
    for row in table.select(columns).to_pylist():
        if row["__parent__"] is not None:
            video = (row["__part__"], row["__index__"] // CLIP_SLOTS)
            videos.setdefault(video, []).append((row[DROP_STAGE], row[DROP]))
    clip_drops: Counter = Counter()
    video_drops: Counter = Counter()
    clips = parents = 0
    for fates in videos.values():
        stages = {stage for stage, _ in fates}
        if stages == {SOURCE}:  # all of its clips: the video itself was rejected
            clip_drops.update(fates)
            video_drops[fates[0]] += 1
        else:
            clips, parents = clips + len(fates), parents + 1
    return {
        "clips": clips,
        "parents": parents,
        "clip_drops": clip_drops,
        "video_drops": video_drops,
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

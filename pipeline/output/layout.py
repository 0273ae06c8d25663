"""Phase C's plan from per-group kept tables: greedy contiguous shards,
planned by streaming each group's kept sizes once, so the driver holds one group's sizes and
the shard boundaries (O(shards)), never every kept row.

A planned shard is a `ShardSpec` (pipeline/output/shard_format.py) with `start`/`stop`: a range
of positions in the build's kept rows (output order). A shard task gives it `parts` (per
candidate partition, the (key, offset, length) spans) by reading only those rows of the kept
tables. Phase C returns a `ShardLayout`: where groups and shards start, and the stats shares.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from mmcurate.core.atomic import write_parquet
from mmcurate.core.mapreduce import Runner
from mmcurate.pipeline.output.groups import (
    KEPT_ROW_GROUP,
    Groups,
    read_fate,
    read_group,
    read_parquet,
    read_rows,
    with_fate,
)
from mmcurate.pipeline.output.shard_format import TAR_END_BYTES, ShardSpec, Span, shard_name
from mmcurate.pipeline.output.stats import count_rows
from mmcurate.stages.base import DROP

KEPT_COLUMNS = ["__key__", "__part__", "__offset__", "__bytes__"]


@dataclass(frozen=True)
class ShardLayout:
    """Phase C's layout, for publishing the signatures and the stats (pipeline/build.py)."""

    kept_starts: list[int]  # global kept position of each group's first kept row
    shard_starts: list[int]  # global kept position of each shard's first row
    counts: list[dict[str, Any]]  # each group's share of the stats (pipeline/output/stats.py)


def kept_tables(
    groups: Groups, final_round: str, timing: dict[str, str], runner: Runner
) -> list[dict[str, Any]]:
    """Write each group's kept rows (output order); returns per group the kept count, the
    partitions they come from (and their kept rows), and the group's share of the stats
    (pipeline/output/stats.py)."""
    calls = [(groups, final_round, timing, g) for g in range(groups.count)]
    return runner.run(write_kept, calls)


def write_kept(
    groups: Groups, final_round: str, timing: dict[str, str], group: int
) -> dict[str, Any]:
    """Task body: a group's kept rows, in row groups a shard task can read a slice of."""
    columns = ["__index__", *KEPT_COLUMNS, "__parent__", *timing.values()]
    table = with_fate(read_group(groups, group, columns), read_fate(groups, final_round, group))
    kept = table.filter(pc.is_null(table[DROP]))
    rows = kept.select(KEPT_COLUMNS)
    write_parquet(rows, groups.kept_url(group), groups.storage_options, KEPT_ROW_GROUP)
    found = pc.value_counts(kept["__part__"]).to_pylist()
    per_part = sorted((int(v["values"]), int(v["counts"])) for v in found)
    share = {"kept": kept.num_rows, "parts": [part for part, _ in per_part]}
    # kept rows per partition: which shards need each candidate tar (pipeline/output/retire.py)
    return share | {"part_kept": per_part, "counts": count_rows(table, timing)}


class ShardPlanner:
    """Greedy contiguous shards over a stream of sample sizes: a shard closes before the
    sample that would pass `max_samples` samples or `max_bytes` bytes; a sample larger than
    `max_bytes` gets a shard of its own."""

    def __init__(self, max_samples: int, max_bytes: int) -> None:
        self.max_samples, self.max_bytes = max_samples, max_bytes
        self.starts: list[int] = [0]  # global position where each shard begins
        self.position = 0  # samples fed so far
        self.count, self.used = 0, TAR_END_BYTES  # the open shard's samples and bytes

    def feed(self, sizes: np.ndarray) -> None:
        total = np.concatenate(([0], np.cumsum(sizes, dtype=np.int64)))
        i, n = 0, len(sizes)
        while i < n:
            by_count = i + (self.max_samples - self.count)
            room = self.max_bytes - self.used  # bytes the open shard can still take
            by_bytes = int(np.searchsorted(total, total[i] + room, side="right")) - 1
            # A shard always takes its first sample; an overfull open shard closes at once.
            by_bytes = max(by_bytes, i + 1 if self.count == 0 else i)
            end = min(by_count, by_bytes)
            if end >= n:
                self.count += n - i
                self.used += int(total[n] - total[i])
                break
            self.starts.append(self.position + end)
            self.count, self.used = 0, TAR_END_BYTES
            i = end
        self.position += n

    def ranges(self) -> list[tuple[int, int]]:
        if self.position == 0:
            return []
        bounds = [*self.starts, self.position]
        return list(zip(bounds[:-1], bounds[1:], strict=True))


def plan_layout(
    groups: Groups, kept: list[int], max_samples: int, max_bytes: int
) -> list[ShardSpec]:
    """Shard specs over the kept rows, reading each group's sizes once, one group at a time."""
    planner = ShardPlanner(max_samples, max_bytes)
    for group, count in enumerate(kept):
        if count:
            sizes = read_parquet(groups.kept_url(group), groups.storage_options, ["__bytes__"])
            planner.feed(sizes["__bytes__"].to_numpy())
    return [
        ShardSpec(shard_name(i), stop - start, start=start, stop=stop)
        for i, (start, stop) in enumerate(planner.ranges())
    ]


def kept_starts(kept: list[int]) -> list[int]:
    """Global position of each group's first kept row."""
    return np.concatenate(([0], np.cumsum(kept, dtype=np.int64)))[:-1].tolist()


def spans_spec(spec: ShardSpec, groups: Groups, starts: list[int]) -> ShardSpec:
    """`spec` with `parts`: per candidate partition, the (key, offset, length) of its samples."""
    tables = []
    for group, first in enumerate(starts):
        stop = starts[group + 1] if group + 1 < len(starts) else None
        if (stop is not None and stop <= spec.start) or first >= spec.stop:
            continue
        a, b = max(spec.start, first) - first, spec.stop - first
        tables.append(read_rows(groups.kept_url(group), groups.storage_options, a, b))
    rows = pa.concat_tables(tables) if tables else None
    grouped: dict[int, list[Span]] = {}
    if rows is not None:
        columns = [rows[c].to_pylist() for c in KEPT_COLUMNS]
        for key, part, offset, length in zip(*columns, strict=True):
            grouped.setdefault(part, []).append((key, offset, length))
    return spec.replace(parts=tuple(sorted(grouped.items())))


def shard_of_rows(positions: np.ndarray, specs_starts: list[int]) -> np.ndarray:
    """Index of the shard holding each global kept position."""
    return np.searchsorted(np.asarray(specs_starts), positions, side="right") - 1

"""How a global stage's decision runs over partitioned signatures (pipeline/decide/phase_b.py).

A stage's `decide_plan()` returns one of these, or None: then the build gathers the live rows'
`decide_columns` into one task and calls its whole-table `decide()` there.
- KeyedDecision: a hash-partitioned group-by. Rows (live, every listed column set, plus
  `__key__`, `__part__`, `__index__`) are routed by `route(block, partitions)`; `reduce(tables)`
  gets one partition's rows and returns the rows to drop: `__part__`, `__index__`, `kept`
  (the surviving key, or null). Memory: a reduce holds its share of the routed rows.
- TopFraction: keep exactly ceil(fraction x N) of the N live rows with `column` set, highest
  value first, then smallest key (a distributed histogram finds the threshold).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


@dataclass(frozen=True)
class KeyedDecision:
    columns: tuple[str, ...]
    route: Callable[[pa.Table, int], list[pa.Table]]
    reduce: Callable[[list[pa.Table]], pa.Table]
    reason: str
    row_bytes: int = 64  # routed bytes per row (decides how many reduces)
    optional: tuple[str, ...] = ()  # also read where the build has them (null where not)


@dataclass(frozen=True)
class TopFraction:
    column: str
    fraction: float
    reason: str


def top_count(fraction: float, total: int) -> int:
    """ceil(fraction x total), where a product a float rounding put a hair above a whole
    number (0.3 x 10 = 3.0000000000000004) counts as that number. The margin is relative: an
    absolute one (- 1e-9) took a tiny product (1e-9 x 1) to 0 and kept no sample at all."""
    return math.ceil(fraction * total * (1 - 1e-12))


def split_by(block: pa.Table, route: np.ndarray, partitions: int) -> list[pa.Table]:
    """Rows of `block` per partition, given each row's partition number."""
    if partitions == 1:
        return [block]
    order = np.argsort(route, kind="stable")
    bounds = np.searchsorted(route[order], np.arange(partitions + 1))
    taken = block.take(pa.array(order))
    return [taken.slice(bounds[p], bounds[p + 1] - bounds[p]) for p in range(partitions)]


def route_by_text(block: pa.Table, partitions: int, column: str) -> list[pa.Table]:
    """Rows split by a stable hash of a text column (the same on every machine and run)."""
    if partitions == 1:  # nothing to route (and a small build skips importing pandas)
        return [block]
    import pandas as pd  # here, not at import: every build imports the stages

    values = block[column].to_numpy(zero_copy_only=False)
    route = (pd.util.hash_array(values.astype(object)) % np.uint64(partitions)).astype(np.int64)
    return split_by(block, route, partitions)


def first_per_key(tables: list[pa.Table]) -> pa.Table:
    """Rows whose `__key__` an earlier row (by part, then index) already has: to drop."""
    rows = pa.concat_tables(tables).sort_by(
        [("__key__", "ascending"), ("__part__", "ascending"), ("__index__", "ascending")]
    )
    keys = rows["__key__"]
    if rows.num_rows < 2:  # nothing can repeat
        rows = rows.slice(0, 0)
        return rows.select(["__part__", "__index__"]).append_column(
            "kept", pa.nulls(0, pa.string())
        )
    repeat = pc.equal(keys.slice(1), keys.slice(0, rows.num_rows - 1))
    mask = pa.concat_arrays([pa.array([False]), repeat.combine_chunks()])
    dropped = rows.filter(mask).select(["__part__", "__index__"])
    return dropped.append_column("kept", pa.nulls(dropped.num_rows, pa.string()))


REPEATED_KEYS = KeyedDecision(
    columns=(),
    route=partial(route_by_text, column="__key__"),
    reduce=first_per_key,
    reason="duplicate_key",
    row_bytes=48,
)

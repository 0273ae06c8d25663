"""What every dedupe shares: which item of a group survives, and the decisions it produces.

Keep policy (deterministic, so a rerun decides the same): highest `clip_score` when the build
has one, else the largest resolution (`width * height`), else the smallest key.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from mmcurate.stages.base import DROP

Decisions = dict[str, tuple[str, str | None]]


def live_rows(signatures: pa.Table, *required: str) -> pa.Table:
    """Rows not dropped so far that have every `required` column set. A column no row has
    (every sample dropped before the stage ran) means no rows, never a missing column."""
    for column in required:
        if column not in signatures.column_names:
            signatures = signatures.append_column(column, pa.nulls(signatures.num_rows))
    mask = pc.is_null(signatures[DROP])
    for column in required:
        mask = pc.and_(mask, pc.is_valid(signatures[column]))
    return signatures.filter(mask)


def priority_rank(table: pa.Table) -> np.ndarray:
    """rank[i] = position of row i in keep order (0 = keep first)."""
    sort_keys, columns = [], {}
    if "clip_score" in table.column_names:
        score = pc.cast(table["clip_score"], pa.float64())
        columns["score"] = pc.fill_null(pc.if_else(pc.is_nan(score), -np.inf, score), -np.inf)
        sort_keys.append(("score", "descending"))
    if "width" in table.column_names and "height" in table.column_names:
        area = pc.multiply(
            pc.fill_null(pc.cast(table["width"], pa.int64()), 0),
            pc.fill_null(pc.cast(table["height"], pa.int64()), 0),
        )
        columns["area"] = area
        sort_keys.append(("area", "descending"))
    columns["key"] = table["__key__"]
    sort_keys.append(("key", "ascending"))
    order = pc.sort_indices(pa.table(columns), sort_keys=sort_keys).to_numpy()
    rank = np.empty(len(order), np.int64)
    rank[order] = np.arange(len(order))
    return rank


def keepers(labels: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """For each row, the row kept in its group (lowest rank among rows with its label)."""
    order = np.lexsort((rank, labels))
    sorted_labels = labels[order]
    first = np.concatenate(([True], sorted_labels[1:] != sorted_labels[:-1]))
    group_first = order[np.flatnonzero(first)]
    group_index = np.cumsum(first) - 1
    keeper = np.empty(len(labels), np.int64)
    keeper[order] = group_first[group_index]
    return keeper


def group_decisions(keys: list[str], keeper: np.ndarray, reason: str) -> Decisions:
    """key -> (reason, kept key) for every row whose group keeps another row."""
    dropped = np.flatnonzero(keeper != np.arange(len(keeper)))
    return {keys[i]: (reason, keys[int(keeper[i])]) for i in dropped}


def star_keepers(n: int, a: np.ndarray, b: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """Keeper of each of n items under the pairs (a, b), without chaining: in keep order, an
    item that no kept item has claimed is kept and claims its pairs' other items. So a dropped
    item is always paired with its keeper itself (never only through a third item), and is
    dropped for the best-ranked kept item it is paired with.

    Vectorised in rounds: an item is decided once every better-ranked partner is; the best
    undecided item always is, so each round decides at least one (in practice a handful of
    rounds: the length of the longest chain of pairs in keep order)."""
    better = np.where(rank[a] < rank[b], a, b)
    worse = np.where(rank[a] < rank[b], b, a)
    order = np.lexsort((rank[better], worse))  # per worse item, partners best first
    better, worse = better[order], worse[order]
    keeper = np.full(n, -1, np.int64)  # -1: undecided; i: kept; else: the keeper
    top = np.setdiff1d(np.arange(n), worse)  # paired with nobody better: kept
    keeper[top] = top
    while True:
        open_edges = keeper[worse] == -1
        if not open_edges.any():
            return keeper
        pending = np.zeros(n, bool)
        pending[worse[open_edges & (keeper[better] == -1)]] = True
        ready = open_edges & ~pending[worse]  # every better partner decided
        kept_partner = ready & (keeper[better] == better)
        first = np.unique(worse[kept_partner], return_index=True)[1]
        claimed = worse[kept_partner][first]
        keeper[claimed] = better[kept_partner][first]  # sorted: the best kept partner
        free = np.unique(worse[ready])
        free = free[keeper[free] == -1]  # ready and claimed by nobody: kept
        keeper[free] = free

"""keep_top_fraction over partitioned signatures, exactly: ceil(f x N) of the N live rows with
a score kept, highest score first, then smallest key (the order `top_fraction_decisions` sorts
the whole table in), without any process holding all scores.

Scores (float32) map to order-preserving 32-bit codes. Round one counts codes per top 16 bits
in every group (65,536 buckets), the driver finds the bucket holding the threshold; round two
counts that bucket's low 16 bits, which gives the exact threshold code; round three returns the
keys tied at exactly that code (few: equal float32 scores), and the driver takes the smallest
ones. Then each group drops its rows below the threshold. NaN ranks below every number (Arrow
sorts NaN last), -0.0 equals 0.0.

N counts the rows that reached the stage: the live ones, and those that a stage listed after
it dropped after the score was written (aspect_buckets waits for the score it reads, and the
model stages' per-sample work runs in list order): without them, 0.5 kept 9 of 21, not 11.
Such a row that ranks below the threshold is this stage's drop, as the list order says; the
stats then count it here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from mmcurate.pipeline.decide.rounds import ROW_ID, apply_round, write_decisions
from mmcurate.pipeline.output.groups import Groups, read_fate, read_group
from mmcurate.stages.base import DROP, DROP_STAGE
from mmcurate.stages.lib.decisions import TopFraction, top_count

if TYPE_CHECKING:
    from mmcurate.core.mapreduce import Runner

BUCKETS = 1 << 16


def score_codes(scores: np.ndarray) -> np.ndarray:
    """uint32 codes in the scores' order (NaN lowest, -0.0 as 0.0)."""
    values = np.asarray(scores, np.float32) + np.float32(0.0)  # -0.0 + 0.0 is 0.0
    bits = values.view(np.uint32)
    codes = np.where(bits >> 31 == 1, ~bits, bits | np.uint32(1 << 31)).astype(np.uint32)
    return np.where(np.isnan(values), np.uint32(0), codes)


def top_round(
    groups: Groups,
    names: tuple[str, str],
    label: str,
    plan: TopFraction,
    runner: Runner,
    later: frozenset[str] = frozenset(),
) -> None:
    """Find the exact threshold in three counting rounds, then drop below it per group.
    `later`: labels of the stages listed after this one whose drops came after its score
    (their rows reached it)."""
    calls = [(groups, names[0], g, plan.column, None, later) for g in range(groups.count)]
    high = np.sum(runner.run(code_histogram, calls), axis=0)
    total = int(high.sum())
    keep = top_count(plan.fraction, total)
    if keep >= total:
        apply_round(groups, names, label, [], runner)
        return
    bucket, need = threshold_bucket(high, keep)
    calls = [(groups, names[0], g, plan.column, bucket, later) for g in range(groups.count)]
    low, need = threshold_bucket(np.sum(runner.run(code_histogram, calls), axis=0), need)
    code = (bucket << 16) | low
    calls = [(groups, names[0], g, plan.column, code, later) for g in range(groups.count)]
    tied = sorted(key for keys in runner.run(tied_keys, calls) for key in keys)
    last_key = tied[need - 1] if need else None
    calls = [(groups, names, g, plan, code, last_key, later) for g in range(groups.count)]
    written = runner.run(drop_below, calls)
    decided = [{g} if w else set() for g, w in enumerate(written)]
    apply_round(groups, names, label, decided, runner, replaces=later)


def threshold_bucket(counts: np.ndarray, keep: int) -> tuple[int, int]:
    """(bucket, how many of it to keep) so that the buckets above it plus that many make
    `keep`, walking from the highest bucket down. `keep` >= 1."""
    above = np.cumsum(counts[::-1])  # above[i]: rows in the i+1 highest buckets
    index = int(np.searchsorted(above, keep))  # first prefix reaching keep
    bucket = len(counts) - 1 - index
    before = int(above[index - 1]) if index else 0
    return bucket, keep - before


def reached_scores(
    groups: Groups, round_name: str, group: int, column: str, later: frozenset[str]
) -> pa.Table:
    """A group's scored rows that reached the stage: live after `round_name`, or dropped by
    one of the `later` stages."""
    table = read_group(groups, group, list(dict.fromkeys([*ROW_ID, column])))
    fate = read_fate(groups, round_name, group)
    reached = pc.or_(
        pc.is_null(fate[DROP]),
        pc.is_in(fate[DROP_STAGE], pa.array(sorted(later), pa.string())),
    )
    return table.filter(pc.and_(pc.fill_null(reached, False), pc.is_valid(table[column])))


def code_histogram(
    groups: Groups,
    round_name: str,
    group: int,
    column: str,
    bucket: int | None,
    later: frozenset[str],
) -> np.ndarray:
    """Task body: counts per top 16 bits of the codes, or per low 16 bits within `bucket`."""
    table = reached_scores(groups, round_name, group, column, later)
    codes = score_codes(table[column].to_numpy())
    if bucket is None:
        return np.bincount(codes >> 16, minlength=BUCKETS)
    return np.bincount(codes[codes >> 16 == bucket] & 0xFFFF, minlength=BUCKETS)


def tied_keys(
    groups: Groups, round_name: str, group: int, column: str, code: int, later: frozenset[str]
) -> list[str]:
    """Task body: keys of the reached rows whose score code is exactly `code`."""
    table = reached_scores(groups, round_name, group, column, later)
    tied = score_codes(table[column].to_numpy()) == code
    return table["__key__"].filter(pa.array(tied)).to_pylist()


def drop_below(
    groups: Groups,
    names: tuple[str, str],
    group: int,
    plan: TopFraction,
    code: int,
    last_key: str | None,
    later: frozenset[str],
) -> bool:
    """Task body: write this group's decisions (rows below the threshold); whether any."""
    table = reached_scores(groups, names[0], group, plan.column, later)
    codes = score_codes(table[plan.column].to_numpy())
    below = codes < code
    at = codes == code
    if last_key is None:
        below |= at
    else:
        below |= at & pc.greater(table["__key__"], last_key).to_numpy(zero_copy_only=False)
    dropped = table.filter(pa.array(below))
    decisions = pa.table(
        {
            "__part__": dropped["__part__"],
            "__index__": dropped["__index__"],
            "reason": pa.array([plan.reason] * dropped.num_rows, pa.string()),
            "kept": pa.nulls(dropped.num_rows, pa.string()),
        }
    )
    return bool(write_decisions(groups, names[1], group, decisions))

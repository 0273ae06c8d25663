"""Finding all pairs of 64-bit hashes within a Hamming radius, in time linear in their number.

Every method here is a list of *tables*; a table is a 64-bit mask, and two hashes are a
candidate pair when they agree on every masked bit (`a & mask == b & mask`). Candidates are
then verified by popcount. Two ways to choose the masks:

- exact (pigeonhole): split the 64 bits into `bands` bands; a pair at distance <= radius
  differs in at most `radius` of them, so it agrees on some `bands - radius` bands. One table per
  such combination, C(bands, radius) tables, finds every pair within the radius.
- lsh (window LSH, `hamming_lsh`): `groups` random bit permutations, each with a few windows
  of `bits` contiguous permuted bits; the fewest groups that reach the target recall for
  pairs at distance exactly `radius` (closer pairs are found more often).

Each pair is reported by one table only: the first, in plan order, whose mask it agrees on
(`first_found_here`), so the result does not depend on how tables are split into tasks.
`plan_tables` (stages/lib/hamming_plan.py) picks between the two with a cost model.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache

import numpy as np
from mmcurate.stages.lib.hamming_lsh import (
    first_found_here,
    group_pairs,
    rows_window_pairs,
)
from mmcurate.stages.lib.hamming_plan import TablePlan

GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # odd: multiplying by it permutes the uint64 values
LOW = np.uint64(0xFFFFFFFF)  # the position half of a packed (digest, position)
HIGH = np.uint64(0xFFFFFFFF00000000)  # the digest half


# ---- candidates within one table ------------------------------------------------------------


def equal_key_pairs(keys: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Positions (i, j), i < j, of every pair of equal values in a *sorted* array, yielded one
    offset j - i at a time: at offset s the live positions are those whose run continues at
    least s further. The work is the number of pairs plus one pass per offset, and a caller
    that filters each batch holds O(len(keys)) however large one run is."""
    n = len(keys)
    if n < 2:
        return
    starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
    lengths = np.diff(np.append(starts, n))
    run_end = np.repeat(starts + lengths, lengths)  # one past the last position of each run
    live = np.flatnonzero(run_end - np.arange(n) > 1)
    offset = 1
    while live.size:
        yield live, live + offset
        offset += 1
        live = live[run_end[live] - live > offset]


def close_pairs_in_table(
    hashes: np.ndarray, mask: int, radius: int, ids: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Ids (a, b), a < b, of hashes agreeing on `mask` and within `radius` of each other; ids
    default to positions in `hashes`.

    Each hash gets a 32-bit digest of its masked bits (the top half of a multiplicative hash):
    equal masked bits give equal digests, and the rare digest collision only adds a candidate
    that the popcount check rejects. Digest and position are packed in one uint64 and sorted
    in one call (numpy's vectorised sort: ~0.12 s for 10M here, 3x less than the bucketed
    argsort it replaced); then every pair inside each run of equal digests is verified.
    """
    if len(hashes) >= 1 << 32:
        raise ValueError("a table holds fewer than 2**32 hashes")
    packed = hashes & np.uint64(mask)
    np.multiply(packed, GOLDEN, out=packed)
    np.bitwise_and(packed, HIGH, out=packed)
    np.bitwise_or(packed, positions(len(hashes)), out=packed)
    packed.sort()
    a, b = run_pairs(packed, hashes, radius)
    if ids is not None:
        a, b = ids[a], ids[b]
    return np.minimum(a, b), np.maximum(a, b)


@lru_cache(maxsize=2)
def positions(n: int) -> np.ndarray:
    """0..n-1 as uint64, made once per process and size (every table of a task reuses it)."""
    out = np.arange(n, dtype=np.uint64)
    out.flags.writeable = False
    return out


def run_pairs(packed: np.ndarray, hashes: np.ndarray, radius: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions (a, b) of the pairs within `radius` inside runs of equal digests of `packed`
    (sorted; digest in the high 32 bits, position in the low 32). One offset at a time: at
    offset s the live starts are those whose run goes on s further, so the work is one pass
    over the neighbours plus the candidate pairs. (Gathering all hashes in sorted order first,
    so candidates read them in order, measured slower at 22 and 24 bits: 1.8 s vs 1.5 s.)"""
    same_next = np.bitwise_xor(packed[1:], packed[:-1]) < np.uint64(1 << 32)
    live = np.flatnonzero(same_next)
    firsts, seconds = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
    offset = 1
    while live.size:
        a, b = packed[live] & LOW, packed[live + offset] & LOW
        close = np.bitwise_count(hashes[a] ^ hashes[b]) <= radius
        firsts.append(a[close].astype(np.int64))
        seconds.append(b[close].astype(np.int64))
        live = live[live + offset < len(same_next)]
        live = live[same_next[live + offset]]  # the run goes on past its current end
        offset += 1
    return np.concatenate(firsts), np.concatenate(seconds)


def unique_inverse(hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(inverse, unique) with unique[inverse] == hashes and unique sorted (the window tables
    find positions by binary search in it). One vectorised argsort: at 10M, 2.3 s against
    2.7 s for the bucketed factorize it replaced (same run, loaded machine)."""
    order = np.argsort(hashes)
    ordered = hashes[order]
    new = np.empty(len(hashes), bool)
    new[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=new[1:])
    inverse = np.empty(len(hashes), np.int64)
    inverse[order] = np.cumsum(new) - 1
    return inverse, ordered[new]


def distinct(hashes: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
    """(inverse, sorted distinct hashes); inverse is None when `hashes` already are both."""
    if len(hashes) < 2 or bool(np.all(hashes[1:] > hashes[:-1])):
        return None, hashes
    return unique_inverse(hashes)


def expand_pairs(
    a: np.ndarray, b: np.ndarray, inverse: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """Pairs of distinct hashes (a, b) as pairs of rows: every row of a with every row of b,
    plus every two rows holding one hash (distance 0); sorted, each once."""
    if inverse is None:
        return unique_pairs(a, b)
    order = np.argsort(inverse, kind="stable")
    counts = np.bincount(inverse, minlength=int(inverse.max()) + 1)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    per = counts[a] * counts[b]
    pair = np.repeat(np.arange(len(a)), per)
    k = np.arange(int(per.sum())) - np.repeat(np.cumsum(per) - per, per)
    rows_a = order[starts[a][pair] + k // counts[b][pair]]
    rows_b = order[starts[b][pair] + k % counts[b][pair]]
    same = [(order[i], order[j]) for i, j in equal_key_pairs(inverse[order])]
    firsts = np.concatenate([rows_a] + [i for i, _ in same])
    seconds = np.concatenate([rows_b] + [j for _, j in same])
    return unique_pairs(np.minimum(firsts, seconds), np.maximum(firsts, seconds))


def brute_force_pairs(hashes: np.ndarray, radius: int) -> set[tuple[int, int]]:
    """Every pair within radius, by comparing all pairs: the reference for tests (small n)."""
    found = set()
    for i in range(len(hashes)):
        near = np.flatnonzero(np.bitwise_count(hashes[i + 1 :] ^ hashes[i]) <= radius)
        found.update((i, i + 1 + int(j)) for j in near)
    return found


# ---- all tables, hash-partitioned ----------------------------------------------------------


def route(keys: np.ndarray, table: int, partitions: int) -> np.ndarray:
    """Partition of each (table, key): a multiplicative hash, so equal keys meet in one reduce."""
    mixed = (keys ^ np.uint64(table * 0x5851F42D4C957F2D & (2**64 - 1))) * GOLDEN
    return ((mixed >> np.uint64(33)) % np.uint64(partitions)).astype(np.int64)


def table_rows_pairs(
    plan: TablePlan, table: int, hashes: np.ndarray, ids: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Ids (a, b), a < b (default: positions), of the pairs table `table` reports among these
    rows (all hashes, or one reduce's share): found there, and found there first."""
    if plan.mode == "lsh":
        perm, rotation = plan.window_of(table)
        a, b = rows_window_pairs(hashes, perm, rotation, plan.bits, plan.radius)
    else:
        a, b = close_pairs_in_table(hashes, plan.masks[table], plan.radius)
    keep = first_found_here(hashes[a] ^ hashes[b], plan.masks, table)
    a, b = a[keep], b[keep]
    if ids is not None:
        a, b = ids[a], ids[b]
    return np.minimum(a, b), np.maximum(a, b)


def group_task(plan: TablePlan, group: int, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One lsh group over all (sorted, distinct) hashes: the task when they fit in a reduce."""
    return group_pairs(
        group, plan.perms[group], plan.rotations, plan.bits, plan.radius, plan.masks, hashes
    )


def map_block(
    block: tuple[np.ndarray, int], plan: TablePlan, first_table: int, count: int, partitions: int
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Route a block of hashes (and their ids, offset + position) to partitions, per table.

    Payload per partition: (hashes, ids, rows per table). The hash travels instead of the key
    because the reduce needs it to verify and can recompute the key from its table's mask.
    """
    hashes, offset = block
    ids = np.arange(offset, offset + len(hashes), dtype=np.int64)
    per_part: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(partitions)]
    for t in range(first_table, first_table + count):
        part = route(hashes & np.uint64(plan.masks[t]), t, partitions)
        order = np.argsort(part.astype(np.uint16), kind="stable")  # radix sort
        bounds = np.searchsorted(part[order], np.arange(partitions + 1))
        for p in range(partitions):
            sel = order[bounds[p] : bounds[p + 1]]
            per_part[p].append((hashes[sel], ids[sel]))
    return [
        (
            np.concatenate([h for h, _ in tables]),
            np.concatenate([i for _, i in tables]),
            np.array([len(h) for h, _ in tables], np.int64),
        )
        for tables in per_part
    ]


def reduce_partition(
    payloads: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
    plan: TablePlan,
    first_table: int,
    count: int,
) -> tuple[np.ndarray, np.ndarray]:
    """The pairs (a, b) the tables report among one partition's rows, table by table."""
    firsts, seconds = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
    starts = [np.concatenate(([0], np.cumsum(counts))) for _, _, counts in payloads]
    for t in range(count):
        pieces = [
            (h[s[t] : s[t + 1]], i[s[t] : s[t + 1]])
            for (h, i, _), s in zip(payloads, starts, strict=True)
        ]
        hashes = np.concatenate([h for h, _ in pieces])
        ids = np.concatenate([i for _, i in pieces])
        a, b = table_rows_pairs(plan, first_table + t, hashes, ids)
        firsts.append(a)
        seconds.append(b)
    return np.concatenate(firsts), np.concatenate(seconds)


def unique_pairs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct pairs (one 1-D sort of a * span + b)."""
    a, b = a.astype(np.int64), b.astype(np.int64)
    if not len(a):
        return a, b
    span = int(b.max()) + 1
    if span >= 1 << 32 or int(a.max()) >= 1 << 32:
        pairs = np.unique(np.stack([a, b], axis=1), axis=0)
        return pairs[:, 0], pairs[:, 1]
    keys = np.unique(a.astype(np.uint64) * np.uint64(span) + b.astype(np.uint64))
    return (keys // np.uint64(span)).astype(np.int64), (keys % np.uint64(span)).astype(np.int64)

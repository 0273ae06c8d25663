"""Finding all pairs of 64-bit hashes within a Hamming radius, in time linear in their number.

Every method here is a list of *tables*; a table is a 64-bit mask, and two hashes are a
candidate pair when they agree on every masked bit (`a & mask == b & mask`). Candidates are
then verified by popcount. Two ways to choose the masks:

- exact (pigeonhole): split the 64 bits into `bands` bands; a pair at distance <= radius
  differs in at most `radius` of them, so it agrees on some `bands - radius` bands. One table per
  such combination, C(bands, radius) tables, finds every pair within the radius.
- lsh: `tables` masks of `bits` random bits each. A pair at distance d agrees on one with
  probability C(64-d, bits) / C(64, bits); `tables` is the smallest count that reaches the
  target recall at d = radius (closer pairs are found more often).

`plan_tables` picks between them with a cost model: per table, one sort of all n hashes plus
the expected random candidates n^2 / 2^(bits+1) (uniform hashes).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations

import numpy as np
import pandas

SORT_COST = 1.0  # relative cost of sorting one hash in one table
PAIR_COST = (
    4.0  # one candidate pair (two random gathers, ~180 ns) vs one hash in one table (~45 ns)
)
MAX_TABLES = 400
GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # odd: multiplying by it permutes the uint64 values
LOW = np.uint64(0xFFFFFFFF)  # the position half of a packed (digest, position)
HIGH = np.uint64(0xFFFFFFFF00000000)  # the digest half
BUCKET_ROWS = 1 << 16  # hashes per bucket of unique_inverse's hash tables (in a core's L2)


@dataclass(frozen=True)
class TablePlan:
    mode: str  # "exact" or "lsh"
    radius: int
    masks: tuple[int, ...]
    bits: int  # masked bits per table (the smallest, for exact bands of unequal width)

    def recall_at(self, distance: int) -> float:
        """Probability that a pair at `distance` shares at least one table."""
        if distance > self.radius:
            return 0.0  # verification drops every candidate beyond the radius
        if self.mode == "exact":
            return 1.0
        return lsh_recall(distance, self.bits, len(self.masks))

    def describe(self) -> str:
        return f"{self.mode}: {len(self.masks)} tables of {self.bits}+ bits"


def band_masks(bands: int) -> list[int]:
    """Split bit positions 0..63 into `bands` strided bands (bit i goes to band i % bands), so a
    band mixes low- and high-order bits of a perceptual hash instead of one frequency region."""
    masks = [0] * bands
    for bit in range(64):
        masks[bit % bands] |= 1 << bit
    return masks


def exact_masks(radius: int, bands: int) -> list[int]:
    """One mask per choice of `bands - radius` bands (pigeonhole: all pairs within radius)."""
    per_band = band_masks(bands)
    masks = []
    for chosen in combinations(range(bands), bands - radius):
        mask = 0
        for band in chosen:
            mask |= per_band[band]
        masks.append(mask)
    return masks


def lsh_recall(distance: int, bits: int, tables: int) -> float:
    if bits > 64 - distance:
        return 0.0
    agree = math.comb(64 - distance, bits) / math.comb(64, bits)
    return 1.0 - (1.0 - agree) ** tables


def lsh_tables_needed(radius: int, bits: int, recall: float) -> int:
    agree = math.comb(64 - radius, bits) / math.comb(64, bits) if bits <= 64 - radius else 0.0
    if agree >= 1.0:
        return 1
    if agree <= 0.0:
        return MAX_TABLES + 1
    return max(1, math.ceil(math.log(1.0 - recall) / math.log(1.0 - agree)))


def lsh_masks(bits: int, tables: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    masks = []
    for _ in range(tables):
        mask = 0
        for bit in rng.choice(64, size=bits, replace=False):
            mask |= 1 << int(bit)
        masks.append(mask)
    return masks


def plan_cost(n: int, masks: list[int] | tuple[int, ...]) -> float:
    """Relative cost: per table one pass over n hashes plus the random candidate pairs."""
    pairs = sum(n * n / 2.0 / 2.0 ** mask.bit_count() for mask in masks)
    return len(masks) * n * SORT_COST + pairs * PAIR_COST


def plan_tables(n: int, radius: int, recall: float, mode: str = "auto", seed: int = 0) -> TablePlan:
    """The cheapest plan for n hashes: exact if `mode` says so, or in auto mode when exact costs
    no more than 1.25x the best LSH plan (then nothing within the radius is ever missed)."""
    if not 0 <= radius <= 16:
        raise ValueError("radius must be between 0 and 16")
    exact = best_exact(n, radius)
    if mode == "exact" or radius == 0:
        return exact
    lsh = best_lsh(n, radius, recall, seed)
    if mode == "lsh":
        return lsh
    return exact if plan_cost(n, exact.masks) <= 1.25 * plan_cost(n, lsh.masks) else lsh


def best_exact(n: int, radius: int) -> TablePlan:
    best: tuple[float, int] | None = None
    for bands in range(radius + 1, 64):
        if math.comb(bands, radius) > MAX_TABLES:
            break
        cost = plan_cost(n, exact_masks(radius, bands))
        if best is None or cost < best[0]:
            best = (cost, bands)
    bands = best[1] if best else radius + 1
    return TablePlan(
        "exact", radius, tuple(exact_masks(radius, bands)), 64 * (bands - radius) // bands
    )


def best_lsh(n: int, radius: int, recall: float, seed: int) -> TablePlan:
    best: tuple[float, int, int] | None = None
    for bits in range(8, 64 - radius + 1):
        tables = lsh_tables_needed(radius, bits, recall)
        if tables > MAX_TABLES:
            continue
        cost = tables * (n * SORT_COST + n * n / 2.0 / 2.0**bits * PAIR_COST)
        if best is None or cost < best[0]:
            best = (cost, bits, tables)
    if best is None:
        raise ValueError(f"no LSH plan reaches recall {recall} at radius {radius}")
    _, bits, tables = best
    return TablePlan("lsh", radius, tuple(lsh_masks(bits, tables, seed)), bits)


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
    """(inverse, unique) with unique[inverse] == hashes. Radix-bucketed by a mix of the bits
    first, so each bucket's hash table fits in cache: ~1.5x faster than one big factorize."""
    mixed_top = ((hashes * GOLDEN) >> np.uint64(48)).astype(np.uint16)
    bucket_bits = min(16, max(0, math.ceil(math.log2(max(1, len(hashes)) / BUCKET_ROWS))))
    bucket = mixed_top >> np.uint16(16 - bucket_bits) if bucket_bits else mixed_top * 0
    order = np.argsort(bucket, kind="stable")
    bounds = np.concatenate(([0], np.cumsum(np.bincount(bucket, minlength=1 << bucket_bits))))
    by_bucket = hashes[order]
    inverse_sorted = np.empty(len(hashes), np.int64)
    uniques, base = [], 0
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        codes, values = pandas.factorize(by_bucket[lo:hi])
        inverse_sorted[lo:hi] = codes + base
        uniques.append(values)
        base += len(values)
    inverse = np.empty(len(hashes), np.int64)
    inverse[order] = inverse_sorted
    return inverse, np.concatenate(uniques) if uniques else hashes[:0]


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


def table_pairs(mask: int, radius: int, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One whole table over all hashes: the task when one table's rows fit in one reduce."""
    return close_pairs_in_table(hashes, mask, radius)


def map_block(
    block: tuple[np.ndarray, int], masks: tuple[int, ...], first_table: int, partitions: int
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Route a block of hashes (and their ids, offset + position) to partitions, per table.

    Payload per partition: (hashes, ids, rows per table). The hash travels instead of the key
    because the reduce needs it to verify and can recompute the key from its table's mask.
    """
    hashes, offset = block
    ids = np.arange(offset, offset + len(hashes), dtype=np.int64)
    per_part: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(partitions)]
    for t, mask in enumerate(masks):
        part = route(hashes & np.uint64(mask), first_table + t, partitions)
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
    payloads: list[tuple[np.ndarray, np.ndarray, np.ndarray]], masks: tuple[int, ...], radius: int
) -> tuple[np.ndarray, np.ndarray]:
    """Verified pairs (a, b) among one partition's rows, table by table; duplicates removed."""
    firsts, seconds = [], []
    starts = [np.concatenate(([0], np.cumsum(counts))) for _, _, counts in payloads]
    for t, mask in enumerate(masks):
        pieces = [
            (h[s[t] : s[t + 1]], i[s[t] : s[t + 1]])
            for (h, i, _), s in zip(payloads, starts, strict=True)
        ]
        hashes = np.concatenate([h for h, _ in pieces])
        ids = np.concatenate([i for _, i in pieces])
        a, b = close_pairs_in_table(hashes, mask, radius, ids)
        firsts.append(a)
        seconds.append(b)
    return unique_pairs(np.concatenate(firsts), np.concatenate(seconds))


def unique_pairs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if not len(a):
        return a.astype(np.int64), b.astype(np.int64)
    pairs = np.unique(np.stack([a, b], axis=1), axis=0)
    return pairs[:, 0], pairs[:, 1]

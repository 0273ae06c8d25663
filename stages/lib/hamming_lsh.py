"""Window LSH: Hamming-radius tables that sort the hashes themselves (issue 22).

A *group* is one random bit permutation `perm` of the 64 bits (bit i of a hash goes to bit
perm[i]) and a few *windows*: table (group, r) keys each hash by the top `bits` bits of
rotl(perm(hash), r), i.e. by `bits` of its original bits that are contiguous in the permuted
order. Permutation and rotation move bits without changing them, so the table is one sort of
the permuted, rotated hashes: equal keys are runs, and a candidate pair is verified by the
popcount of two *neighbouring* values (sequential reads; no positions, no random gathers).
Found values are mapped back through the inverse permutation, and to positions by a binary
search in the sorted distinct hashes.

Recall, exactly: for a pair at distance d the permutation sends its d differing bits to a
uniformly random d-subset of the 64 positions, so a group finds it with probability
q(d) = P(some window misses that subset) (inclusion-exclusion over the windows), and groups
are independent: recall(d) = 1 - (1 - q(d))^groups. One window per group is plain
bit-sampling, C(64-d, bits) / C(64, bits); windows that overlap little (a few per group) find
almost as many pairs as independent tables while sharing one permutation.
"""

from __future__ import annotations

import math
import sys
from functools import lru_cache
from itertools import combinations

import numpy as np

WORD = 64
ALL = (1 << WORD) - 1
LUT_BITS = 16  # the permutation is 4 lookups of 16-bit pieces in 512 KiB of tables
DENSE = 8  # offsets where more than 1/DENSE of the positions are live use whole-array passes


def rotl64(value: int, shift: int) -> int:
    shift %= WORD
    return ((value << shift) | (value >> (WORD - shift))) & ALL if shift else value


def window(rotation: int, bits: int) -> int:
    """The permuted-order bits that rotl(., rotation) moves into the top `bits`."""
    return rotl64(((1 << bits) - 1) << (WORD - bits), -rotation % WORD)


def window_mask(perm: tuple[int, ...], rotation: int, bits: int) -> int:
    """The same table as a mask of original bits (bit i is keyed iff perm[i] is in the window)."""
    keyed = window(rotation, bits)
    return sum(1 << i for i in range(WORD) if keyed >> perm[i] & 1)


@lru_cache(maxsize=4096)
def group_recall(distance: int, bits: int, rotations: tuple[int, ...]) -> float:
    """P(a uniformly random `distance`-subset of the 64 positions misses some window)."""
    if distance == 0:
        return 1.0
    windows = [window(r, bits) for r in rotations]
    total = 0
    for size in range(1, len(windows) + 1):
        for chosen in combinations(windows, size):
            union = 0
            for w in chosen:
                union |= w
            total += (-1) ** (size + 1) * math.comb(WORD - union.bit_count(), distance)
    return total / math.comb(WORD, distance)


def groups_needed(distance: int, bits: int, rotations: tuple[int, ...], recall: float) -> int:
    q = group_recall(distance, bits, rotations)
    if q >= 1.0:
        return 1
    if q <= 0.0:
        return sys.maxsize
    return max(1, math.ceil(math.log(1.0 - recall) / math.log(1.0 - q)))


def even_rotations(windows: int) -> tuple[int, ...]:
    return tuple(w * WORD // windows for w in range(windows))


# ---- the permutation on arrays ----------------------------------------------------------


@lru_cache(maxsize=8)
def permute_tables(perm: tuple[int, ...]) -> np.ndarray:
    """(4, 65536) uint64: table c maps a 16-bit piece c of a hash to its bits' new places."""
    values = np.arange(1 << LUT_BITS, dtype=np.uint64)
    tables = np.zeros((WORD // LUT_BITS, 1 << LUT_BITS), np.uint64)
    for src, dst in enumerate(perm):
        piece, bit = divmod(src, LUT_BITS)
        tables[piece] |= ((values >> np.uint64(bit)) & np.uint64(1)) << np.uint64(dst)
    tables.flags.writeable = False
    return tables


def inverse(perm: tuple[int, ...]) -> tuple[int, ...]:
    out = [0] * WORD
    for src, dst in enumerate(perm):
        out[dst] = src
    return tuple(out)


def permute(hashes: np.ndarray, perm: tuple[int, ...]) -> np.ndarray:
    """Bit i of each hash moved to bit perm[i]: four table lookups of 16-bit pieces."""
    tables = permute_tables(perm)
    pieces = np.ascontiguousarray(hashes, dtype="<u8").view("<u2").reshape(-1, 4)
    index = np.empty(len(hashes), np.intp)  # intp and mode="clip": numpy's fastest gather
    out, piece = np.empty(len(hashes), np.uint64), np.empty(len(hashes), np.uint64)
    for c in range(WORD // LUT_BITS):
        np.copyto(index, pieces[:, c])
        tables[c].take(index, out=out if c == 0 else piece, mode="clip")
        if c:
            np.bitwise_or(out, piece, out=out)
    return out


def rotl(values: np.ndarray, shift: int, out: np.ndarray, scratch: np.ndarray) -> np.ndarray:
    """out = values rotated left by `shift` (scratch: a buffer of the same size)."""
    shift %= WORD
    if not shift:
        np.copyto(out, values)
        return out
    np.right_shift(values, np.uint64(WORD - shift), out=scratch)
    np.left_shift(values, np.uint64(shift), out=out)  # out may be values itself
    return np.bitwise_or(out, scratch, out=out)


def unpermute(values: np.ndarray, perm: tuple[int, ...], rotation: int) -> np.ndarray:
    """The original hashes of rotated, permuted values (a few: found pairs)."""
    back = np.empty_like(values)
    rotl(values, -rotation, back, np.empty_like(values))
    return permute(back, inverse(perm))


# ---- one table over sorted values ----------------------------------------------------------


def sorted_window_pairs(
    y: np.ndarray, bits: int, radius: int, scratch: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Positions (i, j), i < j, in sorted `y` of every pair with equal top `bits` bits and
    popcount(y_i ^ y_j) <= radius. At offset s the pairs are those whose key run goes on s
    further: whole-array passes over y[s:] ^ y[:-s] while such runs are dense, then a
    shrinking list of run positions. `scratch`: an optional uint64 buffer as long as y."""
    n = len(y)
    if n < 2:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    z = scratch if scratch is not None else np.empty(n, np.uint64)
    counts, flags = np.empty(n, np.uint8), np.empty(n, bool)
    same = np.zeros(n, bool)  # same[i]: y[i], y[i+1] share the key (same[n-1] stays False)
    np.bitwise_xor(y[1:], y[:-1], out=z[: n - 1])
    if bits < WORD:
        np.less(z[: n - 1], np.uint64(1 << (WORD - bits)), out=same[: n - 1])
    else:
        np.equal(z[: n - 1], 0, out=same[: n - 1])
    cont = same.copy()  # cont[i] at offset s: y[i] .. y[i+s] share the key
    found, s, live = [], 1, np.empty(0, np.int64)
    while s < n:
        m = n - s
        if s > 1:
            np.logical_and(cont[:m], same[s - 1 : s - 1 + m], out=cont[:m])
            if np.count_nonzero(cont[:m]) * DENSE <= m:
                live = np.flatnonzero(cont[:m])  # sparse from here on
                break
            np.bitwise_xor(y[s:], y[:m], out=z[:m])
        np.bitwise_count(z[:m], out=counts[:m])
        np.less_equal(counts[:m], radius, out=flags[:m])
        hits = np.flatnonzero(flags[:m])
        found.append((hits[cont[hits]], s))
        s += 1
    found += sparse_offsets(y, same, radius, live, s)
    i = np.concatenate([f for f, _ in found]).astype(np.int64)
    return i, i + np.concatenate([np.full(len(f), k, np.int64) for f, k in found])


def sparse_offsets(
    y: np.ndarray, same: np.ndarray, radius: int, live: np.ndarray, s: int
) -> list[tuple[np.ndarray, int]]:
    """Offsets s, s+1, ... over the few positions whose key run still goes on (`live`, those
    whose run reaches s further): gathers instead of whole-array passes."""
    found = []
    while live.size:
        close = np.bitwise_count(y[live] ^ y[live + s]) <= radius
        found.append((live[close], s))
        live = live[same[live + s]]  # the run goes on one further
        s += 1
    return found


def first_found_here(x: np.ndarray, masks: tuple[int, ...], table: int) -> np.ndarray:
    """Per pair (x = a ^ b): is `table` the first of `masks` on whose bits it agrees? Each pair
    is then reported by exactly one table, whichever tables (or partitions) found it."""
    keep = (x & np.uint64(masks[table])) == 0
    alive, rest = np.flatnonzero(keep), x[keep]
    for mask in masks[:table]:
        if not alive.size:
            break
        earlier = (rest & np.uint64(mask)) == 0
        keep[alive[earlier]] = False
        alive, rest = alive[~earlier], rest[~earlier]
    return keep


def group_pairs(
    group: int,
    perm: tuple[int, ...],
    rotations: tuple[int, ...],
    bits: int,
    radius: int,
    masks: tuple[int, ...],
    hashes: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Every pair (a, b), a < b, of positions in `hashes` (sorted, distinct) that this group's
    tables report: one permutation, then per window a rotation, a sort and the scan."""
    permuted = permute(hashes, perm)
    y, scratch = np.empty_like(permuted), np.empty_like(permuted)
    firsts, seconds = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
    for w, rotation in enumerate(rotations):
        if w == len(rotations) - 1:
            y = permuted  # the last window rotates and sorts the permuted hashes in place
        rotl(permuted, rotation, y, scratch)
        y.sort()
        i, j = sorted_window_pairs(y, bits, radius, scratch)
        ha, hb = unpermute(y[i], perm, rotation), unpermute(y[j], perm, rotation)
        keep = first_found_here(ha ^ hb, masks, group * len(rotations) + w)
        a, b = np.searchsorted(hashes, ha[keep]), np.searchsorted(hashes, hb[keep])
        firsts.append(np.minimum(a, b))
        seconds.append(np.maximum(a, b))
    return np.concatenate(firsts), np.concatenate(seconds)


def rows_window_pairs(
    hashes: np.ndarray, perm: tuple[int, ...], rotation: int, bits: int, radius: int
) -> tuple[np.ndarray, np.ndarray]:
    """One table over rows in any order (a reduce's share): positions (a, b) of its pairs."""
    y = np.empty(len(hashes), np.uint64)
    rotl(permute(hashes, perm), rotation, y, np.empty_like(y))
    order = np.argsort(y, kind="stable")
    i, j = sorted_window_pairs(y[order], bits, radius)
    return order[i], order[j]

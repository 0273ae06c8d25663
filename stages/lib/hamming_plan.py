"""Which tables a Hamming-radius search uses (stages/lib/hamming.py says what a table is): the
exact pigeonhole plan or the window-LSH plan, chosen by a cost model measured on this kernel
(docs/benchmarks/dedupe.md, "Scaling: 1M, 4M and 10M synthetic signatures"): per table a pass
over n hashes plus the expected random candidates n^2 / 2^(bits+1)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations

import numpy as np
from mmcurate.stages.lib.hamming_lsh import (
    even_rotations,
    group_recall,
    groups_needed,
    window_mask,
)

# Relative costs, per hash per table unless said (one exact-kernel table over 10M ~ 0.5 s):
SORT_COST = 1.0  # exact kernel: pack a digest and position, sort, scan the runs


PAIR_COST = 4.0  # exact kernel: one random candidate (two random 8-byte reads)


WINDOW_COST = 0.55  # lsh: rotate, sort and scan the hashes themselves


WINDOW_PAIR_COST = 0.45  # lsh: one random candidate, checked on neighbouring values


PERMUTE_COST = 0.7  # lsh: one group's permutation (per hash)


EXACT_PREMIUM = 3.0  # auto takes the exact plan unless lsh is more than this many times cheaper


MAX_TABLES = 400  # exact plans


MAX_LSH_TABLES = 2000


MAX_WINDOWS = 8  # windows per permutation


@dataclass(frozen=True)
class TablePlan:
    mode: str  # "exact" or "lsh"
    radius: int
    masks: tuple[int, ...]  # every table, in order, as a mask of original bits
    bits: int  # masked bits per table (the smallest, for exact bands of unequal width)
    perms: tuple[tuple[int, ...], ...] = ()  # lsh: one bit permutation per group
    rotations: tuple[int, ...] = ()  # lsh: each group's windows

    def recall_at(self, distance: int) -> float:
        """Probability that a pair at `distance` shares at least one table."""
        if distance > self.radius:
            return 0.0  # verification drops every candidate beyond the radius
        if self.mode == "exact":
            return 1.0
        miss = 1.0 - group_recall(distance, self.bits, self.rotations)
        return 1.0 - miss ** len(self.perms)

    def describe(self) -> str:
        if self.mode == "lsh":
            return (
                f"lsh: {len(self.masks)} tables of {self.bits} bits "
                f"({len(self.perms)} permutations x {len(self.rotations)} windows)"
            )
        return f"{self.mode}: {len(self.masks)} tables of {self.bits}+ bits"

    def window_of(self, table: int) -> tuple[tuple[int, ...], int]:
        """(permutation, rotation) of an lsh table."""
        group, w = divmod(table, len(self.rotations))
        return self.perms[group], self.rotations[w]


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
    """Recall of `tables` independent bit-sampling tables (one window per permutation)."""
    if bits > 64 - distance:
        return 0.0
    agree = math.comb(64 - distance, bits) / math.comb(64, bits)
    return 1.0 - (1.0 - agree) ** tables


def plan_cost(n: int, masks: list[int] | tuple[int, ...]) -> float:
    """Exact kernel: per table one pass over n hashes plus the random candidate pairs."""
    pairs = sum(n * n / 2.0 / 2.0 ** mask.bit_count() for mask in masks)
    return len(masks) * n * SORT_COST + pairs * PAIR_COST


def lsh_cost(n: int, bits: int, windows: int, groups: int) -> float:
    per_table = n * WINDOW_COST + n * n / 2.0 / 2.0**bits * WINDOW_PAIR_COST
    return groups * (n * PERMUTE_COST + windows * per_table)


def plan_tables(n: int, radius: int, recall: float, mode: str = "auto", seed: int = 0) -> TablePlan:
    """The cheapest plan for n hashes: exact if `mode` says so, or in auto mode when exact costs
    no more than EXACT_PREMIUM times the best LSH plan (then nothing within the radius is
    ever missed)."""
    if not 0 <= radius <= 16:
        raise ValueError("radius must be between 0 and 16")
    exact = best_exact(n, radius)
    if mode == "exact" or radius == 0:
        return exact
    lsh = best_lsh(n, radius, recall, seed)
    if mode == "lsh":
        return lsh
    lsh_total = lsh_cost(n, lsh.bits, len(lsh.rotations), len(lsh.perms))
    return exact if plan_cost(n, exact.masks) <= EXACT_PREMIUM * lsh_total else lsh


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
    """Bits per key and windows per permutation of least cost; permutations from `seed`."""
    best: tuple[float, int, int, int] | None = None
    for bits in range(1, 64 - radius + 1):
        for windows in range(1, MAX_WINDOWS + 1):
            groups = groups_needed(radius, bits, even_rotations(windows), recall)
            if groups * windows > MAX_LSH_TABLES:
                continue
            cost = lsh_cost(n, bits, windows, groups)
            if best is None or cost < best[0]:
                best = (cost, bits, windows, groups)
    if best is None:
        raise ValueError(f"no LSH plan reaches recall {recall} at radius {radius}")
    _, bits, windows, groups = best
    rng = np.random.default_rng(seed)
    perms = tuple(tuple(int(b) for b in rng.permutation(64)) for _ in range(groups))
    rotations = even_rotations(windows)
    masks = tuple(window_mask(p, r, bits) for p in perms for r in rotations)
    return TablePlan("lsh", radius, masks, bits, perms, rotations)

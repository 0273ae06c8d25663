"""Window LSH (stages/lib/hamming_lsh.py): the permutation, the scan of one sorted table, the
exact recall formula, and pairs identical however the tables are split (no Ray here)."""

from itertools import combinations

import mmcurate.stages.near_dedupe as near_module
import numpy as np
import pytest
from mmcurate.core.mapreduce import LocalRunner
from mmcurate.stages.lib.hamming import brute_force_pairs, expand_pairs, unique_inverse
from mmcurate.stages.lib.hamming_lsh import (
    even_rotations,
    group_recall,
    permute,
    rotl,
    sorted_window_pairs,
    unpermute,
    window,
    window_mask,
)
from mmcurate.stages.lib.hamming_plan import lsh_recall, plan_tables
from mmcurate.stages.near_dedupe import close_pairs, near_groups


def random_hashes(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 2**64 - 1, size=n, dtype=np.uint64, endpoint=True)


def flip(value: int, bits) -> int:
    for bit in bits:
        value ^= 1 << int(bit)
    return value


def test_permute_moves_each_bit_and_round_trips():
    perm = tuple(int(b) for b in np.random.default_rng(0).permutation(64))
    for bit in range(64):
        assert int(permute(np.array([1 << bit], np.uint64), perm)[0]) == 1 << perm[bit]
    hashes = random_hashes(500, 1)
    moved = permute(hashes, perm)
    assert np.array_equal(np.bitwise_count(moved), np.bitwise_count(hashes))
    rotated = rotl(moved, 9, np.empty_like(moved), np.empty_like(moved))
    assert np.array_equal(unpermute(rotated, perm, 9), hashes)


@pytest.mark.parametrize("rotation", [0, 7, 50])
def test_window_key_is_the_masked_original_bits(rotation):
    perm = tuple(int(b) for b in np.random.default_rng(2).permutation(64))
    hashes = random_hashes(2000, 3)
    y = rotl(permute(hashes, perm), rotation, np.empty_like(hashes), np.empty_like(hashes))
    key = (y >> np.uint64(64 - 6)).tolist()
    masked = (hashes & np.uint64(window_mask(perm, rotation, 6))).tolist()
    assert window_mask(perm, rotation, 6).bit_count() == 6
    assert len(set(key)) == len(set(masked)) == len(set(zip(key, masked, strict=True))) == 64


def test_scan_of_a_sorted_table_finds_exactly_the_keyed_pairs_within_radius():
    rng = np.random.default_rng(4)
    for bits, keep in [(1, 0xF00000000000FFFF), (3, 0xF00000000000FFFF), (12, 2**64 - 1)]:
        for n in (0, 1, 2, 3, 300):
            y = np.sort(random_hashes(n, int(rng.integers(1 << 30))) & np.uint64(keep))
            for radius in (0, 4, 30):
                i, j = sorted_window_pairs(y, bits, radius)
                expected = {
                    (a, b)
                    for a, b in combinations(range(n), 2)
                    if int(y[a]) >> (64 - bits) == int(y[b]) >> (64 - bits)
                    and (int(y[a]) ^ int(y[b])).bit_count() <= radius
                }
                assert set(zip(i.tolist(), j.tolist(), strict=True)) == expected


@pytest.mark.parametrize("windows", [1, 3, 5])
def test_group_recall_is_exact_over_every_set_of_differing_bits(windows):
    rotations = even_rotations(windows)
    sets = [window(r, 20) for r in rotations]
    for distance in (1, 2, 3):
        missed = sum(
            any(all(not w >> bit & 1 for bit in chosen) for w in sets)
            for chosen in combinations(range(64), distance)
        )
        total = len(list(combinations(range(64), distance)))
        assert group_recall(distance, 20, rotations) == pytest.approx(missed / total, abs=1e-12)
    assert group_recall(8, 20, (0,)) == pytest.approx(lsh_recall(8, 20, 1))


def test_lsh_plan_recall_is_planned_at_the_radius_and_higher_below():
    plan = plan_tables(10_000_000, 8, 0.99, mode="lsh")
    assert plan.recall_at(8) >= 0.99 and plan.recall_at(9) == 0.0
    assert plan.recall_at(4) > plan.recall_at(8)
    assert len(plan.masks) == len(plan.perms) * len(plan.rotations)
    assert all(mask.bit_count() == plan.bits for mask in plan.masks)
    assert plan_tables(10_000_000, 4, 0.99).mode == "exact"


def planted(n: int, radius: int, seed: int) -> np.ndarray:
    """Every third hash a copy of the one before at 0..radius bits; every 7th repeated."""
    rng = np.random.default_rng(seed)
    hashes = random_hashes(n, seed)
    for i in range(1, n, 3):
        hashes[i] = flip(int(hashes[i - 1]), rng.choice(64, int(rng.integers(radius + 1)), False))
    hashes[7::7] = hashes[3::7][: len(hashes[7::7])]
    return hashes


@pytest.mark.parametrize("radius", [6, 8])
def test_lsh_pairs_identical_across_task_splits_and_never_beyond_radius(radius, monkeypatch):
    hashes = planted(1500, radius, seed=radius)
    plan = plan_tables(len(hashes), radius, 0.99, mode="lsh", seed=5)
    whole = close_pairs(hashes, plan, LocalRunner())
    truth = brute_force_pairs(hashes, radius)
    found = set(zip(whole[0].tolist(), whole[1].tolist(), strict=True))
    assert found <= truth and len(found) >= 0.97 * len(truth)
    shuffled = np.random.default_rng(6).permutation(len(hashes))
    again = close_pairs(hashes[shuffled], plan, LocalRunner())
    moved = {
        tuple(sorted((int(shuffled[a]), int(shuffled[b])))) for a, b in zip(*again, strict=True)
    }
    assert moved == found  # row order does not change what is found
    monkeypatch.setattr(near_module, "REDUCE_BYTES", 4096)  # route across reduces
    for wave_bytes in (1 << 15, 1 << 20):
        routed = close_pairs(hashes, plan, LocalRunner(), wave_bytes=wave_bytes)
        assert np.array_equal(routed[0], whole[0]) and np.array_equal(routed[1], whole[1])


def test_rows_of_one_hash_pair_with_each_other_and_with_its_partners():
    hashes = np.array([5, 9, 5, 7, 9, 5], np.uint64)
    inverse, unique = unique_inverse(hashes)
    assert unique.tolist() == [5, 7, 9] and np.array_equal(unique[inverse], hashes)
    a, b = expand_pairs(np.array([0]), np.array([1]), inverse)  # 5 ~ 7
    pairs = set(zip(a.tolist(), b.tolist(), strict=True))
    assert pairs == {(0, 2), (0, 5), (2, 5), (1, 4), (0, 3), (2, 3), (3, 5)}


def test_near_groups_label_each_component_by_its_smallest_distinct_hash():
    hashes = np.array([0b1111, 0b0111, 0b0011, 1 << 40, 0b1111, (1 << 40) | 1, 1 << 50], np.uint64)
    plan = plan_tables(len(hashes), 1, 0.99, mode="exact")
    labels = near_groups(hashes, plan, LocalRunner())
    # 0b0011 ~ 0b0111 ~ 0b1111 (a chain), 1<<40 ~ (1<<40)|1; 1<<50 alone
    assert labels[0] == labels[1] == labels[2] == labels[4]
    assert labels[3] == labels[5] != labels[0] and labels[6] not in (labels[0], labels[3])
    _, unique = unique_inverse(hashes)
    assert unique[labels[0]] == 0b0011 and unique[labels[3]] == 1 << 40

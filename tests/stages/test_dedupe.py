"""Dedupe: Hamming tables, the keep policy, near/exact/semantic decisions (no Ray here)."""

import io
import tracemalloc
from itertools import combinations

import mmcurate.stages.exact_dedupe as exact_module
import mmcurate.stages.near_dedupe as near_module
import numpy as np
import pyarrow as pa
import pytest
from mmcurate.core.mapreduce import LocalRunner
from mmcurate.pipeline.demo_data import source_photo
from mmcurate.stages.base import DROP
from mmcurate.stages.lib.dedupe_common import keepers, priority_rank
from mmcurate.stages.lib.hamming import brute_force_pairs, equal_key_pairs, unique_inverse
from mmcurate.stages.lib.hamming_plan import band_masks, exact_masks, lsh_recall, plan_tables
from mmcurate.stages.lib.image_hash import hamming, image_hash
from mmcurate.stages.lib.semdedup import brute_force_keep, greedy_keep, normalize, reduce_clusters
from mmcurate.stages.near_dedupe import close_pairs
from mmcurate.stages.registry import build_stage
from PIL import Image, ImageEnhance

from tests.kit_stages import batch_of


def planted_hashes(n: int, radius: int, seed: int) -> np.ndarray:
    """n random hashes where every third one is a copy of the one before at 0..radius bits."""
    rng = np.random.default_rng(seed)
    hashes = rng.integers(0, 2**64 - 1, size=n, dtype=np.uint64, endpoint=True)
    for i in range(1, n, 3):
        value = int(hashes[i - 1])
        for bit in rng.choice(64, size=int(rng.integers(0, radius + 1)), replace=False):
            value ^= 1 << int(bit)
        hashes[i] = value
    return hashes


def pairs_of(found: tuple[np.ndarray, np.ndarray]) -> set[tuple[int, int]]:
    return set(zip(found[0].tolist(), found[1].tolist(), strict=True))


# ---- Hamming tables ------------------------------------------------------------------------


@pytest.mark.parametrize("radius", [0, 1, 3, 4, 6])
def test_exact_plan_finds_exactly_the_pairs_within_radius(radius):
    hashes = planted_hashes(1500, radius, seed=radius)
    plan = plan_tables(len(hashes), radius, 0.99, mode="exact")
    assert pairs_of(close_pairs(hashes, plan, LocalRunner())) == brute_force_pairs(hashes, radius)


def test_exact_masks_leave_some_table_untouched_by_any_r_bits():
    rng = np.random.default_rng(0)
    for radius, bands in [(2, 4), (4, 6), (4, 7), (5, 8)]:
        masks = exact_masks(radius, bands)
        assert len(masks) == len(list(combinations(range(bands), radius)))
        for _ in range(500):
            flipped = 0
            for bit in rng.choice(64, size=radius, replace=False):
                flipped |= 1 << int(bit)
            assert any(mask & flipped == 0 for mask in masks)
    assert sum(m.bit_count() for m in band_masks(6)) == 64


def test_lsh_plan_meets_its_predicted_recall_at_the_radius():
    rng = np.random.default_rng(1)
    plan = plan_tables(4000, 6, 0.95, mode="lsh", seed=3)
    assert plan.mode == "lsh" and plan.recall_at(6) >= 0.95
    base = rng.integers(0, 2**64 - 1, size=4000, dtype=np.uint64, endpoint=True)
    hashes = base.copy()
    for i in range(1, 4000, 2):  # pairs at exactly distance 6
        value = int(base[i - 1])
        for bit in rng.choice(64, size=6, replace=False):
            value ^= 1 << int(bit)
        hashes[i] = value
    found = pairs_of(close_pairs(hashes, plan, LocalRunner()))
    recall = sum((i - 1, i) in found for i in range(1, 4000, 2)) / 2000
    assert abs(recall - plan.recall_at(6)) < 0.03
    assert found <= brute_force_pairs(hashes, 6)  # never a pair beyond the radius
    assert plan.recall_at(6) >= lsh_recall(6, plan.bits, len(plan.perms))  # one window each


def test_auto_plan_is_exact_at_radius_4_and_lsh_for_wide_radius():
    assert plan_tables(10_000_000, 4, 0.99).mode == "exact"
    assert plan_tables(1_000_000, 12, 0.99).mode == "lsh"


def test_hash_partitioned_path_matches_brute_force(monkeypatch):
    monkeypatch.setattr(near_module, "REDUCE_BYTES", 4096)  # force routing across reduces
    hashes = planted_hashes(2000, 4, seed=9)
    plan = plan_tables(len(hashes), 4, 0.99, mode="exact")
    found = close_pairs(hashes, plan, LocalRunner(), wave_bytes=1 << 16)  # several waves
    assert pairs_of(found) == brute_force_pairs(hashes, 4)


def test_equal_key_pairs_enumerates_one_large_run():
    keys = np.array([1] * 300 + [2] + [3] * 4, dtype=np.uint64)
    pairs = {(int(a), int(b)) for i, j in equal_key_pairs(keys) for a, b in zip(i, j, strict=True)}
    expected = set(combinations(range(300), 2)) | set(combinations(range(301, 305), 2))
    assert pairs == expected


def test_unique_inverse_round_trips():
    rng = np.random.default_rng(2)
    hashes = rng.integers(0, 50, size=5000).astype(np.uint64)
    inverse, unique = unique_inverse(hashes)
    assert np.array_equal(unique[inverse], hashes)
    assert sorted(unique.tolist()) == sorted(set(hashes.tolist()))


# ---- keep policy -----------------------------------------------------------------------------


def test_keep_policy_score_then_resolution_then_key():
    table = pa.table(
        {
            "__key__": ["d", "c", "b", "a", "e", "f"],
            "clip_score": [0.1, 0.3, 0.3, None, 0.2, 0.2],
            "width": [10, 10, 20, 99, 10, 10],
            "height": [10, 10, 10, 99, 10, 10],
        }
    )
    rank = priority_rank(table)
    assert [table["__key__"][int(i)].as_py() for i in np.argsort(rank)] == list("bcefda")
    labels = np.array([0, 0, 0, 0, 1, 1])
    assert keepers(labels, rank).tolist() == [2, 2, 2, 2, 4, 4]


# ---- near_dedupe on real photos --------------------------------------------------------------


def encode(image: Image.Image, fmt: str = "JPEG", **save) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **save)
    return out.getvalue()


def photo(name: str) -> Image.Image:
    return source_photo(name).convert("RGB").resize((256, 256))


def variants(image: Image.Image) -> dict[str, bytes]:
    """The injected near-duplicates of the dedupe bench, one of each kind."""
    w, h = image.size
    return {
        "requality": encode(image, quality=55),
        "resized": encode(image.resize((int(w * 0.6), int(h * 0.6)))),
        "cropped": encode(image.crop((4, 4, w - 4, h - 4))),
        "brighter": encode(ImageEnhance.Brightness(image).enhance(1.08)),
        "png": encode(image, "PNG"),
    }


def test_phash_is_close_for_variants_and_far_for_other_photos():
    base = photo("astronaut")
    reference, _ = image_hash(encode(base, quality=95))
    for kind, data in variants(base).items():
        assert hamming(image_hash(data)[0], reference) <= (8 if kind == "cropped" else 4), kind
    for other in ("coffee", "rocket", "chelsea", "brick"):
        assert hamming(image_hash(encode(photo(other)))[0], reference) > 10
    dhash, size = image_hash(encode(base), "dhash")
    assert 0 <= dhash < 2**64 and size == (256, 256)


def signatures_from(batch: dict) -> pa.Table:
    rows = {
        "__key__": batch["__key__"],
        DROP: batch[DROP],
        "phash": pa.array(batch["phash"], pa.uint64()),
        "width": batch["width"],
        "height": batch["height"],
    }
    return pa.table(rows)


def test_near_dedupe_groups_variants_and_keeps_the_largest():
    images, keys = [], []
    for name in ("astronaut", "coffee", "rocket"):
        base = photo(name)
        images.append(encode(base, quality=95))
        keys.append(f"{name}-0-original")
        for kind, data in variants(base).items():
            images.append(data)
            keys.append(f"{name}-1-{kind}")
    images.append(b"not an image")
    keys.append("zz-broken")
    stage = build_stage({"name": "near_dedupe", "radius": 8})  # crops need 8 (BENCHMARKS.md)
    batch = batch_of(images)
    batch["__key__"] = keys
    out = stage(batch)
    assert out[DROP][-1] == "decode_error"
    decided = stage.decide(signatures_from(out))
    expected = {}
    for name in ("astronaut", "coffee", "rocket"):
        # the crop is 248 px (smaller); the others tie at 256 px and the smallest key wins
        for kind in ("requality", "resized", "cropped", "brighter", "png"):
            expected[f"{name}-1-{kind}"] = ("duplicate_near", f"{name}-0-original")
    assert decided == expected


def test_near_dedupe_prefers_original_size_from_json():
    stage = build_stage({"name": "near_dedupe"})
    batch = batch_of([encode(photo("coins")), encode(photo("coins"), quality=70)])
    batch["json"] = [None, '{"original_width": 2000, "original_height": 1000}']
    out = stage(batch)
    assert (out["width"], out["height"]) == ([256, 2000], [256, 1000])
    assert stage.decide(signatures_from(out)) == {"k000": ("duplicate_near", "k001")}


# ---- exact_dedupe --------------------------------------------------------------------------


def test_exact_dedupe_of_pixels_matches_across_encoders(monkeypatch):
    image = photo("chelsea")
    batch = batch_of([encode(image, "PNG"), encode(image, "BMP"), encode(photo("moon"), "PNG")])
    by_bytes = build_stage({"name": "exact_dedupe"})(batch_of(batch["jpg"]))
    assert len(set(by_bytes["sha256"])) == 3
    stage = build_stage({"name": "exact_dedupe", "of": "pixels"})
    out = stage(batch)
    monkeypatch.setattr(exact_module, "partitions_for", lambda *_: 4)  # route across 4 reduces
    table = pa.table({"__key__": out["__key__"], DROP: out[DROP], "sha256": out["sha256"]})
    assert stage.decide(table) == {"k001": ("duplicate_exact", "k000")}


def test_exact_dedupe_partitions_agree_with_one(monkeypatch):
    rng = np.random.default_rng(3)
    digests = [f"{int(v):064x}" for v in rng.integers(0, 40, size=400)]
    keys = [f"s{i:04d}" for i in rng.permutation(400)]
    table = pa.table({"__key__": keys, DROP: [None] * 400, "sha256": digests})
    stage = build_stage({"name": "exact_dedupe"})
    one = stage.decide(table)
    monkeypatch.setattr(exact_module, "partitions_for", lambda *_: 7)
    assert stage.decide(table) == one
    assert len(one) == 400 - len(set(digests))
    for key, (_, kept) in one.items():
        assert kept < key and digests[keys.index(kept)] == digests[keys.index(key)]


# ---- semantic dedupe -----------------------------------------------------------------------


def unit(*coords: float, dim: int = 8) -> np.ndarray:
    v = np.zeros(dim, np.float32)
    v[: len(coords)] = coords
    return v / np.linalg.norm(v)


def at_cosine(cos: float, axis: int, dim: int = 8) -> np.ndarray:
    """A unit vector at cosine `cos` to e0, leaning toward axis `axis`."""
    v = np.zeros(dim, np.float32)
    v[0], v[axis] = cos, np.sqrt(1 - cos * cos)
    return v


def test_eps_rule_only_kept_items_suppress():
    eps = 0.05  # drop at cosine >= 0.95 to a kept item
    angle = np.arccos(0.96)
    a = unit(1.0)
    b = unit(np.cos(angle), np.sin(angle))  # 0.96 to a: dropped
    c = unit(np.cos(2 * angle), np.sin(2 * angle))  # 0.96 to b, 0.84 to a: b is not kept -> kept
    d = at_cosine(0.949, axis=3)  # just under the threshold to a: kept
    e = at_cosine(0.951, axis=4)  # just over: dropped, by a
    x = np.stack([a, b, c, d, e])
    expected = [-1, 0, -1, -1, 0]
    assert greedy_keep(x, eps).tolist() == expected
    assert greedy_keep(x, eps, block=2).tolist() == expected
    assert brute_force_keep(x, eps).tolist() == expected


def planted_clusters(clusters: int, per: int, dim: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centers = np.linalg.qr(rng.normal(size=(dim, dim)))[0][:clusters]  # orthogonal centers
    rows = []
    for center in centers:
        spread = rng.uniform(0.05, 0.6, size=(per, 1))  # from near-copies to loose members
        rows.append(center + spread * rng.normal(size=(per, dim)) / np.sqrt(dim))
    return normalize(np.concatenate(rows))


@pytest.mark.parametrize("block", [3, 16, 2048])
def test_greedy_blocks_match_the_brute_force_rule(block):
    x = planted_clusters(3, 60, 16, seed=block)
    assert np.array_equal(greedy_keep(x, 0.1, block=block), brute_force_keep(x, 0.1))


def test_semantic_decide_on_planted_clusters_applies_the_rule():
    x = planted_clusters(5, 80, 32, seed=11)
    order = np.random.default_rng(12).permutation(len(x))  # keys in a shuffled order
    keys = [f"s{i:04d}" for i in order]
    table = pa.table(
        {
            "__key__": keys,
            DROP: [None] * len(x),
            "embedding": pa.array(list(x), pa.list_(pa.float32())),
        }
    )
    stage = build_stage({"name": "semantic_dedupe", "eps": 0.1, "clusters": 5})
    decided = stage.decide(table)
    by_key = np.argsort(keys)  # priority: smallest key first
    reference = brute_force_keep(x[by_key], 0.1)
    expected = {
        keys[by_key[i]]: ("duplicate_semantic", keys[by_key[k]])
        for i, k in enumerate(reference)
        if k >= 0
    }
    assert decided == expected and 0 < len(decided) < len(x)


def test_one_50k_cluster_stays_within_bounded_memory():
    rng = np.random.default_rng(5)
    x = normalize(rng.normal(size=(50_000, 32)))
    x[1::10] = x[::10]  # every tenth item repeated right after: 5,000 certain drops
    payload = (np.arange(len(x)), np.zeros(len(x), np.int64), np.arange(len(x)), x)
    tracemalloc.start()
    dropped, kept = reduce_clusters([payload], eps=0.02)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 200 * 2**20  # an n x n float32 matrix would need 10 GB
    assert len(dropped) >= 5000
    assert set(range(1, 50_000, 10)) <= set(dropped.tolist())
    for d, k in zip(dropped[:500], kept[:500], strict=True):
        assert k < d and float(x[d] @ x[k]) >= 0.98


def test_semantic_dedupe_embeds_with_a_tiny_model_and_reuses_embeddings():
    stage = build_stage(
        {"name": "semantic_dedupe", "model": "mmcurate-tiny", "pretrained": None, "device": "cpu"}
    )
    out = stage(batch_of([encode(photo("astronaut")), b"broken bytes", encode(photo("coffee"))]))
    assert out[DROP] == [None, "decode_error", None]
    first = out["embedding"][0]
    assert first.shape == (64,) and abs(float(np.linalg.norm(first)) - 1) < 1e-5
    given = unit(1.0, dim=64)
    batch = batch_of([encode(photo("rocket"))])
    batch["embedding"] = [given]
    assert np.array_equal(stage(batch)["embedding"][0], given)

"""The bucketed loader (trainer/data/buckets.py) on a real aspect_buckets build of real photos:
batches of one bucket each, every kept sample once per epoch on 1 and 2 ranks, short
remainders, equal batches per rank, exact mid-epoch resume, and its config's one-line errors."""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from mmcurate.core.config_io import ConfigError, validate
from mmcurate.trainer.config import DataConfig, TrainConfig
from mmcurate.trainer.data.bucket_plan import NO_BUCKET, TooFewSamples, plan_epoch
from mmcurate.trainer.data.buckets import BucketMetadataError, bucketed_loader, loader_from_config
from mmcurate.trainer.data.manifest import read_manifest

BUCKETS = ["64x64", "96x64", "64x96", "128x64", "64x128"]
# (width, height) of the source images -> how many: buckets of 12, 9, 6, 2 and 1 samples
SHAPES = {(100, 100): 12, (150, 100): 9, (100, 150): 6, (200, 100): 2, (100, 200): 1}
PHOTOS = ["astronaut", "chelsea", "coffee", "rocket", "camera"]
BATCH = 4


def photo(name: str, width: int, height: int) -> bytes:
    """A real photo cropped to the aspect ratio and resized to (width, height)."""
    from mmcurate.pipeline.demo_data import source_photo

    image = source_photo(name).convert("RGB")
    side_w, side_h = image.size
    scale = min(side_w / width, side_h / height)
    box = (0, 0, int(width * scale), int(height * scale))
    out = io.BytesIO()
    image.crop(box).resize((width, height)).save(out, "JPEG", quality=85)
    return out.getvalue()


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, tuple[int, int]]]:
    """(manifest path, original (width, height) of each key) of a real build."""
    from mmcurate.pipeline.build import run_build
    from mmcurate.pipeline.config import BuildConfig

    root = tmp_path_factory.mktemp("buckets")
    folder = root / "in"
    folder.mkdir()
    sizes, i = {}, 0
    for (width, height), count in SHAPES.items():
        for _ in range(count):
            (folder / f"p{i:02d}.jpg").write_bytes(photo(PHOTOS[i % 5], width, height))
            (folder / f"p{i:02d}.txt").write_text(f"photo {i}")
            sizes[f"p{i:02d}"], i = (width, height), i + 1
    cfg = BuildConfig.model_validate(
        {
            "source": {"kind": "images", "path": str(folder)},
            "stages": [{"name": "aspect_buckets", "buckets": BUCKETS}],
            "output": {"path": str(root / "out"), "shard_max_samples": 7},
            "ray": {"runtime": "local", "num_cpus": 1},
        }
    )
    manifest = run_build(cfg, progress=False)
    assert manifest["samples"] == 30 and len(manifest["shards"]) >= 4
    return root / "out" / "manifest.json", sizes


def keys_of_bucket(manifest: Path) -> dict[str, str]:
    """key -> bucket, as the build's metadata parquets say."""
    table = pq.read_table([str(p) for p in sorted(manifest.parent.glob("shard-*.parquet"))])
    keys, buckets = table.column("key").to_pylist(), table.column("bucket").to_pylist()
    return dict(zip(keys, buckets, strict=True))


def drain(loader) -> list:
    return [(b.keys, tuple(b.images.shape), b.texts, b.conditions.tolist()) for b in loader]


def test_every_batch_is_one_bucket_and_every_sample_comes_once(build):
    manifest, sizes = build
    buckets = keys_of_bucket(manifest)
    loader = bucketed_loader(str(manifest), BATCH, workers=2, seed=3)
    assert loader.buckets == ("64x64", "64x96", "64x128", "96x64", "128x64")
    batches = drain(loader)
    assert len(batches) == len(loader) == 10  # 3 + 3 + 2 + 1 + 1: no remainder dropped
    seen = []
    for keys, shape, texts, conditions in batches:
        (bucket,) = {buckets[k] for k in keys}  # one bucket per batch ...
        width, height = map(int, bucket.split("x"))
        assert shape == (len(keys), 3, height, width)  # ... stacked at its size
        assert texts == [f"photo {int(k[1:])}" for k in keys]
        for key, row in zip(keys, conditions, strict=True):
            original = sizes[key]
            assert row[:2] == [original[1], original[0]] and row[4:] == [height, width]
        seen += keys
    assert sorted(seen) == sorted(sizes)  # every kept sample exactly once


def test_a_bucket_smaller_than_the_batch_is_one_short_batch(build):
    manifest, _ = build
    buckets = keys_of_bucket(manifest)
    per_bucket: dict[str, list[int]] = {}
    for keys, *_ in drain(bucketed_loader(str(manifest), BATCH, workers=0)):
        per_bucket.setdefault(buckets[keys[0]], []).append(len(keys))
    # full batches, then the remainder; the 1-sample and 2-sample buckets are one short batch
    assert {b: sorted(n, reverse=True) for b, n in per_bucket.items()} == {
        "64x64": [4, 4, 4],
        "96x64": [4, 4, 1],
        "64x96": [4, 2],
        "128x64": [2],
        "64x128": [1],
    }


def test_two_ranks_cover_the_epoch_once_with_equal_batches(build, tmp_path):
    manifest, sizes = build
    cache = (str(tmp_path / "cache"), 10**9)  # through the node's shard cache
    ranks = [
        drain(bucketed_loader(str(manifest), BATCH, rank=r, world=2, workers=1, cache=cache))
        for r in range(2)
    ]
    assert len(ranks[0]) == len(ranks[1]) == 5
    keys = [k for rank in ranks for batch in rank for k in batch[0]]
    assert sorted(keys) == sorted(sizes)
    # 3 ranks and 2 batches a step: 10 batches become 12 (the largest split), still once each
    counts = []
    for rank in range(3):
        loader = bucketed_loader(
            str(manifest), BATCH, rank=rank, world=3, workers=0, step_batches=2
        )
        batches = drain(loader)
        counts.append(len(batches))
        keys += [k for batch in batches for k in batch[0]]
    assert counts == [4, 4, 4]
    assert Counter(keys) == Counter({key: 2 for key in sizes})


def test_a_resume_mid_epoch_yields_exactly_the_rest(build):
    manifest, _ = build
    full = bucketed_loader(str(manifest), BATCH, rank=1, world=2, workers=2, seed=7)
    full.set_epoch(0, epochs=2)
    whole = [batch[0] for batch in drain(full)]
    assert len(whole) == 10  # two epochs of 5
    for consumed in (1, 3):
        resumed = bucketed_loader(str(manifest), BATCH, rank=1, world=2, workers=2, seed=7)
        resumed.resume_at(0, consumed)
        resumed.set_epoch(0, epochs=2)
        assert [batch[0] for batch in drain(resumed)] == whole[consumed:]


def test_the_plan_is_seeded_and_interleaves_buckets_by_share():
    labels = np.array([0] * 400 + [1] * 100 + [NO_BUCKET] * 7, dtype=np.int16)
    rng = np.random.default_rng(0)
    labels = labels[rng.permutation(len(labels))]
    plan = plan_epoch(labels, 10, seed=1, epoch=0, shuffle_buffer=50)
    assert plan.unlabelled == 7 and len(plan) == 50
    again = plan_epoch(labels, 10, seed=1, epoch=0, shuffle_buffer=50)
    assert np.array_equal(plan.order, again.order) and np.array_equal(plan.bucket, again.bucket)
    other = plan_epoch(labels, 10, seed=1, epoch=1, shuffle_buffer=50)
    assert not np.array_equal(plan.order, other.order)
    # every fifth batch or so is bucket 1: each tenth of the epoch holds 1 or 2 of its 10
    per_tenth = [int((plan.bucket[i : i + 5] == 1).sum()) for i in range(0, 50, 5)]
    assert sum(per_tenth) == 10 and max(per_tenth) <= 2
    assert sorted(plan.order.tolist()) == np.flatnonzero(labels != NO_BUCKET).tolist()
    for k in range(len(plan)):
        assert set(labels[plan.batch(k)].tolist()) == {plan.bucket[k]}


def test_too_few_samples_for_the_world_fail_in_one_line():
    with pytest.raises(TooFewSamples) as err:
        plan_epoch(np.array([0, 0, 1], dtype=np.int16), 4, seed=0, epoch=0, world=4)
    assert "3 samples" in str(err.value) and "\n" not in str(err.value)


def test_a_build_without_buckets_fails_in_one_line(tar_shards):
    folder = tar_shards(n_shards=1, per_shard=3)
    shard = sorted(folder.glob("shard-*.tar"))[0]
    table = pa.table({"key": ["a", "b", "c"], "caption": ["x", "y", "z"]})
    pq.write_table(table, shard.with_suffix(".parquet"))
    manifest = {
        "format": "mmcurate/1",
        "samples": 3,
        "shards": [{"name": shard.name, "samples": 3, "bytes": 1, "sha256": "0"}],
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BucketMetadataError) as err:
        bucketed_loader(str(folder / "manifest.json"), 2, workers=0)
    assert "no bucket column: build with the aspect_buckets stage" in str(err.value)
    assert "\n" not in str(err.value)


def test_config_selects_the_loader_and_mmcurate_train_refuses_it(build):
    manifest, sizes = build
    data = DataConfig(manifest=str(manifest), batching="bucketed", batch_size=8, workers=0)
    loader = loader_from_config(data, rank=0, world=2)
    assert sum(len(b[0]) for b in drain(loader)) + sum(
        len(b[0]) for b in drain(loader_from_config(data, rank=1, world=2))
    ) == len(sizes)
    assert read_manifest(str(manifest)).samples == len(sizes)
    with pytest.raises(ConfigError) as err:
        tree = {"data": {"manifest": str(manifest), "batching": "bucketed"}, "run": {"output": "o"}}
        validate(TrainConfig, tree)
    assert str(err.value).startswith("data: batching: bucketed is for SD-style training")
    assert "\n" not in str(err.value)


def test_a_weighted_mix_plans_from_the_same_metadata(build):
    manifest, sizes = build
    source = read_manifest(str(manifest))
    loader = bucketed_loader([(source, 1.0), (source, 0.5)], BATCH, world=2, workers=0)
    keys = Counter(k for batch in drain(loader) for k in batch[0])
    other = bucketed_loader([(source, 1.0), (source, 0.5)], BATCH, rank=1, world=2, workers=0)
    keys.update(k for batch in drain(other) for k in batch[0])
    assert set(keys) == set(sizes) and sum(keys.values()) == 30 + 15  # 0.5: half the samples
    assert set(keys.values()) <= {1, 2}


def test_an_image_off_its_bucket_is_replaced_and_counted(build):
    manifest, _ = build
    dataset = bucketed_loader(str(manifest), BATCH, workers=0).dataset
    dataset.want = (64, 64)
    right = {"__key__": "a", "jpg": photo("coffee", 64, 64), "txt": b"a"}
    wrong = {"__key__": "b", "jpg": photo("coffee", 96, 64), "txt": b"b"}
    batch = dataset.collate([(0, right), (1, wrong)], None, 0)
    assert tuple(batch.images.shape) == (2, 3, 64, 64) and dataset.off_bucket == 1
    assert batch.used == ["a", "a"] and batch.texts == ["a", "a"]

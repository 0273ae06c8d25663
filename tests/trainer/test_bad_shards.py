"""Unusable shards: bytes that differ from the manifest (a flipped byte, truncated, another
shard's bytes), an object that is gone, a tar that is not one. Streamed or through the cache,
such a shard is skipped with a count and a log line, training goes on with equal steps on
every rank and an exact resume, and only a dataset with no usable sample at all stops it,
with one line. Real shards, real SeaweedFS, real loader workers."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import fsspec
import pytest
import torch
import yaml
from mmcurate.trainer.cli import main
from mmcurate.trainer.config import TrainConfig
from mmcurate.trainer.data.batch import Batch
from mmcurate.trainer.data.cache import ShardCache
from mmcurate.trainer.data.dataset import ImageTransform, ShardDataset, make_loader
from mmcurate.trainer.data.manifest import NoUsableData, read_manifest
from mmcurate.trainer.data.plan import WeightedManifest, epoch_pieces
from mmcurate.trainer.models import build_model
from mmcurate.trainer.train import train

from tests.kit_shards import write_uneven_shards
from tests.kit_trainer import printed_summaries, run_torchrun

REPO = Path(__file__).resolve().parents[2]

SIZES = (40, 24, 56)  # 120 samples: 7 batches of 16 (8 left over)
SEED = 4
DAMAGES = ["flipped", "truncated", "substituted", "gone", "not_a_tar"]


@pytest.fixture(scope="module")
def tiny_transform():
    cfg = TrainConfig.model_validate({"data": {"manifest": "x"}, "run": {"output": "x"}})
    _, preprocess, tokenizer = build_model(cfg.model, torch.device("cpu"))
    return ImageTransform(preprocess), tokenizer


def first_shard(sizes: tuple[int, ...] = SIZES, seed: int = SEED) -> int:
    """The shard epoch 0 reads first: its samples fill the epoch's first batches."""
    return epoch_pieces([WeightedManifest(tuple(range(len(sizes))), sizes)], seed, 0)[0].shard


def make_shards(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return write_uneven_shards(folder, SIZES)


def keys_of(shard: int, sizes: tuple[int, ...] = SIZES) -> set[str]:
    start = sum(sizes[:shard])
    return {f"k{i:06d}" for i in range(start, start + sizes[shard])}


def damage(folder: Path, shard: int, how: str) -> None:
    """Damage shard-<shard>.tar in place; `not_a_tar` also makes the manifest describe the
    damaged bytes (a build that wrote garbage), so only the tar reader can tell."""
    path = folder / f"shard-{shard:06d}.tar"
    data = path.read_bytes()
    if how == "gone":
        path.unlink()
        return
    if how == "flipped":  # in a member's data: without a check, its sample would still load
        middle = len(data) // 2
        data = data[:middle] + bytes([data[middle] ^ 0x55]) + data[middle + 1 :]
    elif how == "truncated":
        data = data[: len(data) // 2]
    elif how == "substituted":
        data = (folder / f"shard-{(shard + 1) % len(SIZES):06d}.tar").read_bytes()
    elif how == "not_a_tar":
        data = os.urandom(len(data))
        doc = json.loads((folder / "manifest.json").read_text())
        doc["shards"][shard] |= {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        (folder / "manifest.json").write_text(json.dumps(doc))
    path.write_bytes(data)


def upload(s3, bucket: str, folder: Path) -> str:
    fs = s3.filesystem()
    for path in folder.iterdir():
        fs.pipe(f"{bucket}/build/{path.name}", path.read_bytes())
    return f"s3://{bucket}/build/manifest.json"


def trained_keys(batches) -> set[str]:
    return {key for batch in batches for key in batch.keys if key}


@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_first_shard_is_skipped_and_every_batch_still_comes(
    tmp_path, tiny_transform, how
):
    """The epoch's first batches come from the damaged shard (the case that crashed): the
    loader yields the same full batches it would for intact data, none of the damaged
    shard's samples, and reports the shard once and each replaced sample."""
    bad = first_shard()
    manifest_path = write_uneven_shards(tmp_path, SIZES)
    damage(tmp_path, bad, how)
    dataset = ShardDataset(
        read_manifest(str(manifest_path)), *tiny_transform, batch_size=16, seed=SEED
    )
    batches = list(make_loader(dataset, 0))
    assert len(batches) == 7 and all(len(b.keys) == 16 for b in batches)
    assert all(b.images.shape[0] == 16 and b.tokens.shape[0] == 16 for b in batches)
    assert not trained_keys(batches) & keys_of(bad)
    assert trained_keys(batches)  # the other shards trained
    assert [shard for b in batches for shard in b.skipped] == [bad]
    assert sum(b.replaced for b in batches) == SIZES[bad]  # each sample of it was planned


def test_each_batch_says_which_sample_filled_each_place(tmp_path, tiny_transform):
    """Bug: the sample log ("an audit of what was trained on") listed the planned keys only,
    so places filled by another sample showed samples never trained on. Batches now carry
    `used`: the key each place really holds, taken from the batch's own usable samples."""
    bad = first_shard()
    manifest_path = write_uneven_shards(tmp_path, SIZES)
    damage(tmp_path, bad, "truncated")
    dataset = ShardDataset(
        read_manifest(str(manifest_path)), *tiny_transform, batch_size=16, seed=SEED
    )
    batches = list(make_loader(dataset, 0))
    filled = [b for b in batches if b.used is not None]
    assert filled and all(b.replaced for b in filled)
    for batch in batches:
        used = batch.used or batch.keys
        assert all(used) and not set(used) & keys_of(bad)
        assert set(used) <= {key for key in batch.keys if key}


def test_a_resume_that_starts_inside_a_damaged_shard_still_checks_it(tmp_path, tiny_transform):
    """Resumed after one batch, the worker starts 16 samples into the shard: it is still
    verified from its first byte (a flipped byte past the resume point is caught)."""
    bad = first_shard()
    manifest_path = write_uneven_shards(tmp_path, SIZES)
    damage(tmp_path, bad, "flipped")
    dataset = ShardDataset(
        read_manifest(str(manifest_path)), *tiny_transform, batch_size=16, seed=SEED
    )
    dataset.resume_at(0, 1)
    batches = list(make_loader(dataset, 0))
    assert len(batches) == 6 and not trained_keys(batches) & keys_of(bad)
    assert [shard for b in batches for shard in b.skipped] == [bad]


def test_without_any_usable_shard_the_loader_stops_with_one_message(tmp_path, tiny_transform):
    manifest_path = write_uneven_shards(tmp_path, SIZES)
    for shard in range(len(SIZES)):
        damage(tmp_path, shard, "truncated")
    dataset = ShardDataset(read_manifest(str(manifest_path)), *tiny_transform, batch_size=16)
    for workers, hold in ((0, None), (2, 1)):
        with pytest.raises(NoUsableData, match=r"^no usable data: none of the 3 shards"):
            list(make_loader(dataset, workers, hold=hold))


def train_tree(manifest: str, output: Path, **data) -> dict:
    return {
        "data": {"manifest": manifest, "batch_size": 16, "workers": 2, "seed": SEED, **data},
        "run": {"output": str(output), "epochs": 1, "log_every": 2, "sample_log": True},
    }


def logged_keys(output: Path, rank: int = 0) -> list[list[str]]:
    lines = (output / "samples" / f"rank-{rank}.jsonl").read_text().splitlines()
    return [json.loads(line)["keys"] for line in lines]


def logged_used(output: Path, rank: int = 0) -> list[list[str] | None]:
    """Per step, the samples that really filled its places where some were replaced."""
    lines = (output / "samples" / f"rank-{rank}.jsonl").read_text().splitlines()
    return [json.loads(line).get("used") for line in lines]


@pytest.mark.parametrize("cached", [False, True], ids=["streamed", "cached"])
@pytest.mark.parametrize("how", ["flipped", "substituted"])
def test_training_on_s3_skips_a_damaged_shard_and_reports_it(s3, s3_bucket, tmp_path, cached, how):
    """Real training from S3 with two loader workers, streamed (verified as the bytes pass)
    or through the shard cache: the damaged first shard is skipped, every step comes, and
    metrics.jsonl and the summary count it."""
    bad = first_shard()
    damage(make_shards(tmp_path / "shards").parent, bad, how)
    tree = train_tree(upload(s3, s3_bucket, tmp_path / "shards"), tmp_path / "run")
    tree["storage_options"] = s3.storage_options
    if cached:
        tree["data"] |= {"cache_dir": str(tmp_path / "cache"), "cache_limit": "100MB"}
    summary = train(TrainConfig.model_validate(tree))
    assert summary["steps"] == 7 and summary["samples"] == 7 * 16
    assert summary["skipped_shards"] == 1 and summary["replaced_samples"] == SIZES[bad]
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 7 and rows[-1]["skipped_shards"] == 1
    keys = {k for step in logged_keys(tmp_path / "run") for k in step if k}
    assert not keys & keys_of(bad) and keys
    if cached:  # nothing of the damaged shard stays in the cache
        assert len(list((tmp_path / "cache").glob("*.tar"))) == len(SIZES) - 1


def test_a_resume_over_a_damaged_shard_continues_exactly(tmp_path):
    """Stopped at step 3 and resumed: the same steps and the same samples as one run, and
    the checkpoint carries the skipped shard on."""
    bad = first_shard()
    manifest = make_shards(tmp_path / "shards")
    damage(tmp_path / "shards", bad, "flipped")
    whole = train(TrainConfig.model_validate(train_tree(str(manifest), tmp_path / "whole")))
    tree = train_tree(str(manifest), tmp_path / "parts")
    tree["run"]["max_steps"] = 3
    train(TrainConfig.model_validate(tree))
    tree["run"] |= {"max_steps": None, "resume": True}
    resumed = train(TrainConfig.model_validate(tree))
    assert resumed["steps"] == whole["steps"] == 7
    assert resumed["skipped_shards"] == whole["skipped_shards"] == 1
    # every step's planned samples ("" for those the damaged shard held), resume or not
    assert logged_keys(tmp_path / "parts") == logged_keys(tmp_path / "whole")
    used = logged_used(tmp_path / "parts")
    assert used == logged_used(tmp_path / "whole") and any(used)
    assert all(key and key not in keys_of(bad) for step in used if step for key in step)


def test_two_ranks_take_equal_steps_over_a_damaged_shard(tmp_path):
    """torchrun, 2 ranks x 2 workers: one rank reads the damaged shard, the other does not;
    both take every step, and both summaries count the shard (summed over the ranks)."""
    bad = first_shard()
    manifest = make_shards(tmp_path / "shards")
    damage(tmp_path / "shards", bad, "truncated")
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump(train_tree(str(manifest), tmp_path / "run")))
    result = run_torchrun(config, 2)
    assert result.returncode == 0, result.stderr[-3000:]
    summaries = printed_summaries(result.stdout)
    assert len(summaries) == 2 and {s["steps"] for s in summaries} == {120 // 32}
    assert {s["skipped_shards"] for s in summaries} == {1}
    assert {s["replaced_samples"] for s in summaries} == {SIZES[bad]}
    for rank in (0, 1):
        assert len(logged_keys(tmp_path / "run", rank)) == 120 // 32
    assert "skipping shard" in result.stderr and "Traceback" not in result.stderr


def test_no_usable_data_is_one_line_from_the_cli(tmp_path, capsys):
    manifest = make_shards(tmp_path / "shards")
    for shard in reversed(range(len(SIZES))):  # 2 <- 0's bytes, 1 <- 2's, 0 gone
        damage(tmp_path / "shards", shard, "substituted" if shard else "gone")
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump(train_tree(str(manifest), tmp_path / "run")))
    assert main([str(config)]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith("error: no usable data: none of the 3 shards")
    assert "Traceback" not in err


def test_the_cache_downloads_again_a_copy_damaged_on_its_disk(s3, s3_bucket, tmp_path):
    make_shards(tmp_path / "shards")
    manifest = read_manifest(upload(s3, s3_bucket, tmp_path / "shards"), s3.storage_options)
    shard = manifest.shards[0]
    cache = ShardCache(tmp_path / "cache", 10**9, s3.storage_options)
    path = cache.fetch(shard.url, shard.sha256, shard.bytes)
    path.write_bytes(path.read_bytes()[:1000])  # e.g. a disk error, or another tool
    with cache.open(shard.url, shard.sha256, shard.bytes) as f:
        assert hashlib.sha256(f.read()).hexdigest() == shard.sha256
    assert cache.misses == 2 and cache.hits == 0


TRAIN_AFTER_S3_USE = """
import json, os, pathlib
from mmcurate.pipeline.runtime.objectstore import LocalS3
from mmcurate.trainer.config import TrainConfig
from mmcurate.trainer.train import train

tree, shards = json.loads(os.environ["TEST_TREE"]), pathlib.Path(os.environ["TEST_SHARDS"])
with LocalS3(pathlib.Path(os.environ["TEST_S3_DIR"])) as s3:  # as `mmcurate demo` does
    s3.make_bucket("demo")
    for _ in range(3):  # a build in this process writes its shards
        fs = s3.filesystem()
        for path in sorted(shards.iterdir()):
            fs.pipe(f"demo/build/{path.name}", path.read_bytes())
    del fs
    tree["storage_options"] = s3.storage_options
    print(json.dumps(train(TrainConfig.model_validate(tree))))
"""


def test_training_from_s3_with_workers_prints_no_event_loop_errors(tmp_path):
    """What `mmcurate demo` does: one process runs SeaweedFS, writes shards to it, then
    trains from them with loader workers. No worker may close the S3 sessions it inherited,
    on its own event loop ("Task exception was never retrieved ... attached to a different
    loop": before the fix, 2 to 4 of them per worker here)."""
    folder = tmp_path / "shards"
    folder.mkdir()
    write_uneven_shards(folder, (100, 100, 100, 100, 90))
    tree = {
        "data": {"manifest": "s3://demo/build/manifest.json", "batch_size": 32, "workers": 2},
        "run": {"output": str(tmp_path / "run"), "max_steps": 20, "log_every": 5},
    }
    env = os.environ | {
        "TEST_S3_DIR": str(tmp_path / "s3"),
        "TEST_SHARDS": str(folder),
        "TEST_TREE": json.dumps(tree),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO),
    }
    run = subprocess.run(
        [sys.executable, "-c", TRAIN_AFTER_S3_USE],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1])["steps"] == 20
    assert "Task exception was never retrieved" not in run.stderr, run.stderr[-3000:]
    assert "Traceback" not in run.stderr and "different loop" not in run.stderr


class InheritedSessions(torch.utils.data.IterableDataset):
    """A loader dataset whose one batch names how many S3 filesystems its worker inherited
    from the training process (alive or garbage not yet collected)."""

    def start_worker(self, worker: int, workers: int, slots: int, free) -> None:
        pass

    def __iter__(self):
        import gc

        from s3fs import S3FileSystem

        found = [
            o for o in gc.get_objects() if isinstance(o, S3FileSystem) and o._pid != os.getpid()
        ]
        yield Batch([], None, [str(len(found))])  # no tensors: nothing to share


def test_loader_workers_inherit_no_storage_session(s3, s3_bucket):
    """The cause of those errors, checked directly: a forked worker gets no S3 filesystem of
    the training process, neither a cached one nor garbage (a dropped one is in a cycle, so
    only the collector frees it, in whichever process and thread it runs)."""
    from mmcurate.trainer.data.ring import RingLoader

    for _ in range(3):
        s3.filesystem().ls(s3_bucket)
    read_manifest_cached = fsspec.filesystem("s3", **s3.storage_options)
    read_manifest_cached.ls(s3_bucket)
    del read_manifest_cached
    batches = list(RingLoader(InheritedSessions(), workers=2, hold=1, depth=1))
    assert [b.keys for b in batches] == [["0"], ["0"]]

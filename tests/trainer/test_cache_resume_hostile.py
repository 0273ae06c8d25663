"""The shard cache and resume against what happens to real files: a dataset rebuilt at the
same URL (same sizes, new bytes), a cached copy damaged on the node's disk, partial downloads
left by killed trainers, a checkpoint cut short or replaced by an export, and a mid-epoch
resume onto other shards of the same sample count. Tiny shards in tmp_path, the tiny model."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml
from mmcurate.core.config_io import ConfigError
from mmcurate.trainer.checkpoint import save_checkpoint
from mmcurate.trainer.cli import main
from mmcurate.trainer.config import TrainConfig
from mmcurate.trainer.data import cache as cache_module
from mmcurate.trainer.data.cache import ShardCache
from mmcurate.trainer.data.manifest import read_manifest
from mmcurate.trainer.data.reader import ShardReader
from mmcurate.trainer.train import train

from tests.kit_shards import write_uneven_shards

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest: torch on one thread

SIZES = (24, 24)  # 48 samples: 6 batches of 8 an epoch, so step 3 stops mid-epoch
LIMIT = 10**9


def shards(folder: Path, prefix: str = "k") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return write_uneven_shards(folder, SIZES, prefix)


def keys(reader: ShardReader, index: int) -> list[str]:
    return [sample["__key__"] for sample in reader.samples(index)]


def cached_copy(folder: Path) -> Path:
    (copy,) = folder.glob("*.tar")
    return copy


# --- the shard cache -----------------------------------------------------------------------


def test_a_dataset_rebuilt_at_the_same_url_is_read_anew_through_the_cache(tmp_path):
    """Rebuilt in place with other captions of the same length: every shard keeps its size
    (tar blocks) but not its sha256; the cache must serve the new bytes, not the old copy."""
    manifest = shards(tmp_path / "data", prefix="a")
    before = read_manifest(str(manifest)).shards
    cache = (str(tmp_path / "cache"), LIMIT)
    assert keys(ShardReader(before, cache=cache), 0)[0].startswith("a")
    manifest = shards(tmp_path / "data", prefix="b")  # same URLs, same sizes, other bytes
    after = read_manifest(str(manifest)).shards
    assert [s.bytes for s in after] == [s.bytes for s in before]
    assert [s.sha256 for s in after] != [s.sha256 for s in before]
    reader = ShardReader(after, cache=cache)
    got = keys(reader, 0)
    assert len(got) == SIZES[0] and all(key.startswith("b") for key in got)
    assert reader.cache.misses == 1 and reader.cache.hits == 0
    # a manifest without sha256 names the copy by its URL alone, as before
    unhashed = [replace(shard, sha256="") for shard in after]
    first, again = ShardReader(unhashed, cache=cache), ShardReader(unhashed, cache=cache)
    assert keys(first, 1) == keys(again, 1) and len(keys(again, 1)) == SIZES[1]
    assert (first.cache.misses, again.cache.misses, again.cache.hits) == (1, 0, 2)
    assert len(list((tmp_path / "cache").glob("*.tar"))) == 3


def damage_member_header(copy: Path, member: int) -> None:
    """Overwrite the checksum of the tar header of `member` (0-based), keeping the size."""
    with tarfile.open(copy) as tar:
        offset = tar.getmembers()[member].offset
    raw = bytearray(copy.read_bytes())
    raw[offset + 148 : offset + 156] = b"XXXXXXXX"
    copy.write_bytes(bytes(raw))


@pytest.mark.parametrize("member", [0, 21], ids=["first_header", "mid_shard"])
def test_a_cached_copy_damaged_on_disk_is_downloaded_again_and_read_whole(tmp_path, member):
    """A damaged header in the cached copy (same size): the copy is dropped and the shard
    downloaded again, once, and its samples come whole and in order, none twice: a damage
    mid-shard is read on from the sample it stopped at."""
    manifest = read_manifest(str(shards(tmp_path / "data")))
    cache = (str(tmp_path / "cache"), LIMIT)
    expected = keys(ShardReader(manifest.shards, cache=cache), 0)
    damage_member_header(cached_copy(tmp_path / "cache"), member)
    reader = ShardReader(manifest.shards, cache=cache)  # a later run on the same node
    assert keys(reader, 0) == expected
    assert reader.skips == 0 and reader.take_skipped() == ()
    assert reader.refetches == 1 and reader.cache.counters()["damaged"] == 1
    raw = cached_copy(tmp_path / "cache").read_bytes()
    assert hashlib.sha256(raw).hexdigest() == manifest.shards[0].sha256


def test_a_shard_bad_at_its_source_is_skipped_without_downloading_it_again(tmp_path):
    """A tar the manifest describes as it is (a build that wrote garbage): the cached copy
    matches the manifest, so it is not the disk's fault; the shard is skipped as before."""
    folder = tmp_path / "data"
    shards(folder)
    bad = folder / "shard-000000.tar"
    bad.write_bytes(os.urandom(bad.stat().st_size))
    doc = json.loads((folder / "manifest.json").read_text())
    doc["shards"][0]["sha256"] = hashlib.sha256(bad.read_bytes()).hexdigest()
    (folder / "manifest.json").write_text(json.dumps(doc))
    manifest = read_manifest(str(folder / "manifest.json"))
    reader = ShardReader(manifest.shards, cache=(str(tmp_path / "cache"), LIMIT))
    assert keys(reader, 0) == [] and keys(reader, 0) == []
    assert reader.take_skipped() == (0,) and reader.refetches == 0
    assert reader.cache.misses == 1  # one download, not one per read


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def partial(folder: Path, owner: str, size: int, age_s: float = 0) -> Path:
    path = folder / f".{'0' * 32}.tar.tmp-{owner}"
    path.write_bytes(b"\0" * size)
    if age_s:
        then = time.time() - age_s
        os.utime(path, (then, then))
    return path


def test_partial_downloads_of_gone_trainers_are_removed_and_live_ones_count(tmp_path):
    """Under the cache lock, before a new shard goes in: partial downloads whose process is
    gone from this host (also as older versions named them), or that nobody touched for
    hours (another host's), are deleted; live ones count toward the limit."""
    folder, size = tmp_path / "cache", 10_000
    data = [tmp_path / f"s{i}.tar" for i in range(2)]
    for path in data:
        path.write_bytes(os.urandom(size))
    sha = [hashlib.sha256(path.read_bytes()).hexdigest() for path in data]
    cache = ShardCache(folder, 3 * size)
    with cache.open(str(data[0]), sha[0], size):
        pass
    gone, host, stale_s = dead_pid(), cache_module.HOST, cache_module.STALE_PARTIAL_S
    dead_s = cache_module.DEAD_PARTIAL_S + 60
    stale = [
        partial(folder, f"{host}-{gone}-1", size, age_s=dead_s),
        partial(folder, f"{gone}-1", size, age_s=dead_s),  # the name before hosts were in it
        partial(folder, "other-host-1-1", size, age_s=stale_s + 60),
    ]
    live = [
        partial(folder, f"{host}-{os.getpid()}-7", size),
        partial(folder, "other-host-1-2", size // 2, age_s=60),
    ]
    with cache.open(str(data[1]), sha[1], size) as f:
        assert f.read() == data[1].read_bytes()
    assert not any(path.exists() for path in stale) and all(path.exists() for path in live)
    assert cache.abandoned == 3
    # 1.5 shards in progress + the new one + the old one exceed 3 shards: the old one goes
    assert cache.evictions == 1 and not cache.path(str(data[0]), sha[0]).exists()


def test_a_live_partial_download_of_another_host_is_kept_while_fresh(monkeypatch):
    monkeypatch.setattr(cache_module, "HOST", "this-host")
    assert not cache_module.abandoned(".x.tar.tmp-that-host-1-2", 60)
    assert cache_module.abandoned(".x.tar.tmp-that-host-1-2", cache_module.STALE_PARTIAL_S + 1)
    assert not cache_module.abandoned(f".x.tar.tmp-this-host-{os.getpid()}-2", 60)


def test_a_fresh_partial_of_a_pid_that_looks_gone_is_kept(monkeypatch):
    """Bug: a trainer in another pid namespace on the same host (a container sharing the
    node's NVMe cache) shows a pid that looks gone here: its live download was deleted and it
    failed at the rename. A dead writer's partial goes only once untouched for minutes."""
    monkeypatch.setattr(cache_module, "HOST", "this-host")
    gone = dead_pid()
    assert not cache_module.abandoned(f".x.tar.tmp-this-host-{gone}-2", 5)
    assert cache_module.abandoned(f".x.tar.tmp-this-host-{gone}-2", cache_module.DEAD_PARTIAL_S + 1)


# --- checkpoints and resume ----------------------------------------------------------------


def tree(manifest: Path, output: Path, **run) -> dict:
    return {
        "data": {"manifest": str(manifest), "batch_size": 8, "workers": 0, "seed": 0},
        "model": {"name": "mmcurate-tiny"},
        "optim": {"lr": 1e-3, "warmup_steps": 2},
        "run": {"output": str(output), "log_every": 1, **run},
    }


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory) -> tuple[Path, Path]:
    """(manifest, run folder) of a run stopped at step 3, mid-epoch, checkpointing each step."""
    manifest = shards(tmp_path_factory.mktemp("data"))
    output = tmp_path_factory.mktemp("run")
    train(TrainConfig.model_validate(tree(manifest, output, max_steps=3, checkpoint_every=1)))
    return manifest, output


def copy_run(stopped_run, tmp_path: Path) -> tuple[Path, Path]:
    manifest, output = stopped_run
    shutil.copytree(output, tmp_path / "run")
    return manifest, tmp_path / "run"


def resume_config(manifest: Path, output: Path, max_steps: int = 4) -> TrainConfig:
    run = {"max_steps": max_steps, "checkpoint_every": 1, "resume": True}
    return TrainConfig.model_validate(tree(manifest, output, **run))


def test_saving_a_checkpoint_syncs_the_file_and_then_its_folder(tmp_path, monkeypatch):
    synced, real_fsync = [], os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    url = str(tmp_path / "checkpoints" / "step-1.pt")
    save_checkpoint(url, {"step": 1})
    assert len(synced) == 2 and ".step-1.pt.tmp-" in synced[0]
    assert synced[1] == str(tmp_path / "checkpoints")


def test_a_truncated_newest_checkpoint_resumes_from_the_one_before(stopped_run, tmp_path, caplog):
    manifest, output = copy_run(stopped_run, tmp_path)
    newest = output / "checkpoints" / "step-3.pt"
    newest.write_bytes(newest.read_bytes()[:5000])  # a power loss before the data was synced
    with caplog.at_level(logging.WARNING):
        summary = train(resume_config(manifest, output))
    assert summary["steps"] == 4 and summary["samples"] == 32
    assert "step-3.pt is unreadable" in caplog.text
    steps = [json.loads(line)["step"] for line in (output / "metrics.jsonl").open()]
    assert steps == [1, 2, 3, 4]  # the stopped run's step 3 line was dropped, then redone
    assert torch.load(newest, weights_only=True)["step"] == 3  # rewritten whole


def test_no_intact_checkpoint_is_one_line_from_the_cli(stopped_run, tmp_path, capsys):
    manifest, output = copy_run(stopped_run, tmp_path)
    for path in (output / "checkpoints").iterdir():
        path.write_bytes(b"" if path.name == "step-3.pt" else path.read_bytes()[:3000])
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump(tree(manifest, output, max_steps=4, resume=True)))
    assert main([str(config)]) == 2
    err = capsys.readouterr().err
    newest = output / "checkpoints" / "step-3.pt"
    assert err.splitlines()[-1].startswith(f"error: run.resume: {newest} is unreadable")
    assert "Traceback" not in err


def test_an_export_written_over_a_step_file_is_named_not_a_key_error(stopped_run, tmp_path):
    manifest, output = copy_run(stopped_run, tmp_path)
    newest = output / "checkpoints" / "step-3.pt"
    weights = torch.load(newest, weights_only=True)["state_dict"]
    torch.save({"state_dict": weights, "mmcurate": {"model": "mmcurate-tiny"}}, newest)
    with pytest.raises(ConfigError, match=r"step-3.pt is not an mmcurate train checkpoint"):
        train(resume_config(manifest, output))


def test_a_mid_epoch_resume_onto_other_shards_of_the_same_count_is_refused(stopped_run, tmp_path):
    """Other shards, same 48 samples: refused, naming the manifest; the same shards from
    another folder resume; a checkpoint from before the digest still resumes."""
    _, output = copy_run(stopped_run, tmp_path)
    other = shards(tmp_path / "other", prefix="v")
    with pytest.raises(ConfigError, match=r"step-3.pt stopped mid-epoch with manifest_digest="):
        train(resume_config(other, output))
    moved = tmp_path / "moved"
    shutil.copytree(stopped_run[0].parent, moved)
    assert train(resume_config(moved / "manifest.json", output))["steps"] == 4
    newest = output / "checkpoints" / "step-4.pt"
    ckpt = torch.load(newest, weights_only=True)
    assert ckpt["loader"]["manifest_digest"]
    del ckpt["loader"]["manifest_digest"]  # as written before the digest existed
    torch.save(ckpt, newest)
    # mid-epoch at step 4 too (6 batches an epoch): the old checkpoint is not compared
    assert train(resume_config(other, output, max_steps=5))["steps"] == 5

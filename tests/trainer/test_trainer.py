"""trainer/: real WebDataset shards made from skimage photos, a tiny CLIP trained on CPU."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from mmcurate.core.config_io import ConfigError
from mmcurate.core.manifest import ManifestError
from mmcurate.core.tario import iter_tar_samples, split_member_name
from mmcurate.trainer.checkpoint import load_checkpoint
from mmcurate.trainer.cli import main
from mmcurate.trainer.config import TrainConfig, load_train_config, parse_size
from mmcurate.trainer.data.dataset import ImageTransform, ShardDataset
from mmcurate.trainer.data.manifest import read_manifest
from mmcurate.trainer.step import lr_factor
from mmcurate.trainer.train import train

from tests.kit_trainer import SHARDS, add_member, tree, write_shards

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest: torch on one thread


@pytest.fixture(scope="module")
def manifest_path(tmp_path_factory) -> Path:
    return write_shards(tmp_path_factory.mktemp("shards"))


@pytest.fixture(scope="module")
def trained(manifest_path, tmp_path_factory) -> tuple[dict, Path]:
    output = tmp_path_factory.mktemp("run")
    cfg = TrainConfig.model_validate(tree(manifest_path, output, max_steps=30, checkpoint_every=10))
    return train(cfg), output


def test_metrics_have_required_fields(trained):
    summary, output = trained
    rows = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 31))
    for row in rows:
        assert {"step", "samples", "loss", "samples_per_s", "data_wait_frac"} <= row.keys()
        assert row["samples"] == row["step"] * 16
        assert 0.0 <= row["data_wait_frac"] <= 1.0
        assert row["samples_per_s"] > 0
    assert summary["steps"] == 30 and summary["samples"] == 480


def test_loss_falls(trained):
    _, output = trained
    lines = (output / "metrics.jsonl").read_text().splitlines()
    losses = [json.loads(line)["loss"] for line in lines]
    first, last = np.mean(losses[:5]), np.mean(losses[-5:])
    assert last < first * 0.8, (first, last)


def test_checkpoint_holds_model_optimizer_loader(trained):
    summary, output = trained
    names = sorted(p.name for p in (output / "checkpoints").iterdir())
    assert names == ["step-10.pt", "step-20.pt", "step-30.pt"]
    assert summary["checkpoint"] == str(output / "checkpoints" / "step-30.pt")
    ckpt = torch.load(summary["checkpoint"], map_location="cpu", weights_only=True)
    assert ckpt["step"] == 30
    assert "logit_scale" in ckpt["model"] and ckpt["optimizer"]["state"]
    assert ckpt["loader"]["samples_seen"] == 480
    # 192 samples in batches of 16: 12 per epoch, so step 30 is 6 batches into epoch 2
    assert ckpt["loader"]["epoch"] == 2 and ckpt["loader"]["batches_in_epoch"] == 6
    assert ckpt["config"]["data"]["manifest"].endswith("manifest.json")


def test_resume_continues_from_latest_checkpoint(trained, manifest_path, tmp_path):
    _, first_run = trained
    output = tmp_path / "resumed"
    (output / "checkpoints").mkdir(parents=True)
    src = first_run / "checkpoints" / "step-30.pt"
    (output / "checkpoints" / "step-30.pt").write_bytes(src.read_bytes())
    cfg = TrainConfig.model_validate(tree(manifest_path, output, max_steps=32, resume=True))
    summary = train(cfg)
    assert summary["steps"] == 32 and summary["samples"] == 512
    assert load_checkpoint(output / "checkpoints" / "step-32.pt")["step"] == 32


def test_a_mid_epoch_resume_with_another_layout_names_the_difference(
    trained, manifest_path, tmp_path
):
    _, first_run = trained
    (tmp_path / "checkpoints").mkdir()
    src = first_run / "checkpoints" / "step-30.pt"  # 6 batches into epoch 2
    (tmp_path / "checkpoints" / "step-30.pt").write_bytes(src.read_bytes())
    run = {"max_steps": 32, "resume": True}
    config = tree(manifest_path, tmp_path, **run)
    config["data"]["batch_size"] = 8
    with pytest.raises(ConfigError, match="step-30.pt stopped mid-epoch with batch_size=16"):
        train(TrainConfig.model_validate(config))


def test_epoch_run_logs_and_checkpoints_the_final_step(manifest_path, tmp_path):
    cfg = TrainConfig.model_validate(tree(manifest_path, tmp_path, epochs=1, log_every=5))
    cfg = cfg.model_copy(update={"data": cfg.data.model_copy(update={"workers": 0})})
    summary = train(cfg)
    # one worker reads all 192 samples: 12 full batches
    assert summary["steps"] == 12 and summary["epoch"] == 1
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(line)["step"] for line in lines]
    assert steps == [1, 5, 10, 12]
    ckpt = load_checkpoint(tmp_path / "checkpoints" / "step-12.pt")
    assert ckpt["loader"]["epoch"] == 1 and ckpt["loader"]["samples_seen"] == 192


def test_tar_members_group_by_key(tmp_path):
    assert split_member_name("a/b/abc.000.jpg") == ("a/b/abc", "000.jpg")
    assert split_member_name("k1.txt") == ("k1", "txt")
    path = tmp_path / "x.tar"
    with tarfile.open(path, "w") as tar:
        for name in ["k1.jpg", "k1.txt", "k2.jpg", "k2.TXT", "k2.json"]:
            add_member(tar, name, name.encode())
    with path.open("rb") as f:
        samples = list(iter_tar_samples(f))
    assert [s["__key__"] for s in samples] == ["k1", "k2"]
    assert samples[1]["txt"] == b"k2.TXT" and set(samples[1]) == {"__key__", "jpg", "txt", "json"}


def test_lr_warms_up_then_decays():
    factors = [lr_factor(s, warmup_steps=4, total_steps=20) for s in range(25)]
    assert factors[:4] == [0.25, 0.5, 0.75, 1.0]
    assert all(a >= b for a, b in zip(factors[4:-1], factors[5:], strict=True))
    assert factors[20] == pytest.approx(0.0) and factors[24] == pytest.approx(0.0)


def test_manifest_lists_shards_with_sizes_and_hashes(manifest_path):
    manifest = read_manifest(str(manifest_path))
    assert manifest.samples == 192 and len(manifest.shards) == SHARDS
    for shard in manifest.shards:
        raw = Path(shard.url).read_bytes()
        assert shard.bytes == len(raw) and shard.sha256 == hashlib.sha256(raw).hexdigest()


def test_bad_manifest_is_a_manifest_error(tmp_path):
    with pytest.raises(ManifestError, match="cannot read manifest"):
        read_manifest(str(tmp_path / "missing.json"))
    (tmp_path / "m.json").write_text(json.dumps({"format": "other/2", "shards": []}))
    with pytest.raises(ManifestError, match="expected format 'mmcurate/1'"):
        read_manifest(str(tmp_path / "m.json"))


def test_streams_shards_from_an_fsspec_url(manifest_path):
    """Shards behind a URL (fsspec's in-memory store) stream like local ones, bad samples skip."""
    import fsspec
    from mmcurate.trainer.models import build_model

    fs = fsspec.filesystem("memory")
    for path in manifest_path.parent.iterdir():
        fs.pipe(f"/bucket/build/{path.name}", path.read_bytes())
    manifest = read_manifest("memory://bucket/build/manifest.json")
    assert manifest.shards[0].url == "memory://bucket/build/shard-000000.tar"
    _, preprocess, tokenizer = build_model(
        TrainConfig.model_validate({"data": {"manifest": "x"}, "run": {"output": "x"}}).model,
        torch.device("cpu"),
    )
    dataset = ShardDataset(manifest, ImageTransform(preprocess), tokenizer, batch_size=4, seed=1)
    images, tokens, keys = next(iter(dataset))[:3]
    assert images.shape == (4, 3, 64, 64) and images.dtype == torch.uint8 and len(keys) == 4
    assert tokens.shape == (4, 32) and tokens.dtype == torch.long
    assert dataset.decode({"__key__": "k", "jpg": b"not a jpeg", "txt": b"x"}) is None
    assert dataset.decode({"__key__": "k", "jpg": b"", "json": b"{}"}) is None
    fs.rm("/bucket", recursive=True)


def test_checkpoint_config_hides_storage_secrets(tmp_path):
    cfg = TrainConfig.model_validate(
        {
            "data": {"manifest": "s3://b/m.json"},
            "run": {"output": str(tmp_path)},
            "storage_options": {
                "key": "AKIA",
                "secret": "s3cr3t",
                "endpoint_url": "http://h:1",
                "client_kwargs": {"aws_session_token": "t"},
            },
        }
    )
    opts = cfg.redacted()["storage_options"]
    assert opts == {
        "key": "***",
        "secret": "***",
        "endpoint_url": "http://h:1",
        "client_kwargs": {"aws_session_token": "***"},
    }


def write_config(path: Path, body: dict) -> Path:
    path.write_text(yaml.safe_dump(body))
    return path


def test_unknown_key_names_the_key(tmp_path):
    body = tree(tmp_path / "manifest.json", tmp_path / "out")
    body["data"]["shufle_buffer"] = 100  # a typo
    with pytest.raises(ConfigError, match=r"^data\.shufle_buffer: unknown key$"):
        load_train_config(write_config(tmp_path / "c.yaml", body))
    with pytest.raises(ConfigError, match=r"^run\.precision: "):
        load_train_config(
            write_config(tmp_path / "c.yaml", tree(tmp_path, tmp_path)), ["run.precision=fp8"]
        )


def test_defaults_and_sizes(tmp_path):
    cfg = TrainConfig.model_validate(
        {
            "data": {"manifest": "s3://b/m.json", "cache_limit": "10GB"},
            "run": {"output": str(tmp_path)},
        }
    )
    assert cfg.data.batch_size == 32 and cfg.data.workers == 2 and cfg.model.name == "mmcurate-tiny"
    assert cfg.optim.lr == 5e-4 and cfg.run.precision == "fp32" and cfg.storage_options == {}
    assert cfg.data.cache_limit_bytes == 10**10 and parse_size("512MiB") == 512 * 2**20
    with pytest.raises(ValueError):
        parse_size("ten gigs")


def test_example_config_validates():
    cfg = load_train_config(REPO / "configs" / "train_clip.yaml")
    assert cfg.model.name == "mmcurate-tiny"


def test_cli_exit_codes(manifest_path, tmp_path, capsys):
    body = tree(tmp_path / "nowhere" / "manifest.json", tmp_path / "out")
    config = write_config(tmp_path / "c.yaml", body)
    assert main([str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: cannot read manifest") and "\n" not in err
    assert main([str(config), "--set", "data.bogus=1"]) == 2
    assert capsys.readouterr().err.strip() == "error: data.bogus: unknown key"
    assert main([str(tmp_path / "absent.yaml")]) == 2
    assert capsys.readouterr().err.startswith("error: config file not found")
    config = write_config(tmp_path / "m.yaml", tree(manifest_path, tmp_path / "m"))
    assert main([str(config), "--set", "model.name=no-such-model"]) == 2
    assert "model.name: unknown open_clip model" in capsys.readouterr().err
    # the real entry point, in a fresh process
    config = write_config(tmp_path / "ok.yaml", tree(manifest_path, tmp_path / "ok"))
    run = subprocess.run(
        [sys.executable, "-m", "mmcurate.trainer", str(config), "--set", "run.max_steps=2"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.strip().splitlines()[-1])["steps"] == 2
    assert (tmp_path / "ok" / "checkpoints" / "step-2.pt").is_file()


def test_training_through_the_shard_cache(manifest_path, tmp_path):
    cfg_tree = tree(manifest_path, tmp_path / "run", max_steps=6)
    cfg_tree["data"].update({"cache_dir": str(tmp_path / "cache"), "cache_limit": "100MB"})
    summary = train(TrainConfig.model_validate(cfg_tree))
    assert summary["steps"] == 6
    cached = sorted(p.stat().st_size for p in (tmp_path / "cache").glob("*.tar"))
    manifest = read_manifest(str(manifest_path))
    assert cached == sorted(s.bytes for s in manifest.shards)  # every shard, downloaded whole


def test_tensorboard_gets_the_metrics_rows(manifest_path, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    body = tree(manifest_path, tmp_path, max_steps=4, log_every=2, tensorboard=True)
    train(TrainConfig.model_validate(body))
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    logged = events.Scalars("train/loss")
    assert [e.step for e in logged] == [r["step"] for r in rows] == [1, 2, 4]
    assert [e.value for e in logged] == pytest.approx([r["loss"] for r in rows])
    assert {"train/samples_per_s", "train/data_wait_frac", "train/lr"} <= set(
        events.Tags()["scalars"]
    )


def test_resume_drops_log_lines_written_after_the_checkpoint(tmp_path):
    from mmcurate.trainer.run_log import trim_log

    log = tmp_path / "metrics.jsonl"
    log.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(1, 8)))
    trim_log(log, 5)
    assert [json.loads(x)["step"] for x in log.read_text().splitlines()] == [1, 2, 3, 4, 5]
    trim_log(tmp_path / "missing.jsonl", 5)  # nothing to trim


def test_a_run_on_object_storage_checkpoints_and_resumes_there(
    manifest_path, s3, s3_bucket, tmp_path, monkeypatch
):
    """run.output on S3: checkpoints and logs land there. A resume on another machine (here
    another HOME, so an empty local mirror) continues from the stored checkpoint, and the
    stored logs go on from it with no line lost or repeated."""
    output = f"s3://{s3_bucket}/runs/tiny"
    run = {"checkpoint_every": 2, "sample_log": True}
    config = tree(manifest_path, output, max_steps=4, **run) | {
        "storage_options": s3.storage_options
    }
    monkeypatch.setenv("HOME", str(tmp_path / "machine-a"))
    first = train(TrainConfig.model_validate(config))
    assert first["checkpoint"] == f"{output}/checkpoints/step-4.pt"

    fs = s3.filesystem()
    root = f"{s3_bucket}/runs/tiny"
    assert sorted(p.rsplit("/", 1)[1] for p in fs.ls(f"{root}/checkpoints")) == [
        "step-2.pt",
        "step-4.pt",
    ]
    monkeypatch.setenv("HOME", str(tmp_path / "machine-b"))
    config["run"] |= {"max_steps": 6, "resume": True}
    second = train(TrainConfig.model_validate(config))
    assert second["steps"] == 6 and second["samples"] == 6 * 16

    fs.invalidate_cache()
    rows = [json.loads(x) for x in fs.cat_file(f"{root}/metrics.jsonl").decode().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    steps = [json.loads(x) for x in fs.cat_file(f"{root}/samples/rank-0.jsonl").splitlines()]
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5, 6]
    summary = json.loads(fs.cat_file(f"{root}/summary.json"))
    assert summary == second and summary["checkpoint"] == f"{output}/checkpoints/step-6.pt"
    resumed = load_checkpoint(summary["checkpoint"], s3.storage_options)
    assert resumed["step"] == 6 and resumed["loader"]["samples_seen"] == 96

    config["run"] |= {"max_steps": 2, "resume": False, "overwrite": True}  # replaced whole
    train(TrainConfig.model_validate(config))
    fs.invalidate_cache()
    assert [p.rsplit("/", 1)[1] for p in fs.ls(f"{root}/checkpoints")] == ["step-2.pt"]
    steps = [json.loads(x) for x in fs.cat_file(f"{root}/samples/rank-0.jsonl").splitlines()]
    assert [s["step"] for s in steps] == [1, 2]


def test_a_checkpoint_that_fails_midway_leaves_nothing(s3, s3_bucket, tmp_path):
    """torch.save raising partway (here: an object it cannot pickle, after a large tensor)
    publishes no object and leaves no temporary file, on S3 as on a local disk."""
    from mmcurate.trainer.checkpoint import latest_checkpoint, save_checkpoint

    state = {"model": torch.zeros(1_000_000), "bad": lambda: None}
    for output in (f"s3://{s3_bucket}/run", str(tmp_path / "run")):
        with pytest.raises(Exception, match="pickle|lambda"):
            save_checkpoint(f"{output}/checkpoints/step-1.pt", state, s3.storage_options, tmp_path)
        assert latest_checkpoint(output, s3.storage_options) is None
    assert list(tmp_path.rglob("*.tmp-*")) == []


def test_a_run_already_in_the_output_is_refused_unless_resumed_or_overwritten(
    manifest_path, tmp_path
):
    def config(**run) -> TrainConfig:
        tree_ = tree(manifest_path, tmp_path, log_every=1, **run)
        tree_["data"]["workers"] = 0
        return TrainConfig.model_validate(tree_)

    train(config(max_steps=3))
    with pytest.raises(ConfigError, match=r"holds a run \(newest checkpoint step-3.pt\)"):
        train(config(max_steps=2))
    train(config(max_steps=2, overwrite=True))
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-2.pt"]
    steps = [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
    with pytest.raises(ValueError, match="resume and overwrite exclude each other"):
        config(max_steps=2, overwrite=True, resume=True)

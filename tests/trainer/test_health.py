"""trainer/health/checks.py in real (tiny, CPU) training runs: NaN batches injected through the
test hook (MMCURATE_TEST_FAULTS) are skipped and counted, repeated ones restore the last good
checkpoint and training goes on with new data, a loss spike triggers the configured action,
alerts reach a loopback webhook, and on two ranks one rank's NaN skips the step on both."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml
from mmcurate.core.config_io import ConfigError, validate
from mmcurate.trainer.checkpoint import checkpoint_step, latest_checkpoint, load_checkpoint
from mmcurate.trainer.cli import main
from mmcurate.trainer.config import HealthConfig, TrainConfig
from mmcurate.trainer.health.checks import FAULTS_ENV, LossWatch
from mmcurate.trainer.train import train

from tests.kit_alerts import FIELDS, Webhook
from tests.kit_shards import write_uneven_shards
from tests.kit_trainer import logged_steps, printed_summaries

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    server = Webhook()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def manifest(tmp_path_factory) -> Path:
    return write_uneven_shards(tmp_path_factory.mktemp("shards"), sizes=(48, 48))  # 12 batches


def tree(manifest: Path, output: Path, health: dict | None = None, **run) -> dict:
    return {
        "data": {"manifest": str(manifest), "batch_size": 8, "workers": 0, "seed": 1},
        "optim": {"lr": 1e-3, "warmup_steps": 2},
        "run": {"output": str(output), "log_every": 1, "sample_log": True, **run},
        # spikes are x1000 here: 50 deviations keep the noisy first losses from counting
        "health": {"spike_warmup": 3, "spike_sigmas": 50, **(health or {})},
    }


def weights(output: Path, step: int) -> dict[str, torch.Tensor]:
    return load_checkpoint(str(output / "checkpoints" / f"step-{step}.pt"))["model"]


def adam_steps(output: Path, step: int) -> int:
    """Updates the optimizer had applied when step `step`'s checkpoint was written."""
    state = load_checkpoint(str(output / "checkpoints" / f"step-{step}.pt"))["optimizer"]["state"]
    return int(next(iter(state.values()))["step"])


def checkpoints(output: Path) -> list[str]:
    return sorted((p.name for p in (output / "checkpoints").iterdir()), key=checkpoint_step)


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(a[name], b[name]) for name in a)


def metrics(output: Path) -> list[dict]:
    return [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]


def all_keys(output: Path) -> list[str]:
    return [k for rows in logged_steps(output).values() for row in rows for k in row["keys"]]


def test_a_nan_batch_is_skipped_and_counted(manifest, tmp_path, monkeypatch):
    monkeypatch.setenv(FAULTS_ENV, json.dumps({"nan": [3]}))
    output = tmp_path / "run"
    cfg = TrainConfig.model_validate(tree(manifest, output, max_steps=5, checkpoint_every=1))
    summary = train(cfg)
    assert summary["steps"] == 5 and summary["skipped_steps"] == 1 and summary["restores"] == 0
    assert summary["stopped"] is None
    # no checkpoint during a skip streak; step 3 applied no update, steps 4 and 5 did
    assert checkpoints(output) == ["step-1.pt", "step-2.pt", "step-4.pt", "step-5.pt"]
    assert [adam_steps(output, step) for step in (2, 4, 5)] == [2, 3, 4]
    assert not same(weights(output, 2), weights(output, 4))
    rows = metrics(output)
    assert [r["skipped_steps"] for r in rows] == [0, 0, 1, 1, 1]
    assert all(name in rows[-1] for name in ("grad_norm", "lr", "logit_scale", "restores"))
    assert rows[2]["loss"] != rows[2]["loss"]  # the skipped step's window has no loss (NaN)
    assert all(r["grad_norm"] > 0 for r in rows if r["step"] != 3)


def test_repeated_nans_restore_the_last_good_checkpoint_and_alert(
    manifest, tmp_path, monkeypatch, webhook
):
    """NaN at steps 5 and 6 (health.max_skipped 2): the last good checkpoint is step-3 (none
    is written during the streak), its weights come back and training goes on with new data;
    the webhook gets each event with the documented fields."""
    monkeypatch.setenv(FAULTS_ENV, json.dumps({"nan": [5, 6]}))
    output = tmp_path / "run"
    body = tree(manifest, output, {"max_skipped": 2}, max_steps=9, checkpoint_every=3)
    body["alerts"] = {"webhook": webhook.url, "run_name": "nan-run", "stall_frac": 1e-9}
    summary = train(TrainConfig.model_validate(body))
    assert summary["steps"] == 9 and summary["skipped_steps"] == 2 and summary["restores"] == 1
    keys = all_keys(output)
    assert len(keys) == 9 * 8 and len(set(keys)) == len(keys)  # no sample seen twice
    events = webhook.events()
    assert events[0] == "data_stall" and events[-1] == "run_end"
    # the first NaN of the streak, the one that triggers the restore, the restore
    assert [e for e in events if e in ("nonfinite", "restore")] == [
        *("nonfinite", "nonfinite", "restore")
    ]
    for body in webhook.bodies:
        assert set(body) == FIELDS and body["run"] == "nan-run"
    restore = webhook.bodies[events.index("restore")]
    assert restore["step"] == 6 and "step-3.pt" in restore["message"]
    assert restore["metrics"]["restores"] == 1 and restore["metrics"]["skipped_steps"] == 2
    end = webhook.bodies[-1]
    assert end["metrics"]["steps"] == 9 and end["metrics"]["restores"] == 1


def test_a_loss_spike_restores_or_stops_as_configured(manifest, tmp_path, monkeypatch):
    """The loss x1000 at steps 6 and 7 (health.spike_steps 2): restored, the final checkpoint
    (step 7) holds step 4's weights; stopped, the run ends at step 7 with exit code 1 and,
    checkpointing every step, the newest checkpoint (a resume's) is step 5's, the last healthy
    one: none is written during the spike streak."""
    monkeypatch.setenv(FAULTS_ENV, json.dumps({"spike": [6, 7], "factor": 1000}))
    restored = tmp_path / "restored"
    cfg = tree(manifest, restored, {"spike_steps": 2}, max_steps=7, checkpoint_every=4)
    summary = train(TrainConfig.model_validate(cfg))
    assert summary["restores"] == 1 and summary["skipped_steps"] == 0 and summary["steps"] == 7
    assert same(weights(restored, 4), weights(restored, 7))
    assert len(set(all_keys(restored))) == 7 * 8
    stopped = tmp_path / "stopped"
    config = tmp_path / "stop.yaml"
    body = tree(manifest, stopped, {"spike_steps": 2, "action": "stop"}, max_steps=9)
    config.write_text(yaml.safe_dump(body | {"run": body["run"] | {"checkpoint_every": 1}}))
    assert main([str(config)]) == 1  # a stopped run fails
    summary = json.loads((stopped / "summary.json").read_text())
    assert summary["steps"] == 7 and "loss" in summary["stopped"]
    assert checkpoints(stopped) == [f"step-{step}.pt" for step in range(1, 6)]
    assert latest_checkpoint(str(stopped)).endswith("step-5.pt")


def test_the_spike_baseline_is_robust():
    watch = LossWatch(HealthConfig(spike_warmup=3))  # K = 6 deviations
    for loss in [5.0, 4.9, 5.1, 4.8, 30.0, 5.0]:  # one wild value, still a baseline
        watch.observe(loss)
    assert watch.limit() is not None and watch.limit() < 8
    assert watch.observe(50.0) and watch.streak == 1
    assert not watch.observe(5.0) and watch.streak == 0


def test_a_spike_warmup_longer_than_the_window_is_one_line():
    """The window never holds more than spike_window losses: spikes would never be judged."""
    base = {"data": {"manifest": "m"}, "run": {"output": "o"}}
    with pytest.raises(ConfigError) as err:
        validate(TrainConfig, base | {"health": {"spike_window": 10, "spike_warmup": 11}})
    assert str(err.value).startswith("health: spike_warmup (11) exceeds spike_window (10)")
    cfg = validate(TrainConfig, base | {"health": {"spike_window": 10, "spike_warmup": 10}})
    assert cfg.health.spike_warmup == 10


def run_torchrun(config: Path, faults: str) -> subprocess.CompletedProcess:
    env = os.environ | {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    cmd += ["-m", "mmcurate.trainer", str(config)]
    env[FAULTS_ENV] = faults
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=REPO)


def test_one_ranks_nan_skips_the_step_on_both_ranks(manifest, tmp_path):
    """torchrun, 2 CPU ranks (gloo): rank 1 alone gets a NaN batch at step 2. Both skip it:
    rank 0 writes the checkpoints (none at step 2, a skip streak), and step 2 applied no
    update."""
    output = tmp_path / "run"
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump(tree(manifest, output, max_steps=3, checkpoint_every=1)))
    faults = json.dumps({"nan": [2], "ranks": [1]})
    result = run_torchrun(config, faults)
    assert result.returncode == 0, result.stderr[-3000:]
    summaries = printed_summaries(result.stdout)
    assert len(summaries) == 2 and {s["skipped_steps"] for s in summaries} == {1}
    assert {s["steps"] for s in summaries} == {3}
    assert checkpoints(output) == ["step-1.pt", "step-3.pt"]
    assert adam_steps(output, 1) == 1 and adam_steps(output, 3) == 2
    assert not same(weights(output, 1), weights(output, 3))

"""`strategy: fsdp` (trainer/dist/fsdp.py) on 2 CPU ranks under torchrun (gloo): the same loss curve
as DDP for the same seed and data, its checkpoints the same plain files (an open_clip state
dict, a resume on one rank seeing the rest of the epoch exactly once)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests.kit_alerts import Webhook
from tests.kit_shards import write_uneven_shards
from tests.kit_trainer import logged_steps, torchrun

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def manifest(tmp_path_factory) -> Path:
    return write_uneven_shards(tmp_path_factory.mktemp("shards"), sizes=(40, 40))  # 80 samples


def tree(manifest: Path, output: Path, strategy: str, **run) -> dict:
    return {
        "data": {"manifest": str(manifest), "batch_size": 8, "workers": 0, "seed": 3},
        "optim": {"lr": 1e-3, "warmup_steps": 2},
        "strategy": strategy,
        "run": {"output": str(output), "log_every": 1, "sample_log": True, **run},
    }


def run(tmp_path: Path, name: str, body: dict, ranks: int = 2) -> Path:
    config = tmp_path / f"{name}.yaml"
    config.write_text(yaml.safe_dump(body))
    result = torchrun(config, ranks)
    assert result.returncode == 0, result.stderr[-4000:]
    return Path(body["run"]["output"])


def losses(output: Path) -> list[float]:
    rows = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    return [row["loss"] for row in rows]


def test_fsdp_ddp_and_zero_give_the_same_loss_curve(manifest, tmp_path):
    """ddp, fsdp and ddp with optim.zero (ZeroRedundancyOptimizer): the same losses; zero's
    checkpoint holds the whole optimizer state (gathered from the ranks), equal to ddp's."""
    from mmcurate.trainer.checkpoint import load_checkpoint

    ddp = run(tmp_path, "ddp", tree(manifest, tmp_path / "ddp", "ddp", max_steps=5))
    fsdp = run(tmp_path, "fsdp", tree(manifest, tmp_path / "fsdp", "fsdp", max_steps=5))
    body = tree(manifest, tmp_path / "zero", "ddp", max_steps=5) | {"optim": {"zero": True}}
    body["optim"] |= {"lr": 1e-3, "warmup_steps": 2}
    zero = run(tmp_path, "zero", body)
    a, b, c = losses(ddp), losses(fsdp), losses(zero)
    assert len(a) == len(b) == len(c) == 5 and a[0] != a[-1]  # it trains
    for other in (b, c):
        assert all(abs(x - y) <= 1e-4 * abs(x) for x, y in zip(a, other, strict=True)), (a, other)
    assert logged_steps(ddp) == logged_steps(fsdp)  # the same samples, rank for rank
    plain, sharded = (
        load_checkpoint(str(out / "checkpoints" / "step-5.pt"))["optimizer"]["state"]
        for out in (ddp, zero)
    )
    assert sorted(plain) == sorted(sharded) and len(plain) > 10
    for key, state in plain.items():
        assert torch.allclose(state["exp_avg"], sharded[key]["exp_avg"], atol=1e-6), key


def test_an_fsdp_checkpoint_loads_in_open_clip_and_resumes_on_one_rank(manifest, tmp_path):
    """Saved on 2 ranks at the end of epoch 1 (its gathered, plain state dict), resumed on 1
    rank for epoch 2: every sample of epoch 2 trained on exactly once, Adam's state going on."""
    import open_clip
    import torch
    from mmcurate.trainer.checkpoint import load_checkpoint
    from mmcurate.trainer.config import TrainConfig
    from mmcurate.trainer.train import train

    body = tree(manifest, tmp_path / "run", "fsdp", epochs=1)
    output = run(tmp_path, "fsdp", body)  # 80 samples / (2 ranks x 8) = 5 steps
    saved = output / "checkpoints" / "step-5.pt"
    model, _, _ = open_clip.create_model_and_transforms("mmcurate-tiny", pretrained=str(saved))
    weights = load_checkpoint(str(saved))["model"]
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    body["run"] |= {"epochs": 2, "resume": True}
    summary = train(TrainConfig.model_validate(body))  # one process: world 1
    assert summary["steps"] == 5 + 10 and summary["world"] == 1
    later = [k for row in logged_steps(output)[0] if row["step"] > 5 for k in row["keys"]]
    assert len(later) == 80 and len(set(later)) == 80
    every = {k for rows in logged_steps(output).values() for row in rows for k in row["keys"]}
    assert set(later) == every  # the same 80 samples as epoch 1
    state = load_checkpoint(str(output / "checkpoints" / "step-15.pt"))["optimizer"]["state"]
    assert int(next(iter(state.values()))["step"]) == 15


def test_a_killed_rank_restarts_the_job_from_its_last_checkpoint(manifest, tmp_path):
    """torchrun --max-restarts=1, fsdp on 2 ranks, 2 epochs of 5 steps: rank 1 is killed
    (SIGKILL) before step 8 (rank 0, which took part in step 7, has written step-6.pt);
    torchrun restarts both ranks, which resume from step-6.pt by themselves (run.resume is
    off) and finish. Every step is logged once per rank, each epoch
    holds all 80 samples once, and the webhook got a `restart` event."""
    hook = Webhook()
    try:
        body = tree(manifest, tmp_path / "run", "fsdp", epochs=2, checkpoint_every=3)
        body["alerts"] = {"webhook": hook.url, "stall_frac": None}
        config = tmp_path / "restart.yaml"
        config.write_text(yaml.safe_dump(body))
        result = torchrun(config, restarts=1, faults={"kill": [8], "ranks": [1]})
        assert result.returncode == 0, result.stderr[-4000:]
        events = hook.events()
    finally:
        hook.stop()
    output = Path(body["run"]["output"])
    logs = logged_steps(output)
    for rank in (0, 1):
        assert [row["step"] for row in logs[rank]] == list(range(1, 11))
    for epoch in (range(1, 6), range(6, 11)):
        keys = [
            k for rows in logs.values() for row in rows if row["step"] in epoch for k in row["keys"]
        ]
        assert len(keys) == 80 and len(set(keys)) == 80
    assert "restart" in events and events[-1] == "run_end"
    restart = hook.bodies[events.index("restart")]
    why = "\n".join(x for x in result.stderr.splitlines() if "Error" in x or "error" in x)
    assert restart["step"] == 6 and "resumed from step-6.pt" in restart["message"], why[-3000:]
    assert hook.bodies[-1]["metrics"]["steps"] == 10


def test_a_save_killed_midway_is_swept_and_a_live_one_kept(tmp_path):
    """torchrun SIGTERMs rank 0 mid-save when another rank dies: its temporary stays. The
    next start removes it once its writer is gone and it is untouched for 5 minutes."""
    from mmcurate.trainer.checkpoint import sweep_partial_saves

    folder = tmp_path / "checkpoints"
    folder.mkdir()
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    gone = int(dead.stdout)
    old, fresh, live = (
        folder / f".step-6.pt.tmp-{gone}",
        folder / f".step-8.pt.tmp-{gone}",
        folder / f".step-7.pt.tmp-{os.getpid()}",
    )
    for path in (old, fresh, live, folder / "step-3.pt"):
        path.write_bytes(b"x")
    for path in (old, live):
        os.utime(path, (0, 0))
    assert sweep_partial_saves(str(tmp_path)) == [old.name]
    assert sorted(p.name for p in folder.iterdir()) == sorted([fresh.name, live.name, "step-3.pt"])


def test_the_4gpu_config_is_the_run_users_describe():
    from mmcurate.trainer.config import load_train_config

    cfg = load_train_config(REPO / "configs" / "train_b32_4gpu.yaml")
    assert (cfg.model.name, cfg.strategy, cfg.run.precision) == ("ViT-B-32", "fsdp", "bf16")
    assert cfg.data.batch_size * 4 == 4096 and cfg.optim.lr == 5e-4
    assert (cfg.optim.warmup_steps, cfg.run.epochs) == (500, 32)
    assert cfg.telemetry.enabled and cfg.telemetry.max_temperature_c == 85 and cfg.run.resume


def test_gradient_checkpointing_trains_the_same_steps(manifest, tmp_path):
    """model.gradient_checkpointing recomputes activations in backward: same losses."""
    from mmcurate.trainer.config import TrainConfig
    from mmcurate.trainer.train import train

    curves = []
    for flag in (False, True):
        body = tree(manifest, tmp_path / f"ckpt-{flag}", "fsdp", max_steps=3)
        body["model"] = {"gradient_checkpointing": flag}
        train(TrainConfig.model_validate(body))
        curves.append(losses(tmp_path / f"ckpt-{flag}"))
    assert len(curves[0]) == 3
    assert all(abs(x - y) <= 1e-5 * abs(x) for x, y in zip(*curves, strict=True)), curves

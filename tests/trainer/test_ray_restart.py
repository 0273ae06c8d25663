"""Automatic restart under Ray Train (`launch.max_failures`) on the shared session Ray: one
of 2 fsdp workers is killed (SIGKILL of its own pid, the fault hook) mid-run; Ray Train
restarts the group, which resumes from the newest sharded checkpoint by itself and finishes.
The sample logs hold the epoch's samples exactly once and the webhook got a `restart`."""

from __future__ import annotations

import json

import pytest
from mmcurate.trainer.config import TrainConfig
from mmcurate.trainer.health.checks import FAULTS_ENV

from tests.kit_alerts import Webhook
from tests.kit_shards import write_uneven_shards
from tests.kit_trainer import logged_steps

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_ray_train_restarts_a_lost_worker_from_the_newest_checkpoint(
    tmp_path, ray_session, monkeypatch
):
    """48 samples, 2 ranks x 4: 6 steps; checkpoints at 2 and 4; rank 1 dies before step 5."""
    from mmcurate.trainer.launch import launch_ray

    (tmp_path / "shards").mkdir()
    manifest = write_uneven_shards(tmp_path / "shards", sizes=(20, 28))
    monkeypatch.setenv(FAULTS_ENV, json.dumps({"kill": [5], "ranks": [1]}))
    hook = Webhook()
    try:
        cfg = TrainConfig.model_validate(
            {
                "data": {"manifest": str(manifest), "batch_size": 4, "workers": 0, "seed": 2},
                "strategy": "fsdp",
                "run": {
                    "output": str(tmp_path / "run"),
                    "epochs": 1,
                    "checkpoint_every": 2,
                    "sample_log": True,
                },
                "launch": {"mode": "ray", "workers": 2, "cpus_per_worker": 1, "max_failures": 1},
                "alerts": {"webhook": hook.url, "stall_frac": None},
            }
        )
        summary = launch_ray(cfg)
        events, bodies = hook.events(), hook.bodies
    finally:
        hook.stop()
    assert summary["steps"] == 6 and summary["world"] == 2
    logs = logged_steps(tmp_path / "run")
    assert {rank: [r["step"] for r in rows] for rank, rows in logs.items()} == {
        0: [1, 2, 3, 4, 5, 6],
        1: [1, 2, 3, 4, 5, 6],
    }
    keys = [key for rows in logs.values() for row in rows for key in row["keys"]]
    assert len(keys) == 48 and len(set(keys)) == 48
    restart = bodies[events.index("restart")]
    assert restart["step"] == 4 and "resumed from step-4.pt" in restart["message"]
    assert events[-1] == "run_end" and bodies[-1]["metrics"]["steps"] == 6

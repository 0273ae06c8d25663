"""Sharded (DCP) checkpoints of `strategy: fsdp` on a changing number of ranks (gloo, CPU):
saved mid-epoch on 4 ranks, resumed on 2, stopped mid-epoch again and resumed on 1 process;
the rest of the epoch is re-split each time (trainer/data/resplit.py) and the sample logs hold
every sample of the epoch exactly once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.kit_shards import write_uneven_shards
from tests.kit_trainer import logged_steps, torchrun

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def body(manifest: Path, output: Path, **run) -> dict:
    return {
        "data": {"manifest": str(manifest), "batch_size": 4, "workers": 0, "seed": 11},
        "optim": {"lr": 1e-3, "warmup_steps": 1},
        "strategy": "fsdp",
        "run": {"output": str(output), "log_every": 1, "sample_log": True, **run},
    }


def run_on(ranks: int, tmp_path: Path, tree: dict) -> None:
    config = tmp_path / f"on-{ranks}.yaml"
    config.write_text(yaml.safe_dump(tree))
    result = torchrun(config, ranks)
    assert result.returncode == 0, result.stderr[-4000:]


def test_a_checkpoint_saved_on_4_ranks_resumes_on_2_then_on_1(tmp_path):
    """96 samples, 4 per batch: 2 steps on 4 ranks (32 samples; its save async), 3 on 2 (24),
    the last 40 on one process (10 steps). Every sample once; each DCP folder has one file per
    rank; a folder without DCP's `.metadata` (a save cut short) makes its step passed over."""
    import open_clip
    from mmcurate.trainer.config import TrainConfig
    from mmcurate.trainer.resume import newest_intact
    from mmcurate.trainer.train import train

    (tmp_path / "shards").mkdir()
    manifest = write_uneven_shards(tmp_path / "shards", sizes=(30, 41, 25))
    output = tmp_path / "run"
    run_on(4, tmp_path, body(manifest, output, max_steps=2, async_checkpoint=True))
    run_on(2, tmp_path, body(manifest, output, max_steps=5, resume=True))
    summary = train(TrainConfig.model_validate(body(manifest, output, epochs=1, resume=True)))
    assert summary["steps"] == 15 and summary["epoch"] == 1
    logs = logged_steps(output)
    steps = {rank: [row["step"] for row in rows] for rank, rows in logs.items()}
    assert steps == {0: list(range(1, 16)), 1: [1, 2, 3, 4, 5], 2: [1, 2], 3: [1, 2]}
    keys = [key for rows in logs.values() for row in rows for key in row["keys"]]
    assert len(keys) == 96 and len(set(keys)) == 96
    folders = output / "checkpoints"
    assert len(list((folders / "step-2.dcp").glob("*.distcp"))) == 4
    assert len(list((folders / "step-5.dcp").glob("*.distcp"))) == 2
    loader = json.loads(json.dumps(__import__("torch").load(folders / "step-5.pt")["loader"]))
    assert loader["carried"] == [{"world": 4, "workers": 1, "consumed": 2}]
    assert loader["batches_in_epoch"] == 3 and loader["world"] == 2
    pretrained = str(folders / "step-15.pt")  # the plain open_clip export, as ever
    open_clip.create_model_and_transforms("mmcurate-tiny", pretrained=pretrained)
    (folders / "step-5.dcp" / ".metadata").unlink()
    found = [str(folders / "step-5.pt"), str(folders / "step-2.pt")]
    assert newest_intact(found, TrainConfig.model_validate(body(manifest, output))) == found[1]


@pytest.mark.parametrize(("minutes", "saved"), [(1e-6, [1, 2, 3]), (1000.0, [3])])
def test_run_checkpoint_minutes_saves_by_elapsed_time(tmp_path, minutes, saved):
    """run.checkpoint_minutes: a checkpoint once that long has passed since the last one (a
    microsecond: after every step; 1000 minutes: only the final step's)."""
    from mmcurate.trainer.config import TrainConfig
    from mmcurate.trainer.train import train

    (tmp_path / "shards").mkdir()
    manifest = write_uneven_shards(tmp_path / "shards", sizes=(24,))
    tree = body(manifest, tmp_path / "run", max_steps=3, checkpoint_minutes=minutes)
    train(TrainConfig.model_validate(tree | {"strategy": "ddp"}))
    names = sorted((tmp_path / "run" / "checkpoints").glob("step-*.pt"))
    assert sorted(int(p.stem.split("-")[1]) for p in names) == saved

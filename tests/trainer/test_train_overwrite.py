"""run.overwrite replaces a run only once the new one has passed every check: a wrong
model.pretrained or data.cache_dir fails on one line and leaves the old run whole (it was
deleted first, then the new run died with a traceback)."""

from __future__ import annotations

import pytest
from mmcurate.core.config_io import ConfigError
from mmcurate.trainer.config import TrainConfig
from mmcurate.trainer.train import train

from tests.kit_trainer import tree, write_shards

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest: torch on one thread


def run_files(output) -> dict[str, bytes]:
    return {str(p.relative_to(output)): p.read_bytes() for p in output.rglob("*") if p.is_file()}


def test_a_failed_overwrite_leaves_the_old_run_whole(tmp_path):
    (tmp_path / "shards").mkdir()
    manifest = write_shards(tmp_path / "shards")
    output = tmp_path / "run"
    config = tree(manifest, output, max_steps=2, checkpoint_every=2)
    config["data"]["workers"] = 0
    train(TrainConfig.model_validate(config))
    before = run_files(output)
    assert "checkpoints/step-2.pt" in before and "metrics.jsonl" in before

    not_weights = tmp_path / "notes.pt"
    not_weights.write_text("not a checkpoint")
    a_file = tmp_path / "cache-is-a-file"
    a_file.write_text("x")
    wrong = [
        (
            {"model": {"name": "mmcurate-tiny", "pretrained": str(tmp_path / "nope.pt")}},
            "model.pretrained",
        ),
        (
            {"model": {"name": "mmcurate-tiny", "pretrained": str(not_weights)}},
            "does not load as mmcurate-tiny",
        ),
        ({"data": {**config["data"], "cache_dir": str(a_file)}}, "data.cache_dir"),
    ]
    for change, message in wrong:
        bad = {**config, **change, "run": {**config["run"], "overwrite": True}}
        with pytest.raises(ConfigError, match=message) as raised:
            train(TrainConfig.model_validate(bad))
        assert "\n" not in str(raised.value)
        assert run_files(output) == before, change

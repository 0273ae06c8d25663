"""`mmcurate sweep` end to end on a tiny grid (issue 50): each arm's numbers equal the same arm
run by hand through `mmcurate build`, `train` and `eval` with the same seed; the scorer runs
once (tests/sweep/test_sweep_resume.py: kill -9 mid-sweep, then a rerun)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mmcurate.pipeline.sweep.config import load_sweep_config
from mmcurate.pipeline.sweep.run import sweep
from mmcurate.pipeline.sweep.task import eval_tree, train_tree

import mmcurate
from tests.kit_sweep import CLIP, EVAL, TRAIN, base_build, keys_of, make_sweep_data, sweep_tree

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("one_torch_thread")  # as Ray's one-CPU task workers


@pytest.fixture(scope="module")
def sweep_data(tmp_path_factory) -> dict[str, Path]:
    return make_sweep_data(tmp_path_factory.mktemp("sweep-data"))


def by_hand(data: dict[str, Path], arm: dict, seed: int, work: Path) -> tuple[list, dict]:
    """The arm as a user would run it: `mmcurate build` with the threshold on clip_score,
    `mmcurate train` on it with the seed, `mmcurate eval` on both splits."""
    tree = base_build(data)
    threshold = {k: v for k, v in arm.items() if k in ("min_score", "keep_top_fraction")}
    tree["stages"] = [tree["stages"][0], {**CLIP, **threshold}]
    tree["output"] = {**tree["output"], "path": str(work / "build")}
    built = mmcurate.build(tree)
    run = str(work / "run")
    summary = mmcurate.train(train_tree(TRAIN, built["manifest"], run, seed))
    metrics = {
        split: mmcurate.evaluate(eval_tree(EVAL, "mmcurate-tiny", run, str(data[split])))["metrics"]
        for split in ("validation", "test")
    }
    return keys_of(work / "build"), {"loss": summary["last_loss"], **metrics}


def test_each_arm_equals_the_same_arm_run_by_hand(ray_session, sweep_data, tmp_path):
    arms = [
        {"name": "dedupe", "dedupe": True},
        {"name": "top", "keep_top_fraction": 0.5},
        {"name": "low", "min_score": -0.25},
    ]
    tree = sweep_tree(sweep_data, tmp_path / "sweep", arms, [1])
    result = sweep(load_sweep_config({**tree, "dedupe": [{"name": "exact_dedupe"}]}))
    out = tmp_path / "sweep"
    assert result["scorer_runs"] == {"main": {"clip_score": 1}}  # one scoring build
    stats = json.loads((out / "scored" / "main" / "stats.json").read_text())
    clip = next(s for s in stats["stages"] if s["name"] == "clip_score")
    assert clip["in"] == clip["out"] == 23  # every sample scored once, none dropped by score
    builds = sorted(str(p.relative_to(out)) for p in out.rglob("stats.json"))
    assert builds == ["deduped/main/stats.json", "scored/main/stats.json"]  # arms build nothing
    assert result["kept"]["dedupe"]["samples"] == 20  # the 3 exact copies out
    assert result["kept"]["top"]["samples"] == 12
    assert 0 < result["kept"]["low"]["samples"] < 23  # the threshold splits the set
    runs = {r["arm"]: r for r in result["runs"]}
    for arm in arms[1:]:
        keys, hand = by_hand(sweep_data, arm, 1, tmp_path / f"hand-{arm['name']}")
        assert keys == keys_of(out / "arms" / arm["name"])  # same samples, same order
        assert runs[arm["name"]]["train"]["last_loss"] == hand["loss"]
        assert runs[arm["name"]]["validation"] == hand["validation"]
        assert runs[arm["name"]]["test"] == hand["test"]
    rec = result["recommendation"]
    assert rec["arm"] in runs and rec["separable"] is False  # one seed: no spread to judge
    assert (out / "report.html").is_file() and "| top | 12 |" in (out / "table.md").read_text()

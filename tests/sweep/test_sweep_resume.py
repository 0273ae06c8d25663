"""`mmcurate sweep` after kill -9 (issue 50): a rerun finishes the sweep without redoing the
arm x seed runs that had finished, and without scoring again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mmcurate.pipeline.sweep.config import load_sweep_config
from mmcurate.pipeline.sweep.run import sweep

from tests.kit_builds import wait_for
from tests.kit_sweep import make_sweep_data, sweep_tree

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def sweep_data(tmp_path_factory) -> dict[str, Path]:
    return make_sweep_data(tmp_path_factory.mktemp("sweep-data"))


def test_kill_9_mid_sweep_then_rerun_skips_finished_runs(ray_session, sweep_data, tmp_path):
    """The killed sweep runs its arm x seed runs one at a time (`--runtime local`), so when
    the first result appears the second has not finished; the rerun (Ray tasks) does it."""
    arms = [{"name": "raw"}, {"name": "top", "keep_top_fraction": 0.5}]
    tree = sweep_tree(sweep_data, tmp_path / "sweep", arms, [0])
    config = tmp_path / "sweep.yaml"
    config.write_text(yaml.safe_dump(tree))
    driver = subprocess.Popen(
        [sys.executable, "-m", "mmcurate", "sweep", str(config), "--runtime", "local"],
        **{"cwd": REPO, "start_new_session": True},
        **{"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL},
    )
    results = tmp_path / "sweep" / "results"
    wait_for(lambda: len(list(results.glob("*.json"))) >= 1, timeout_s=300)
    os.killpg(driver.pid, signal.SIGKILL)  # the sweep's own process group, by its pid
    driver.wait()
    finished = {p.name: p.stat().st_mtime_ns for p in results.glob("*.json")}
    assert list(finished) == ["raw-s0.json"]
    result = sweep(load_sweep_config(config))
    assert sorted(p.name for p in results.glob("*.json")) == ["raw-s0.json", "top-s0.json"]
    assert (results / "raw-s0.json").stat().st_mtime_ns == finished["raw-s0.json"]  # kept
    assert result["scorer_runs"] == {"main": {"clip_score": 1}}  # not scored again
    assert [r["arm"] for r in result["runs"]] == ["raw", "top"]

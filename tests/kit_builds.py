"""Build test pieces: a small BuildConfig, waiting on a condition, a build killed mid-run."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import ray
import yaml
from mmcurate.pipeline.config import BuildConfig

REPO = Path(__file__).resolve().parents[1]
STAGES = [{"name": "decode_image", "resize": {"size": 32}}, {"name": "exact_dedupe"}]


def config(source, out, kind="images", storage_options=None, **output) -> BuildConfig:
    return BuildConfig.model_validate(
        {
            "source": {"kind": kind, "path": str(source), "files_per_task": 4},
            "stages": STAGES,
            "output": {"path": str(out), **output},
            "storage_options": storage_options or {},
        }
    )


def wait_for(predicate, timeout_s=120):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.05)


def kill_build_after(spec: dict, out: Path, partitions: int) -> int:
    """`mmcurate build` of `spec` in its own process group on this session's Ray, killed with
    SIGKILL once `partitions` partitions wrote their signatures (before the manifest); returns
    how many had by then. No deadline of its own: a loaded machine only makes it slower (the
    suite's per-test timeout is the backstop); a build that exits first fails the test."""
    config = out.parent / f"{out.name}-build.yaml"
    config.write_text(yaml.safe_dump(spec))
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address}
    driver = subprocess.Popen(
        [sys.executable, "-m", "mmcurate", "build", str(config), "--no-progress"],
        cwd=REPO,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    done = out / "_work" / "signatures"
    while len(list(done.glob("part-*.parquet"))) < partitions:
        if driver.poll() is not None:
            raise AssertionError(f"the build exited ({driver.returncode}) before the kill")
        time.sleep(0.05)
    os.killpg(driver.pid, signal.SIGKILL)  # the driver's own process group, by its pid
    driver.wait()
    assert not (out / "manifest.json").exists()
    return len(list(done.glob("part-*.parquet")))

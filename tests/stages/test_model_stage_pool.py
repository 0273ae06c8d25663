"""Model stages on the default local runtime, as a user's `mmcurate build` runs them: a fresh
process with no Ray, several CPUs, torch's default threads and several partitions.

The driver loads each model once to check it (torch then starts its OpenMP pool); a worker
forked after that deadlocked in its first parallel region, so a clip_score build of 10
partitions never finished (issue 45). Under pytest a Ray session is usually up, which makes the
pool spawn instead: these builds run in a subprocess with none, under a time limit that fails
rather than hangs. The build also leaves nothing of its own in TMPDIR.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import yaml

from tests.kit_aesthetic import random_head, save_head
from tests.shapes import make_shapes, write_folder
from tests.tiny_blip2 import save_tiny_blip2

REPO = Path(__file__).resolve().parents[2]
TINY = {"model": "mmcurate-tiny", "pretrained": None, "num_gpus": 0}
LIMIT_S = 400  # minutes of headroom over a normal run; a deadlock never ends on its own


def model_stages(tmp_path: Path) -> list[dict]:
    head = save_head(random_head("mlp"), tmp_path, ".pth")
    blip2 = save_tiny_blip2(tmp_path / "blip2")
    return [
        {"name": "clip_score", **TINY},
        {"name": "aesthetic_score", "weights": head, **TINY},
        {"name": "recaption", "model": str(blip2), "choose": "best_score", "max_new_tokens": 4},
        {"name": "semantic_dedupe", "model": "mmcurate-tiny", "pretrained": None, "eps": 1e-4},
    ]


def run_build_process(config: Path, tmp: Path) -> subprocess.CompletedProcess:
    """`python -m mmcurate build` in its own session, killed as a group past the limit."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "RAY_ADDRESS")}
    env["TMPDIR"] = str(tmp)
    proc = subprocess.Popen(
        [sys.executable, "-m", "mmcurate", "build", str(config), "--no-progress"],
        cwd=REPO,
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the build's own process group, by its pid
        proc.communicate()
        pytest.fail(f"the build did not finish in {LIMIT_S} s (a worker deadlocked)")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.slow
def test_every_model_stage_finishes_on_the_default_local_runtime(tmp_path):
    photos = write_folder(make_shapes(12, seed=3), tmp_path / "photos")
    out, tmp = tmp_path / "out", tmp_path / "tmp"
    tmp.mkdir()
    spec = {
        "source": {"kind": "images", "path": str(photos), "files_per_task": 2},
        "stages": [{"name": "decode_image", "resize": {"size": 48}}, *model_stages(tmp_path)],
        "output": {"path": str(out)},
        "ray": {"num_cpus": 2},
    }
    config = tmp_path / "build.yaml"
    config.write_text(yaml.safe_dump(spec))
    done = run_build_process(config, tmp)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["samples"] >= 1
    manifest = json.loads((out / "manifest.json").read_text())
    with tarfile.open(out / manifest["shards"][0]["name"]) as tar:
        metas = [json.load(tar.extractfile(m)) for m in tar if m.name.endswith(".json")]
    assert all("clip_score" in m and "aesthetic_score" in m for m in metas)
    leftovers = [p.name for p in tmp.iterdir() if p.name.startswith(("pymp-", "mmcurate-"))]
    assert leftovers == []


POOL_CHILD = """
import os, sys, torch
from mmcurate.pipeline.runtime.localpool import LocalPool
from tests.kit_pool import matmul_threads
pool = LocalPool(2, start=1)  # the zygote forks now, before torch has run
torch.set_num_threads(2)
matmul_threads(0)  # the driver's OpenMP pool starts (a model check does this)
print(pool.run([1, 2, 3, 4], matmul_threads), [w.method for w in pool.workers])
pids = [w.pid for w in pool.workers] + [pool.zygote.process.pid]
os.kill(pids[-1], 9)  # the zygote dies, then a worker: its replacement is spawned
os.kill(pids[0], 9)
print(pool.run([5, 6, 7], matmul_threads), sorted(w.method for w in pool.workers))
pool.close()
print(pids)
"""


def test_workers_started_after_the_driver_ran_openmp_do_not_deadlock():
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "RAY_ADDRESS")}
    done = subprocess.run(
        [sys.executable, "-c", POOL_CHILD],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results, after_zygote, pids = done.stdout.strip().splitlines()
    assert results == "[1, 1, 1, 1] ['fork', 'fork']"
    assert after_zygote == "[1, 1, 1] ['fork', 'spawn']"
    for pid in json.loads(pids):  # closed: the zygote and its workers exit (on EOF)
        deadline = time.monotonic() + LIMIT_S
        while running(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not running(pid)


def running(pid: int) -> bool:
    """Whether the process exists and is not a zombie (its parent, the test, has exited)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


def run_python(script: str, spec: dict) -> subprocess.CompletedProcess:
    """`python -c script SPEC-as-json` with no Ray and torch's default threads, failed past
    the limit instead of hanging."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "RAY_ADDRESS")}
    try:
        return subprocess.run(
            [sys.executable, "-c", script, json.dumps(spec)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=LIMIT_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the build did not finish in {LIMIT_S} s (a worker deadlocked)")


@pytest.mark.slow
def test_run_build_from_python_on_the_local_runtime_finishes(tmp_path):
    """`run_build` with `ray.runtime: local` (no CLI prestart): the pool is made before
    preflight checks the model, so its workers are never forked from a driver that ran it."""
    photos = write_folder(make_shapes(8, seed=4), tmp_path / "photos")
    spec = {
        "source": {"kind": "images", "path": str(photos), "files_per_task": 2},
        "stages": [{"name": "clip_score", **TINY}],
        "output": {"path": str(tmp_path / "out")},
        "ray": {"num_cpus": 2, "runtime": "local"},
    }
    script = (
        "import json, sys\n"
        "from mmcurate.pipeline.build import run_build\n"
        "from mmcurate.pipeline.config import BuildConfig\n"
        "cfg = BuildConfig.model_validate(json.loads(sys.argv[1]))\n"
        "print(run_build(cfg, progress=False)['samples'])\n"
    )
    done = run_python(script, spec)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "8"


@pytest.mark.slow
def test_a_build_from_a_process_that_used_torch_and_opencv_threads_finishes(tmp_path):
    """`mmcurate.build` from a notebook that ran torch and OpenCV on several threads first:
    the pools those left in the caller are copied into every fork, and a worker that entered
    one (clip_score's torch, face_blur's cv2) waited forever."""
    photos = write_folder(make_shapes(8, seed=5), tmp_path / "photos")
    spec = {
        "source": {"kind": "images", "path": str(photos), "files_per_task": 2},
        "stages": [{"name": "face_blur"}, {"name": "clip_score", **TINY}],
        "output": {"path": str(tmp_path / "out")},
        "ray": {"num_cpus": 2, "runtime": "local"},
    }
    script = (
        "import json, sys\n"
        "import cv2, numpy, torch\n"
        "cv2.GaussianBlur(numpy.zeros((2000, 2000, 3), numpy.uint8), (31, 31), 0)\n"
        "torch.ones(512, 512) @ torch.ones(512, 512)\n"
        "import mmcurate\n"
        "print(mmcurate.build(json.loads(sys.argv[1]))['samples'])\n"
        "print(cv2.getNumThreads() > 1)\n"  # the caller's own OpenCV setting is kept
    )
    done = run_python(script, spec)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-2:] == ["8", "True"]


def test_a_task_may_start_processes_of_its_own():
    code = (
        "from mmcurate.pipeline.runtime.localpool import LocalPool\n"
        "from tests.kit_pool import start_a_child\n"
        "if __name__ == '__main__':\n"
        "    pool = LocalPool(1, start=1)\n"
        "    print(pool.run([0], start_a_child), pool.workers[0].method)\n"
        "    pool.close()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=LIMIT_S
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[('mmcurate-worker', False, 0)] fork"

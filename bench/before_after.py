"""Bench: the same builds with two source trees, alternating, in one run (issue 37's cost check).

`--before` is a checkout of the tree to compare with (e.g. `git worktree add /tmp/before
<commit>`); this checkout is "after". Each round runs every workload with both trees, order
swapped every round, as whole `python -m mmcurate build` commands (start to exit), and records
wall time and the peak PSS of the command's process tree. Workloads:

- `folder`: an image folder -> decode_image 256 px keep_ratio -> shards (the common build);
- `wds`: the folder build's shards read back as a `webdataset` source -> exact_dedupe -> shards
  (streams tars through phase A and C without image work);
- `loader` (with `--loader`): each tree's bench/loaders/run_mmcurate.py over the folder build's
  shards (open_clip's ViT-B-32 train transform, 2 workers, batches of 64), samples/s.

    .venv/bin/python bench/before_after.py --before /tmp/before [--n 3000] [--rounds 3] [--loader]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from memwatch import tree_pss
from photos import make_photos

HERE = Path(__file__).resolve().parent
AFTER = HERE.parent

WORKLOADS = {
    "folder": lambda root: {
        "source": {"kind": "images", "path": str(root / "in"), "files_per_task": 256},
        "stages": [{"name": "decode_image", "resize": {"size": 256, "mode": "keep_ratio"}}],
    },
    "wds": lambda root: {
        "source": {"kind": "webdataset", "path": str(root / "wds-in" / "shard-*.tar")},
        "stages": [{"name": "exact_dedupe"}],
    },
}


def run_build(tree: Path, config: dict, out: Path) -> tuple[float, int]:
    """One build with `tree`'s packages first on the path; (wall seconds, peak tree PSS)."""
    from mmcurate.pipeline.runtime.loopback import loopback_only_env

    shutil.rmtree(out, ignore_errors=True)
    path = out.parent / f"{out.name}.yaml"
    path.write_text(json.dumps({**config, "output": {"path": str(out)}}))
    env = {**os.environ, **loopback_only_env(), "PYTHONPATH": str(tree)}
    cmd = [sys.executable, "-m", "mmcurate", "build", str(path), "--no-progress"]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL)
    peak = [0]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], tree_pss(proc.pid))
            done.wait(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    code = proc.wait()
    seconds = time.perf_counter() - started
    done.set()
    watcher.join()
    if code != 0:
        raise SystemExit(f"build failed ({code}) with {tree}: {path}")
    return seconds, peak[0]


def run_loader(tree: Path, root: Path, batches: int) -> float:
    """`tree`'s own loader runner over the folder build's shards; samples per second."""
    from mmcurate.pipeline.runtime.loopback import loopback_only_env

    work = root / "loader-work"
    shutil.rmtree(work, ignore_errors=True)
    runner = tree / "bench" / "loaders" / "run_mmcurate.py"
    cmd = [sys.executable, str(runner), "--shards", str(root / "wds-in"), "--work", str(work)]
    cmd += ["--batches", str(batches)]
    env = {**os.environ, **loopback_only_env(), "PYTHONPATH": str(tree)}
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"loader failed ({done.returncode}) with {tree}: {done.stderr[-2000:]}")
    return float(json.loads(done.stdout.strip().splitlines()[-1])["samples_per_s"])


def loader_rounds(before: Path, root: Path, rounds: int, batches: int) -> dict:
    rates: dict[str, list[float]] = {"before": [], "after": []}
    for rnd in range(rounds):
        order = [("before", before), ("after", AFTER)]
        for side, tree in order if rnd % 2 == 0 else order[::-1]:
            rates[side].append(run_loader(tree, root, batches))
            print(
                json.dumps(
                    {
                        "round": rnd,
                        "workload": "loader",
                        "side": side,
                        "samples_per_s": rates[side][-1],
                    }
                ),
                flush=True,
            )
    med = {side: statistics.median(r) for side, r in rates.items()}
    return {
        "before_samples_per_s": med["before"],
        "after_samples_per_s": med["after"],
        "speed_after_over_before": round(med["after"] / med["before"], 3),
    }


def prepare(root: Path, n: int, before: Path) -> None:
    """Photos, then the webdataset input (the folder build's shards, from the `before` tree)."""
    if len(list((root / "in").glob("*.jpg"))) != n:
        shutil.rmtree(root, ignore_errors=True)
        make_photos(root / "in", n)
    if not (root / "wds-in" / "manifest.json").exists():
        run_build(before, {**WORKLOADS["folder"](root)}, root / "wds-in")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", required=True, help="checkout of the tree to compare with")
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--root", default="/tmp/mmcurate-before-after")
    parser.add_argument("--loader", action="store_true", help="also the training loader")
    parser.add_argument("--loader-batches", type=int, default=40)
    args = parser.parse_args()
    root, before = Path(args.root), Path(args.before).resolve()
    prepare(root, args.n, before)
    times: dict[str, dict[str, list]] = {w: {"before": [], "after": []} for w in WORKLOADS}
    for rnd in range(args.rounds):
        for workload, make in WORKLOADS.items():
            order = [("before", before), ("after", AFTER)]
            for side, tree in order if rnd % 2 == 0 else order[::-1]:
                seconds, peak = run_build(tree, make(root), root / f"out-{workload}-{side}")
                times[workload][side].append((seconds, peak))
                line = {"round": rnd, "workload": workload, "side": side, "s": round(seconds, 2)}
                print(json.dumps(line | {"peak_pss_mb": round(peak / 2**20)}), flush=True)
    result = summary(times, args.n)
    if args.loader:
        result["loader"] = loader_rounds(before, root, args.rounds, args.loader_batches)
    print(json.dumps(result, indent=2))


def summary(times: dict[str, dict[str, list]], n: int) -> dict:
    out = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "samples": n}
    for workload, sides in times.items():
        med = {side: statistics.median(s for s, _ in runs) for side, runs in sides.items()}
        peak = {side: max(p for _, p in runs) for side, runs in sides.items()}
        out[workload] = {
            "before_s": round(med["before"], 2),
            "after_s": round(med["after"], 2),
            "speed_after_over_before": round(med["before"] / med["after"], 3),
            "peak_pss_mb": {side: round(p / 2**20) for side, p in peak.items()},
        }
    return out


if __name__ == "__main__":
    main()

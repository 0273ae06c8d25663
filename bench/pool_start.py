"""Local pool start-up: workers forked by the zygote (what a build uses) against multiprocessing's
forkserver and spawn, each starting `--workers` workers that then run one task each, after the
driver imported what a build imports and ran a model check's torch matmul (the state that made
plain forks deadlock, issue 45). Prints seconds per start, median of `--rounds`.

    .venv/bin/python bench/pool_start.py --workers 2 --rounds 5
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import subprocess
import sys
import time

import mmcurate.pipeline.build  # noqa: F401  (what a build's driver has imported)
from mmcurate.pipeline.runtime.localpool import LocalPool


def task(x: int) -> int:
    return os.getpid() + x


def zygote_start(workers: int) -> float:
    started = time.perf_counter()
    pool = LocalPool(workers, start=0)
    pool.run(list(range(workers)), task)
    elapsed = time.perf_counter() - started
    pool.close()
    return elapsed


def context_start(method: str, workers: int) -> float:
    context = multiprocessing.get_context(method)
    if method == "forkserver":
        context.set_forkserver_preload(["mmcurate.pipeline.build"])
    started = time.perf_counter()
    with context.Pool(workers) as pool:
        pool.map(task, range(workers))
    return time.perf_counter() - started


def one(method: str, workers: int) -> float:
    import torch

    torch.ones(300, 300) @ torch.ones(300, 300)  # the driver's OpenMP pool starts
    if method == "zygote":
        return zygote_start(workers)
    return context_start(method, workers)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(one(args.one, args.workers))
        return
    runs: dict[str, list[float]] = {"zygote": [], "forkserver": [], "spawn": []}
    for _ in range(args.rounds):  # alternating, so load changes hit all three alike
        for name in runs:
            command = [sys.executable, __file__, "--one", name, "--workers", str(args.workers)]
            out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
            runs[name].append(float(out.split()[-1]))
    base = statistics.median(runs["zygote"])
    for name, times in runs.items():
        median = statistics.median(times)
        print(f"{name:10s} {median:7.3f} s  ({median / base:5.1f}x the zygote)")


if __name__ == "__main__":
    main()

"""How long a ready batch takes to reach a sleeping training thread while the loader workers
keep both cores busy, with the workers at the normal policy and at SCHED_BATCH (what
trainer/data/dataset.py sets). Tiny items, so only the handover is measured.

    .venv/bin/python bench/loaders/handover.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import time

from torch.utils.data import DataLoader, IterableDataset

WORK_S = 0.07  # CPU time per item in a worker (GIL released, as decode is)
STEP_S = 0.04  # the consumer's simulated step: about 90% of what two workers produce


class Busy(IterableDataset):
    def __iter__(self):
        block = bytes(1 << 20)
        for i in range(400):
            started = time.perf_counter()
            while time.perf_counter() - started < WORK_S:
                hashlib.sha256(block).digest()
            yield i


def batch_policy(_worker: int) -> None:
    os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))


def measure(policy: str, items: int = 150) -> dict:
    init = batch_policy if policy == "batch" else None
    loader = DataLoader(
        Busy(), batch_size=None, num_workers=2, prefetch_factor=4, worker_init_fn=init
    )
    it = iter(loader)
    next(it)
    time.sleep(0.5)
    waits = []
    for _ in range(items):
        started = time.perf_counter()
        next(it)
        waits.append(time.perf_counter() - started)
        time.sleep(STEP_S)
    waits.sort()
    return {
        "workers": policy,
        "median_ms": round(1000 * waits[len(waits) // 2], 2),
        "mean_ms": round(1000 * statistics.mean(waits), 2),
        "p90_ms": round(1000 * waits[int(0.9 * len(waits))], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    for _ in range(args.rounds):
        for policy in ("normal", "batch"):
            print(json.dumps(measure(policy)), flush=True)


if __name__ == "__main__":
    main()

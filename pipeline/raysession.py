"""The only place that starts or joins Ray, and the one helper that fans work out on it."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any, TypeVar

import ray
from tqdm import tqdm

from pipeline.config import RayConfig


def connect(cfg: RayConfig) -> None:
    """Join `ray.address` or RAY_ADDRESS if set, else start a local Ray; reuse one if running."""
    if not ray.is_initialized():
        address = cfg.address or os.environ.get("RAY_ADDRESS")
        if address:
            ray.init(address=address, logging_level=logging.WARNING)
        else:
            ray.init(num_cpus=cfg.num_cpus, include_dashboard=False, logging_level=logging.WARNING)


T = TypeVar("T")
R = TypeVar("R")


@ray.remote(num_cpus=1, max_retries=3)
def _run_one(fn: Callable[[Any], Any], item: Any) -> Any:
    return fn(item)


def run_tasks(
    items: list[T],
    fn: Callable[[T], R],
    label: str,
    progress: bool = False,
    resources: dict[str, float] | None = None,
) -> list[R]:
    """Run `fn(item)` for each item as a Ray task (one CPU each); return the results in order.

    Plain tasks rather than a Ray Data `map_batches`: measured here, Ray Data's streaming
    executor held this one-partition-per-task workload to fewer concurrent tasks than CPUs
    (BENCHMARKS.md). Items and `fn` are plain objects; tasks write their own outputs to
    storage, and only what the driver reads comes back.
    A bounded window keeps the scheduler's queue and the driver's memory small. `resources`:
    custom Ray resources each task asks for besides its CPU (e.g. a node pool's label).
    """
    window = max(2, int(ray.available_resources().get("CPU", 1)) * 2)
    fn_ref = ray.put(fn)
    remote = _run_one.options(resources=resources) if resources else _run_one
    pending: dict[int, ray.ObjectRef] = {}
    results: list[Any] = [None] * len(items)
    with tqdm(total=len(items), desc=label, unit="task", disable=not progress) as bar:
        for index, item in enumerate(items):
            pending[index] = remote.remote(fn_ref, item)
            if len(pending) >= window:
                collect_one(pending, results)
                bar.update()
        while pending:
            collect_one(pending, results)
            bar.update()
    return results


def collect_one(pending: dict[int, ray.ObjectRef], results: list) -> None:
    """Wait for any one pending task and store its result at its index."""
    index_of = {ref: index for index, ref in pending.items()}
    done, _ = ray.wait(list(pending.values()), num_returns=1)
    index = index_of[done[0]]
    results[index] = ray.get(pending.pop(index))

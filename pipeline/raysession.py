"""The only place that starts or joins Ray, and the one helper that fans work out on it."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import pyarrow as pa
import ray

from pipeline.config import RayConfig


def connect(cfg: RayConfig, progress: bool = True) -> None:
    """Join `ray.address` or RAY_ADDRESS if set, else start a local Ray; reuse one if running."""
    if not ray.is_initialized():
        address = cfg.address or os.environ.get("RAY_ADDRESS")
        if address:
            ray.init(address=address, logging_level=logging.WARNING)
        else:
            ray.init(num_cpus=cfg.num_cpus, include_dashboard=False, logging_level=logging.WARNING)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = progress
    context.print_on_execution_start = progress


def _apply(table: pa.Table, fn: Callable[[list[str]], pa.Table]) -> pa.Table:
    return fn(table["item"].to_pylist())


def run_tasks(items: list[str], fn: Callable[[list[str]], pa.Table]) -> list[pa.Table]:
    """Run `fn([item])` for each item as a Ray Data task (one CPU each); collect the tables.

    One item per block keeps partitions independent and their outputs small: media bytes
    never pass through Ray's object store, only signature rows do.
    """
    if not items:
        return []
    dataset = ray.data.from_items([{"item": s} for s in items], override_num_blocks=len(items))
    dataset = dataset.map_batches(
        _apply, fn_kwargs={"fn": fn}, batch_size=1, batch_format="pyarrow", num_cpus=1
    )
    return [t for t in ray.get(dataset.to_arrow_refs()) if t.num_rows]

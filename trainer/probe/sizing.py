"""The sizing arithmetic of `mmcurate probe` (docs/sizing.md derives it): from the ladder's
step times and peak memory and the loader's rates to a batch size per GPU, loader workers and
CPU cores per GPU, and a number of GPUs for a target global batch or samples/s. Pure
functions on plain numbers."""

from __future__ import annotations

import math
from typing import Any

FORMULA = (
    "b = largest rung with peak <= (1 - headroom) x memory; r(b) = b / step_s(b); "
    "gpus = max(ceil(G / b), ceil(S / r(b))); batch_size_per_gpu = ceil(G / gpus); "
    "need = r(batch_size_per_gpu) x (1 + loader_margin); workers_per_gpu = ceil(need / w); "
    "cpu_cores_per_gpu = ceil(need / c) + 1; data_wait ~ max(0, 1 - L / r)"
)


def fitting(ladder: list[dict[str, Any]], capacity: int | None, headroom: float) -> dict | None:
    """The largest rung that ran and, with `capacity` known, peaked within its share."""
    ok = [r for r in ladder if r["status"] == "ok"]
    if capacity is not None:
        ok = [r for r in ok if r["peak_memory_bytes"] <= (1 - headroom) * capacity]
    return max(ok, key=lambda r: r["batch_size"]) if ok else None


def step_time(ladder: list[dict[str, Any]], batch_size: int) -> float:
    """Step seconds at `batch_size`, linear between the measured rungs (and beyond the
    ends along the nearest rung's time per sample)."""
    ok = sorted((r["batch_size"], r["step_s"]) for r in ladder if r["status"] == "ok")
    for (b0, t0), (b1, t1) in zip(ok, ok[1:], strict=False):
        if b0 <= batch_size <= b1:
            return t0 + (t1 - t0) * (batch_size - b0) / (b1 - b0)
    b, t = ok[0] if batch_size < ok[0][0] else ok[-1]
    return t * batch_size / b


def loader_need(rate: float, margin: float, per_worker: float, per_core: float) -> dict:
    need = rate * (1 + margin)
    return {
        "loader_samples_per_s_per_gpu": need,
        "workers_per_gpu": max(math.ceil(need / per_worker), 1) if per_worker > 0 else None,
        "cpu_cores_per_gpu": math.ceil(need / per_core) + 1 if per_core > 0 else None,
    }


def recommend(
    ladder: list[dict[str, Any]],
    loader: dict[str, Any],
    capacity: int | None,
    probe: Any,
    cores_per_device: float,
) -> dict[str, Any]:
    """The recommendation (`probe`: the config's ProbeConfig)."""
    best = fitting(ladder, capacity, probe.headroom)
    if best is None:
        return {"batch_size_per_gpu": None, "reason": "no rung fits in memory", "formula": FORMULA}
    b = best["batch_size"]
    target_batch, target_rate = probe.target_global_batch, probe.target_samples_per_s
    gpus = 1
    if target_batch:
        gpus = max(gpus, math.ceil(target_batch / b))
    if target_rate:
        gpus = max(gpus, math.ceil(target_rate / best["samples_per_s"]))
    per_gpu = math.ceil(target_batch / gpus) if target_batch else b
    rate = per_gpu / step_time(ladder, per_gpu)
    per_worker, per_core = loader["samples_per_s_per_worker"], loader["samples_per_s_per_core"]
    need = loader_need(rate, probe.loader_margin, per_worker, per_core)
    here = max(cores_per_device - 1, 0) * per_core  # what this machine's cores can feed
    return {
        "batch_size_per_gpu": per_gpu,
        "max_batch_size_per_gpu": b,
        "gpus": gpus,
        "global_batch": gpus * per_gpu,
        "samples_per_s_per_gpu": rate,
        "expected_samples_per_s": gpus * rate,
        **need,
        "target_global_batch": target_batch,
        "target_samples_per_s": target_rate,
        "this_machine": {
            "cpu_cores_per_device": cores_per_device,
            "loader_samples_per_s_per_device": here,
            "expected_data_wait_frac": max(0.0, 1 - here / rate) if rate > 0 else 0.0,
        },
        "formula": FORMULA,
    }

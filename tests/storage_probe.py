"""Sampling the bytes a build keeps on its store while it runs (tests/core/test_storage_peak.py,
bench/storage_peak.py): a thread lists the output folder over and over and keeps the largest
total, so the figure is a lower bound of the true peak (a sample can fall between two writes)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from mmcurate.core.storage import filesystem


def local_bytes(root: str) -> int:
    """Apparent bytes of every file under a local folder (files vanishing meanwhile skipped)."""
    total = 0
    for folder, _, names in os.walk(root):
        for name in names:
            try:
                total += os.stat(os.path.join(folder, name)).st_size
            except FileNotFoundError:
                continue
    return total


def store_bytes(
    url: str, storage_options: dict[str, Any], sizes: dict[str, int] | None = None
) -> Callable[[], int]:
    """A function that lists `url` on its store (no cached listing) and sums the sizes; with
    `sizes`, it also keeps there the largest size each file was seen at."""
    fs, path = filesystem(url, {**storage_options, "skip_instance_cache": True})

    def total() -> int:
        fs.invalidate_cache()
        try:
            found = fs.find(path, detail=True)
        except FileNotFoundError:
            return 0
        seen = {name: int(info.get("size") or 0) for name, info in found.items()}
        if sizes is not None:
            for name, size in seen.items():
                sizes[name] = max(size, sizes.get(name, 0))
        return sum(seen.values())

    return total


def window_bytes(sizes: dict[str, int], workers: int = 1) -> int:
    """The in-flight window of a build's storage peak: per worker, a candidate tar still read
    while a shard that needs it is written (both on the store at once), and that shard."""
    tars = [size for name, size in sizes.items() if name.endswith(".tar")]
    candidates = [s for n, s in sizes.items() if "/_work/candidates/" in n and n.endswith(".tar")]
    return workers * (max(candidates, default=0) + max(tars, default=0))


class PeakSampler:
    """Calls `measure()` every `interval_s` on a thread until stopped; keeps the peak."""

    def __init__(self, measure: Callable[[], int], interval_s: float = 0.005) -> None:
        self.measure, self.interval_s = measure, interval_s
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="peak-sampler")

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.measure())
            self.samples += 1
            time.sleep(self.interval_s)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.measure())

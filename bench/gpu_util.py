"""Shared parts of the GPU check scripts (bench/gpu_aesthetic.py, bench/gpu_caption.py): GPU
utilisation sampled with NVML (nvidia-ml-py) when it is importable and a GPU answers, else
None; the check's photos, read from gpu_check.sh's shards or made here."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


class Utilisation:
    """`with Utilisation() as u: ...` then `u.mean`: mean GPU busy % every 0.1 s, or None
    where NVML is missing (a CPU run)."""

    def __init__(self) -> None:
        self.readings: list[int] = []
        self.stop = threading.Event()
        self.handle = None
        try:
            import pynvml
        except ImportError:
            return
        try:
            pynvml.nvmlInit()
            self.nvml, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        except pynvml.NVMLError:  # no driver or no GPU: nothing to read
            self.handle = None

    def __enter__(self) -> Utilisation:
        if self.handle is not None:
            self.thread = threading.Thread(target=self.watch, daemon=True)
            self.thread.start()
        return self

    def watch(self) -> None:
        while not self.stop.wait(0.1):
            self.readings.append(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu)

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.handle is not None:
            self.thread.join()

    @property
    def mean(self) -> float | None:
        if not self.readings:
            return None
        return round(sum(self.readings) / len(self.readings), 1)


def photo_rows(shards: Path | None, photos: int, folder: Path) -> list[tuple[bytes, str]]:
    """(JPEG bytes, caption) rows: the shards' samples, or `photos` new ones in `folder`."""
    if shards is not None:
        from mmcurate.core.tario import iter_tar_samples

        rows = []
        for tar in sorted(shards.glob("*.tar")):
            with open(tar, "rb") as f:
                rows += [(s["jpg"], s["txt"].decode()) for s in iter_tar_samples(f)]
        return rows
    from photos import make_photos

    make_photos(folder, photos)
    files = sorted(folder.glob("*.jpg"))
    return [(f.read_bytes(), f.with_suffix(".txt").read_text()) for f in files]

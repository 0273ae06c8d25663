"""Peak memory of this process and everything it started (Ray's raylet, workers, object store).

Sums PSS (proportional set size: a shared page counts once across the processes sharing it)
over the process tree every `interval` seconds, from /proc (Linux only).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def tree(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children(current))
    return found


def pss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def tree_pss(pid: int | None = None) -> int:
    return sum(pss_bytes(p) for p in tree(pid or os.getpid()))


class PeakMemory:
    """`with PeakMemory() as peak: ...; peak.bytes` is the largest tree PSS seen meanwhile."""

    def __init__(self, interval: float = 0.25) -> None:
        self.interval = interval
        self.bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.is_set():
            self.bytes = max(self.bytes, tree_pss())
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.bytes = max(self.bytes, tree_pss())

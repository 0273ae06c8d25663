"""Progress inside long tasks: what a running task has done so far (samples, seconds of video),
for the driver's progress bar while a partition runs (a one-video build would otherwise show
`partitions: 0/1` and nothing else for minutes).

Tasks call `report(units, unit)`. It goes to this process's channel, which the runtime sets
around each task (`channel`), and does nothing without one (unit tests, direct calls). Channels:
- `SharedRow`: the local pool's workers add straight into a shared-memory array (`Counters`)
  the pool made before its workers forked, one row per worker slot; the driver sums the rows.
  No message at all.
- `Batched`: counts held here and handed to a callable at most once per `INTERVAL_S` (and when
  the task ends): a Ray task sends them to its run's tally actor; the isolated decoder child
  sends them over its pipe to its worker, which reports them into its own channel.

Units (`UNITS`): `samples` (source samples through phase A's stages), `video_s` (seconds of video
decoded, once per decoding stage: clip_split's scan, video_frames), `cut_s` (seconds of clips
encoded by clip_split). A leaf module: the standard library only.
"""

from __future__ import annotations

import math
import multiprocessing
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

UNITS = ("samples", "video_s", "cut_s")
LABELS = ("samples {:.0f}", "video {:.0f} s", "cut {:.0f} s")  # the bar's words, per unit
INTERVAL_S = 1.0  # at most one message a second per task, and the driver's refresh period


class Channel(Protocol):
    def add(self, column: int, units: float) -> None: ...

    def close(self) -> None: ...


_CHANNEL: list[Channel] = []  # this process's, while a task runs with one


def report(units: float, unit: str) -> None:
    """Count `units` of `unit` (one of UNITS) as done by the running task."""
    if _CHANNEL and units:
        _CHANNEL[-1].add(UNITS.index(unit), float(units))


def report_counts(counts: Sequence[float]) -> None:
    """Counts per column of UNITS, as a Batched channel hands them (a decoder child's)."""
    for column, units in enumerate(counts):
        if _CHANNEL and units:
            _CHANNEL[-1].add(column, float(units))


@contextmanager
def channel(sink: Channel | None) -> Iterator[None]:
    """`report` goes to `sink` inside the block; it is closed (flushed) as the block ends."""
    if sink is None:
        yield
        return
    _CHANNEL.append(sink)
    try:
        yield
    finally:
        _CHANNEL.remove(sink)
        sink.close()


class Counters:
    """Shared-memory counters, `rows` x len(UNITS) doubles. Made before workers fork (they
    inherit it) or passed to a spawned worker as it starts; each worker writes only its row."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.array = multiprocessing.RawArray("d", rows * len(UNITS))

    def row(self, slot: int) -> SharedRow:
        return SharedRow(self.array, slot * len(UNITS))

    def totals(self) -> list[float]:
        width = len(UNITS)
        values = self.array[:]
        return [sum(values[column::width]) for column in range(width)]

    def since(self, start: Sequence[float]) -> list[float]:
        """The totals less `start` (the totals when a run began)."""
        return [now - then for now, then in zip(self.totals(), start, strict=True)]


class SharedRow:
    """One worker's row of `Counters`: an add is a store to shared memory."""

    def __init__(self, array: Sequence[float], start: int) -> None:
        self.array, self.start = array, start

    def add(self, column: int, units: float) -> None:
        self.array[self.start + column] += units

    def close(self) -> None:
        pass


class Batched:
    """Counts held here, handed to `send` at once, then at most every `interval` s, and at
    `close`. Once a send fails, counts are dropped: progress never fails a task. `total`: all
    it was given."""

    def __init__(self, send: Callable[[list[float]], object], interval: float = INTERVAL_S):
        self.send, self.interval = send, interval
        self.pending = [0.0] * len(UNITS)
        self.total = [0.0] * len(UNITS)
        self.sent_at = -math.inf  # the first counts go at once: the bar moves from the start
        self.lock = threading.Lock()  # a stage's I/O thread may report too
        self.timer: threading.Thread | None = None

    def add(self, column: int, units: float) -> None:
        with self.lock:
            self.pending[column] += units
            self.total[column] += units
        if time.monotonic() - self.sent_at >= self.interval:
            self.flush()

    def flush(self) -> None:
        with self.lock:
            counts, self.pending = self.pending, [0.0] * len(UNITS)
            self.sent_at = time.monotonic()
        if any(counts):
            try:
                self.send(counts)
            # Why broad: a progress message that cannot go (a gone actor, a closed pipe) must
            # never fail the work it describes.
            except Exception:  # noqa: BLE001
                self.send = _drop

    def every_interval(self) -> Batched:
        """Also flush from a thread every `interval` s, so counts held after a task's last
        report still go while it runs on (a Ray task: its sends are thread-safe)."""
        self.closed = threading.Event()
        self.timer = threading.Thread(target=self._tick, name="progress", daemon=True)
        self.timer.start()
        return self

    def _tick(self) -> None:
        while not self.closed.wait(self.interval):
            self.flush()

    def close(self) -> None:
        if self.timer is not None:
            self.closed.set()
            self.timer.join()
        self.flush()


def _drop(counts: list[float]) -> None:
    pass


class Tally:
    """A run's counts on Ray, kept by one actor (the runtime wraps this class): each running
    task's counts so far, by task. A finished task's are dropped, late sends included: its
    total comes back with its result, so the driver counts it exactly once."""

    def __init__(self) -> None:
        self.running: dict[int, list[float]] = {}
        self.finished: set[int] = set()

    def add(self, key: int, counts: list[float]) -> None:
        if key not in self.finished:
            held = self.running.setdefault(key, [0.0] * len(UNITS))
            self.running[key] = [a + b for a, b in zip(held, counts, strict=True)]

    def finish(self, key: int) -> None:
        self.finished.add(key)
        self.running.pop(key, None)

    def live(self) -> list[float]:
        columns = zip([0.0] * len(UNITS), *self.running.values(), strict=True)
        return [sum(column) for column in columns]


class Meter:
    """A progress bar's postfix from what running tasks have done: `refresh` shows what
    `read()` returns (None: nothing new to show) through `show` (tqdm's `set_postfix_str`);
    `tick` refreshes at most every INTERVAL_S (the runtimes' wait loops call it)."""

    def __init__(
        self, show: Callable[[str], object], read: Callable[[], Sequence[float] | None]
    ) -> None:
        self.show, self.read = show, read
        self.shown, self.due = "", 0.0

    def tick(self) -> None:
        now = time.monotonic()
        if now >= self.due:
            self.due = now + INTERVAL_S
            self.refresh()

    def refresh(self) -> None:
        counts = self.read()
        text = "" if counts is None else postfix(counts)
        if text and text != self.shown:
            self.shown = text
            self.show(text)


def add(a: Sequence[float], b: Sequence[float]) -> list[float]:
    return [x + y for x, y in zip(a, b, strict=True)]


def postfix(counts: Sequence[float]) -> str:
    """The bar's words for counts per UNITS: `samples 37, video 41 s`; units at 0 are left out."""
    return ", ".join(
        label.format(count) for label, count in zip(LABELS, counts, strict=True) if count
    )

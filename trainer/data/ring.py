"""The training loader's worker processes and the reusable shared-memory slots they fill.

Why not torch's DataLoader here: it hands over each batch in a fresh shared-memory segment,
which the training process maps, faults in page by page and unmaps again (about 3 ms of its
time per batch measured here, 5% of a step at 90% demand), and its queue protocol costs about
0.5 ms more per batch. Instead each worker process writes its batches into a fixed ring of
slots that the training process maps once, and sends only (ring, slot, keys) through its own
queue. The training process gives a slot back (a semaphore) when it has drawn `hold` more
batches, so a batch's tensors are views that stay valid until then; clone them to keep them
longer. A worker waits for a free slot, so a slot is never overwritten while it may be read.

Batches are taken from the workers in turn, skipping workers that have finished, exactly as a
DataLoader with `in_order=True` takes them: the resume arithmetic (trainer/data/plan.py) relies on
this order.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import random
import traceback
import uuid
from collections import deque
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
from mmcurate.core.storage import release_sessions
from mmcurate.trainer.data.batch import Batch, NoData
from mmcurate.trainer.data.manifest import NoUsableData
from torch.utils.data import DataLoader

WAIT_S = 5.0  # how often a waiting process checks that the other side is still alive
# Views a CUDA training process keeps: the batch whose copy to the device may still run (its
# slot goes back only after the copy's event, trainer/data/prefetch.py) and the one drawn next.
DEVICE_HOLD = 2


class Transport(NamedTuple):
    """How batches reach the training process (`transport`)."""

    rings: bool  # through the loader's own workers' shared-memory rings (RingLoader)
    hold: int | None  # with rings: the most batches (views) the training process keeps at once
    pin_memory: bool  # without rings: a DataLoader's pinned batches, for asynchronous copies


def transport(device_type: str, workers: int, accum_freq: int, device_decode: bool) -> Transport:
    """The training loader's transport, the same on every device: rings whenever there are
    workers. Only `hold` differs: the CPU trains on the views and keeps a step's `accum_freq`
    batches while it draws the next; CUDA keeps device copies and holds `DEVICE_HOLD` views.
    Device decode (variable-size JPEG lists) and no workers take a DataLoader."""
    if not workers or device_decode:
        return Transport(False, None, device_type == "cuda")
    return Transport(True, DEVICE_HOLD if device_type == "cuda" else accum_freq + 1, False)


class Ring:
    """A worker's slots: `images[slot]`, `tokens[slot]`. `free` (worker side only) counts the
    slots the training process has given back; the slots are used in turn."""

    def __init__(self, slots: int, first: Batch, free: Any) -> None:
        self.key = uuid.uuid4().hex
        self.images = torch.empty((slots, *first.images.shape), dtype=first.images.dtype)
        self.tokens = torch.empty((slots, *first.tokens.shape), dtype=first.tokens.dtype)
        for tensor in (self.images, self.tokens):
            tensor.share_memory_()
        self.free = free
        self.written = 0  # worker side only
        self.announced = False  # worker side: whether the training process has the tensors

    def __getstate__(self) -> dict[str, Any]:
        # Why: a semaphore only travels to processes at their start (the worker's copy).
        return {**self.__dict__, "free": None}

    @staticmethod
    def holds(batch: Batch) -> bool:
        """Whether batches like this one can go through a ring (not device-decode lists)."""
        return isinstance(batch.images, torch.Tensor)

    def fits(self, batch: Batch) -> bool:
        images, tokens = batch.images, batch.tokens
        return (
            isinstance(images, torch.Tensor)
            and images.shape == self.images.shape[1:]
            and images.dtype == self.images.dtype
            and tokens.shape == self.tokens.shape[1:]
        )

    def claim(self) -> int:
        """The slot the next batch goes to, once the training process has given it back."""
        while not self.free.acquire(timeout=WAIT_S):
            exit_if_orphaned()
        return self.written % len(self.images)

    def out(self, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[slot], self.tokens[slot]

    def store(self, slot: int, batch: Batch) -> SlotRef | None:
        """`batch` written into the claimed `slot` (unless collate stacked it there already),
        and the message that stands for it; None (and the slot unclaimed) when it does not
        fit the ring."""
        if not self.fits(batch):
            self.free.release()
            return None
        images, tokens = self.out(slot)
        if batch.images.data_ptr() != images.data_ptr():
            images.copy_(batch.images)
        tokens.copy_(batch.tokens)
        self.written += 1
        announce = None if self.announced else self
        ref = SlotRef(
            announce, self.key, slot, batch.keys, batch.skipped, batch.replaced, batch.used
        )
        self.announced = True  # the tensors travel once, with the first message
        return ref


class SlotRef(NamedTuple):
    ring: Ring | None  # the ring itself with a worker's first batch, then None
    key: str
    slot: int
    keys: list[str]
    skipped: tuple[int, ...] = ()  # as in Batch
    replaced: int = 0
    used: list[str] | None = None


class Done(NamedTuple):
    error: str | None  # the worker's traceback, or None when it finished its batches


class RingLoader:
    """`workers` processes (forked) iterating `dataset`, each with a ring of `depth + hold`
    slots; iterate it for `Batch`es. `dataset` must set `ring_free` up for each worker (see
    trainer/data/dataset.py `ShardDataset.start_worker`)."""

    def __init__(self, dataset: Any, workers: int, hold: int, depth: int) -> None:
        if workers < 1 or hold < 1 or depth < 1:
            raise ValueError("RingLoader needs workers, hold and depth of at least 1")
        self.dataset, self.workers, self.hold, self.depth = dataset, workers, hold, depth

    def __iter__(self) -> Iterator[Batch]:
        # Why not a generator itself: as with a DataLoader, the workers start at iter().
        ctx = mp.get_context("fork")
        slots = self.depth + self.hold
        free = [ctx.Semaphore(slots) for _ in range(self.workers)]
        queues = [ctx.Queue() for _ in range(self.workers)]
        stop = ctx.Event()
        seed = int(torch.empty((), dtype=torch.int64).random_().item())  # as a DataLoader's
        processes = [
            ctx.Process(
                target=work,
                args=(
                    self.dataset,
                    worker,
                    self.workers,
                    seed,
                    slots,
                    free[worker],
                    queues[worker],
                    stop,
                    os.getpid(),
                ),
                name=f"mmcurate-loader-{worker}",
                daemon=True,
            )
            for worker in range(self.workers)
        ]
        release_sessions()  # none of this process's storage sessions go into the workers
        for process in processes:
            process.start()
        return self.views(processes, queues, free, stop)

    def views(self, processes: list, queues: list, free: list, stop: Any) -> Iterator[Batch]:
        rings: dict[str, Ring] = {}
        held: deque[tuple[int, bool]] = deque()  # (worker, whether it holds a slot)
        active = list(range(self.workers))
        turn = 0  # index into `active` of the worker whose batch comes next
        try:
            while active:
                worker = active[turn]
                item = receive(worker, processes[worker], queues[worker])
                if isinstance(item, Done):
                    active.pop(turn)  # the next worker in turn moves into this place
                    turn = turn % len(active) if active else 0
                    continue
                turn = (turn + 1) % len(active)
                if isinstance(item, NoData):
                    raise NoUsableData(item.message)
                yield view(item, rings, held, worker)
                while len(held) >= self.hold:  # the next draw: the oldest held slot is free
                    worker, slotted = held.popleft()
                    if slotted:
                        free[worker].release()
        finally:
            stop.set()
            for semaphore in free:  # wake workers waiting for a slot so that they see `stop`
                for _ in range(self.depth + self.hold):
                    semaphore.release()
            for process in processes:
                process.join(timeout=WAIT_S)
                if process.is_alive():
                    process.kill()
                    process.join()


def receive(worker: int, process: Any, messages: Any) -> Any:
    """The worker's next message; raises if it failed or died."""
    while True:
        try:
            item = messages.get(timeout=WAIT_S)
        except queue.Empty:
            if not process.is_alive():
                raise RuntimeError(
                    f"loader worker {worker} died (exit code {process.exitcode})"
                ) from None
            continue
        if isinstance(item, Done) and item.error:
            raise RuntimeError(f"loader worker {worker} failed:\n{item.error}")
        return item


def view(item: Any, rings: dict[str, Ring], held: deque, worker: int) -> Batch:
    if not isinstance(item, SlotRef):  # a batch that did not fit the ring, sent whole
        held.append((worker, False))
        return item
    if item.ring is not None:
        rings[item.key] = item.ring
    held.append((worker, True))
    ring = rings[item.key]
    return Batch(ring.images[item.slot], ring.tokens[item.slot], *item[3:])


_PARENT: list[int] = []  # in a loader worker: the training process's pid


def exit_if_orphaned() -> None:
    """End this loader worker when the training process that started it is gone (killed, or
    left through `os._exit`, which skips the exit handler that stops daemon workers): its
    slots will never be given back, and an orphan would hold its memory and pipes forever."""
    if _PARENT and os.getppid() != _PARENT[0]:
        os._exit(0)


def work(
    dataset: Any,
    worker: int,
    workers: int,
    seed: int,
    slots: int,
    free: Any,
    messages: Any,
    stop: Any,
    parent: int,
) -> None:
    """A worker process: the dataset's batches for this worker, into its ring, in order.
    `parent`: the training process's pid, taken before the fork (it may already be gone)."""
    _PARENT[:] = [parent]
    exit_if_orphaned()
    torch.set_num_threads(1)  # as DataLoader workers: the cores are the workers'
    torch.manual_seed(seed + worker)
    random.seed(seed + worker)
    batch_priority()
    dataset.start_worker(worker, workers, slots, free)
    try:
        for item in dataset:
            if stop.is_set():
                break
            exit_if_orphaned()  # batches sent whole never wait for a slot
            messages.put(item)
        exit_if_orphaned()  # nobody would read it: exiting would wait on a full pipe
        messages.put(Done(None))
    except BaseException:  # noqa: BLE001 - handed to the training process, which raises it
        messages.put(Done(traceback.format_exc()))
    # Why wait for the loader's end: a batch sent whole (not in the ring) lives in shared
    # memory that is unlinked once this process has exited, unless the training process has
    # opened it already; it reads the workers in turn, so it may not have yet.
    while not stop.wait(WAIT_S):
        exit_if_orphaned()
    messages.cancel_join_thread()  # nobody reads any more: exit without flushing


def batch_priority(_worker: int = 0) -> None:
    """Loader workers run as SCHED_BATCH (Linux): as much CPU as before, but a waking
    training thread takes a busy core at once instead of after the workers' time slice
    (`bench/loaders/handover.py`: a ready item took 3.2 ms (median) to reach the training
    thread with two busy workers on 2 cores, 0.5 ms with this)."""
    with contextlib.suppress(AttributeError, OSError):  # not Linux, or not permitted
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))


class Batches:
    """A DataLoader whose iterators can be closed (which stops its workers) like a
    RingLoader's."""

    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[Batch]:
        if self.loader.num_workers:
            release_sessions()  # none of this process's storage sessions go into the workers
        return closable(iter(self.loader))


def closable(items: Iterator[Batch | NoData]) -> Iterator[Batch]:
    for item in items:
        if isinstance(item, NoData):
            raise NoUsableData(item.message)
        yield item

"""Stream a build's WebDataset shards (local or any fsspec URL) as ready training batches.

Each loader worker follows its part of the epoch plan (trainer/data/plan.py), epoch after epoch: it
reads only its shard runs, front to back, holds raw samples until the shuffle buffer emits
them, and yields whole batches: `Batch(images, tokens, keys)`. The workers are the loader's own
processes with reused shared-memory slots (trainer/data/ring.py) on the CPU and on CUDA alike (a
DataLoader's only with device decode or no workers: `make_loader`). Images leave the workers
as uint8 after the geometric part of the train transform (trainer/data/transform.py; 4x less to
pass between processes than float); the float conversion and normalization run on the training
GPU (`ImageTransform.finish`), or in the workers when training on the CPU. Shards are read by
trainer/data/reader.py: through the node's cache or streamed, verified against the manifest first,
and skipped (counted, logged) when unusable.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
from mmcurate.core.manifest import Manifest
from mmcurate.trainer.data.batch import Batch, NoData
from mmcurate.trainer.data.collate import BatchDecoding, trained_member
from mmcurate.trainer.data.hold import SampleStore
from mmcurate.trainer.data.manifest import NoUsableData
from mmcurate.trainer.data.plan import (
    Layout,
    Piece,
    Segment,
    WorkerPlan,
    batches_per_rank,
    epoch_pieces,
    mixed,
    worker_plan,
)
from mmcurate.trainer.data.reader import ShardReader
from mmcurate.trainer.data.ring import Batches, Ring, RingLoader, SlotRef, batch_priority
from mmcurate.trainer.data.transform import (
    ImageTransform,
)
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

log = logging.getLogger(__name__)

# Batches each worker may have ready ahead of the training step (torch's default is 2): the
# deeper queue absorbs the workers' jitter (shard opens, slow samples, epoch restarts).
PREFETCH_BATCHES = 4


@dataclass
class Counters:
    """Per-worker sample accounting (logged when a worker finishes an epoch)."""

    samples: int = 0
    substituted: int = 0  # undecodable or missing samples replaced to keep batches full
    reported: int = 0  # of `substituted`, those already passed on with a batch


class ShardDataset(BatchDecoding, IterableDataset):
    """Yields `Batch`es of one rank's share of `epochs` epochs from `set_epoch`'s (one by
    default; None: endless), continuing mid-epoch after `resume_at`. Every rank yields the
    same number of batches per epoch (`batches_per_epoch`), whatever the shard sizes.

    The workers go on from one epoch to the next themselves, so one set of workers serves a
    whole run: no fork, no shutdown and no drained queue at epoch boundaries."""

    def __init__(
        self,
        manifest: Manifest | Sequence[tuple[Manifest, float]],
        transform: ImageTransform,
        tokenizer: Callable[..., torch.Tensor],
        batch_size: int,
        seed: int = 0,
        shuffle_buffer: int = 1000,
        rank: int = 0,
        world: int = 1,
        step_batches: int = 1,
        device_decode: bool = False,
        decode_threads: int = 2,
        finish_in_workers: bool = False,
        storage_options: dict[str, Any] | None = None,
        cache: tuple[str, int] | None = None,
        verify: bool = True,
        shuffle_buffer_bytes: int | None = None,
    ) -> None:
        self.shards, self.sources = mixed(manifest)
        self.epoch_samples = sum(source.quota for source in self.sources)
        self.transform, self.tokenizer = transform, tokenizer
        self.batch_size, self.seed, self.shuffle_buffer = batch_size, seed, shuffle_buffer
        self.rank, self.world, self.step_batches = rank, world, step_batches
        # Why the check: device decode needs the split transform to crop on the device.
        self.device_decode = device_decode and transform.pil is not None
        # Training on the CPU: normalize in the workers too, so the training process (also
        # on the CPU) gets float batches and only trains.
        self.finish_in_workers = finish_in_workers and not self.device_decode
        self.decode_threads = decode_threads
        # (process id, pool): made on first use in each process. Why the pid: a forked
        # worker inherits the pool object but none of its threads.
        self._pool: tuple[int, ThreadPoolExecutor] | None = None
        self.storage_options = dict(storage_options or {})
        self.cache_spec = cache  # (folder, byte limit): read shards through a local ShardCache
        self.verify = verify  # streamed shards: check size and sha256 before using them
        self.used_member = trained_member  # which members of a sample the reader keeps
        # In-memory bytes of held raw samples (shuffle buffer; a streamed shard being checked)
        self.shuffle_buffer_bytes = shuffle_buffer_bytes  # None: trainer/data/hold.py's default
        self._reader: tuple[int, ShardReader] | None = None  # (process id, reader), as _pool
        self.epoch = 0
        self.epochs: int | None = 1  # epochs one iteration runs through; None: endless
        self.resume: tuple[int, int] | None = None  # (epoch, batches the rank consumed)
        self.counters = Counters()
        # In a RingLoader worker (trainer/data/ring.py): its place, and its slots.
        self.worker_place: tuple[int, int] | None = None
        self.ring_slots, self.ring_free = 0, None
        self._ring: Ring | None = None  # this worker's, made with its first batch
        self._last: Batch | None = None  # its previous batch (one with no usable sample repeats it)

    def __getstate__(self) -> dict[str, Any]:
        # Why: a thread pool cannot be pickled (a spawned worker makes its own).
        return {**self.__dict__, "_pool": None, "_reader": None, "_last": None}

    def start_worker(self, worker: int, workers: int, slots: int, free: Any) -> None:
        """Called in a RingLoader worker: its place, and the slots of its ring."""
        self.worker_place = (worker, workers)
        self.ring_slots, self.ring_free = slots, free

    def set_epoch(self, epoch: int, epochs: int | None = 1) -> None:
        """The next iteration starts at `epoch` and runs through `epochs` epochs (None:
        endless). Why before iter(loader): the workers copy these values when they start."""
        if epochs is None and self.batches_per_epoch() == 0:  # would spin, yielding nothing
            raise ValueError(
                f"no full step ({self.step_batches} batches of {self.batch_size}) in an epoch of "
                f"{self.epoch_samples} samples for each of {self.world} ranks: an endless stream "
                "would never yield"
            )
        self.epoch, self.epochs = epoch, epochs

    def resume_at(self, epoch: int, consumed_batches: int) -> None:
        """Continue `epoch` after the rank's first `consumed_batches` batches."""
        self.resume = (epoch, consumed_batches)

    def batches_per_epoch(self, epoch: int | None = None) -> int:
        """Batches this rank yields in a full epoch (`epoch`'s; the same on every rank)."""
        return batches_per_rank(self.epoch_samples, self.world, self.batch_size, self.step_batches)

    def pieces(self, epoch: int) -> list[Piece]:
        """The epoch's samples as shuffled pieces of shards (ResplitDataset's: what is left)."""
        return epoch_pieces(self.sources, self.seed, epoch)

    def plan(self, epoch: int, layout: Layout, consumed: int) -> WorkerPlan:
        return worker_plan(
            self.pieces(epoch),
            self.seed,
            epoch,
            layout,
            self.batch_size,
            self.shuffle_buffer,
            consumed_batches=consumed,
            multiple=self.step_batches,
        )

    def __iter__(self) -> Iterator[Batch | SlotRef]:
        # Why not a generator: the start is fixed here, when the DataLoader calls iter().
        consumed = self.resume[1] if self.resume and self.resume[0] == self.epoch else 0
        return self.stream(self.epoch, consumed, self.epochs)

    def stream(
        self, epoch: int, consumed: int, epochs: int | None
    ) -> Iterator[Batch | SlotRef | NoData]:
        """This worker's batches, epoch after epoch. The DataLoader takes batches from its
        workers round-robin, starting at worker 0, so the epoch plan's worker ids are rotated
        by the batches taken before each epoch: after a resume (the `consumed` batches) and
        at every later epoch, the next batch then comes from the worker the plan gives it.
        Ends with NoData when no shard holds a usable sample."""
        info = get_worker_info()
        worker, workers = self.worker_place or ((info.id, info.num_workers) if info else (0, 1))
        taken = -consumed  # batches all workers yielded in this iteration before `epoch`
        last = None if epochs is None else epoch + epochs - 1
        self._last = None
        try:
            while last is None or epoch <= last:
                layout = Layout(self.rank, self.world, (worker - taken) % workers, workers)
                yield from self.batches(self.plan(epoch, layout, consumed), epoch)
                taken += self.batches_per_epoch(epoch)
                epoch, consumed = epoch + 1, 0
        except NoUsableData as err:
            yield NoData(str(err))

    def batches(self, plan: WorkerPlan, epoch: int) -> Iterator[Batch | SlotRef]:
        samples = self.emitted(plan)
        for _ in range(plan.batches):
            yield self.send([next(samples) for _ in range(self.batch_size)], epoch)
        if self.counters.substituted:
            log.warning(
                "epoch %d: %d of %d samples were unusable and replaced by others of their batch",
                epoch,
                self.counters.substituted,
                self.counters.samples,
            )

    def send(self, raws: list[tuple[int, dict[str, Any] | None]], epoch: int) -> Batch | SlotRef:
        """The next batch, collated into this worker's next ring slot when there is one, with
        what the worker found unusable since its previous batch."""
        ring = self._ring
        slot = ring.claim() if ring else None
        batch = self.collate(raws, self._last, epoch, ring.out(slot) if slot is not None else None)
        counters = self.counters
        batch = batch._replace(
            skipped=self.reader().take_skipped(), replaced=counters.substituted - counters.reported
        )
        counters.reported = counters.substituted
        if ring is None and self.ring_free is not None and Ring.holds(batch):
            ring = self._ring = Ring(self.ring_slots, batch, self.ring_free)
            slot = ring.claim()
        sent = ring.store(slot, batch) if slot is not None else None
        if slot is not None and sent is None:  # sent whole: it may lie in the freed slot
            batch = batch._replace(images=batch.images.clone(), tokens=batch.tokens.clone())
        self._last = batch
        return sent or batch

    def emitted(self, plan: WorkerPlan) -> Iterator[tuple[int, dict[str, Any] | None]]:
        """(position, raw sample) in the plan's emission order, holding read-ahead samples
        until their turn; None for a position its shard did not hold."""
        reader = self.read_positions(plan.segments)
        pending = SampleStore(self.shuffle_buffer_bytes)  # past its bytes, media wait on disk
        try:
            for position in plan.emit:
                while position not in pending:
                    found = next(reader)  # every planned position comes, None when unreadable
                    if plan.emit.fresh(found[0]):  # not emitted before a resume
                        pending.put(*found)
                yield position, pending.pop(position)
        finally:
            pending.close()

    def read_positions(
        self, runs: Sequence[Segment]
    ) -> Iterator[tuple[int, dict[str, Any] | None]]:
        """(epoch position, raw sample or None) for every position of the runs, in order."""
        return self.reader().positions(runs)

    def reader(self) -> ShardReader:
        """This process's shard reader (made after a worker forks, like its cache handle)."""
        if self._reader is None or self._reader[0] != os.getpid():
            reader = ShardReader(
                *(self.shards, self.storage_options, self.cache_spec, self.verify),
                used=self.used_member,
                hold_bytes=self.shuffle_buffer_bytes,
            )
            self._reader = (os.getpid(), reader)
        return self._reader[1]


def make_loader(
    dataset: ShardDataset, workers: int, pin_memory: bool = False, hold: int | None = None
) -> RingLoader | Batches:
    """Loader worker processes that build whole batches; batches come from the workers in
    turn, which the resume arithmetic relies on.

    With `hold` (the training loop), the loader's own workers pass batches through reused
    shared-memory slots (trainer/data/ring.py): each batch's tensors are then views that stay
    valid until `hold` more batches are drawn; pass the most batches the caller keeps at
    once. Without it (or with device decode, whose batches vary in size, or no workers), a
    DataLoader passes them the ordinary way."""
    if workers:
        # Why process-wide: torch has no per-loader option. Tensors pass as named shared
        # memory files instead of file descriptors, which the training process would have to
        # fetch from each busy worker's sharing thread (about 5 ms a batch measured here).
        torch.multiprocessing.set_sharing_strategy("file_system")
    if hold and workers and not dataset.device_decode:
        return RingLoader(dataset, workers, hold, PREFETCH_BATCHES)
    loader = DataLoader(
        dataset,
        batch_size=None,
        num_workers=workers,
        pin_memory=pin_memory,
        prefetch_factor=PREFETCH_BATCHES if workers else None,
        in_order=True,
        worker_init_fn=batch_priority,
    )
    return Batches(loader)

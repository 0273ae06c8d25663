"""What a training script iterates for `mmcurate.video_loader`: `VideoLoader` hands out one
epoch of a rank's batches per iteration, from loader workers that live across epochs.

Why one stream of epochs: a DataLoader iterated once per epoch forks its workers anew each
time, so every epoch began with an empty pipeline (the workers' start, their first shard
opens and decodes, with nothing queued: the training loop waited for all of it) and ended
with one draining (the last worker's batches alone on the cores). Here the workers run
through epoch after epoch on their own (ShardDataset's endless stream: `set_epoch(epoch,
None)`), already decoding the next epoch's first batches while the loop takes the current
one's last, and the loader hands out exactly `len(self)` batches per iteration.

The stream is kept while the next batch it yields is the one the loader's place asks for,
(epoch, batches consumed, step): after a whole epoch, `set_epoch(epoch + 1)` continues it;
after a `break`, iterating again continues the same epoch from the same workers. Any other
place (`load_state_dict`, `set_epoch` to another epoch, an epoch iterated again) closes it and
starts workers at that place, which is exactly what the plan gives there (resume arithmetic:
trainer/data/plan.py). `close()` (or the loader's end) stops the workers.

Queue depth: each worker may have `prefetch_batches(...)` batches ready ahead of the step,
as many as fit in `prefetch_bytes` (of its largest batch), at least 2, at most 8. With
workers, a thread of the training process takes them ahead of the loop (receiver.py).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from mmcurate.trainer.data.batch_buffers import SENT_KEY
from mmcurate.trainer.data.receiver import Receiver
from mmcurate.trainer.data.ring import Batches, batch_priority
from mmcurate.trainer.data.video_windows import Skipped, phase_at, scaled_size
from torch.utils.data import DataLoader

if TYPE_CHECKING:
    from mmcurate.trainer.data.video_dataset import VideoDataset
    from mmcurate.trainer.data.video_windows import Phase

PREFETCH_BYTES = 192 << 20  # batches a worker may hold ready, in bytes (prefetch_batches)


def prefetch_batches(dataset: VideoDataset, budget: int = PREFETCH_BYTES) -> int:
    """Batches a worker queues ahead of the step: as many of its largest batch (the largest
    bucket at the schedule's largest frames and size) as fit in `budget`, 2 to 8. Why not
    a fixed count: a 44 MB full-size batch and a 2 MB 144p one need different depths to
    ride out the same decode-time spread."""
    most = max(
        math.prod(scaled_size(*map(int, name.split("x")), phase.area)) * phase.frames
        for name in dataset.labels.names or ("1x1",)
        for phase in dataset.phases
    )
    return max(2, min(8, budget // max(1, most * 3 * dataset.batch_size)))


class VideoLoader:
    """What a training script iterates: one epoch of this rank's batches per iteration, each a
    dict with `video` (uint8 [B, T, C, H, W]), `txt`, `__key__`, `bucket` ("WxH") and
    `frame_start`. `set_epoch(n)` before an epoch; `state_dict()` after any batch, and
    `load_state_dict(state)` on a new loader continues that epoch exactly. `step` counts the
    batches handed out since training began (across epochs): the schedule's clock. The
    workers persist across epochs (module docstring); `close()` stops them."""

    def __init__(
        self,
        dataset: VideoDataset,
        workers: int,
        prefetch: int | None = None,
        epochs: int | None = None,
    ) -> None:
        self.dataset, self.workers = dataset, workers
        # Epochs 0 .. epochs - 1 are the run's: the workers stop after the last instead of
        # decoding batches of one nobody takes (None: they always run on).
        self.epochs = epochs
        self.prefetch = prefetch or prefetch_batches(dataset)
        if workers:
            # As trainer/data/dataset.py's make_loader: batches pass as named shared-memory
            # files, not descriptors fetched from each busy worker (process-wide in torch).
            torch.multiprocessing.set_sharing_strategy("file_system")
            # Buffers a worker may have in use: the one it decodes, `prefetch` queued, and
            # its share of those the training process holds (receiver.py: the one being
            # taken, one ready, the loop's, one kept, one being let go; batch_buffers.py).
            dataset.keep_sent = self.prefetch + 5
        self.loader = Batches(
            DataLoader(
                dataset,
                batch_size=None,
                num_workers=workers,
                prefetch_factor=self.prefetch if workers else None,
                in_order=True,  # round-robin: the resume arithmetic relies on it
                worker_init_fn=batch_priority,
            )
        )
        self.epoch, self.consumed = 0, 0  # batches of `epoch` this loader has handed out
        self.step = 0
        self.skipped = 0  # planned batches none of whose clips decoded (not handed out)
        # The open stream of epochs, and the place (epoch, consumed, step) of its next batch.
        self._stream: tuple[Iterator[Any], tuple[int, int, int]] | None = None
        # Why at exit too: multiprocessing's own exit hook would kill the daemon workers,
        # which then leave their spill folders behind; stopped first, they remove them.
        self._open: list[Iterator[Any]] = []  # the stream, for the exit hook (not self)
        weakref.finalize(self, close_streams, self._open)

    @property
    def buckets(self) -> tuple[str, ...]:
        return self.dataset.labels.names

    @property
    def dropped(self) -> dict[str, int]:
        """Samples left out of this epoch, by reason (too_short, no_video, unreadable)."""
        self.dataset.first_step = self.step - self.consumed
        return self.dataset.index.dropped(self.dataset.epoch_frames(self.epoch))

    def phase(self) -> Phase:
        """The schedule's phase of the next batch."""
        return phase_at(self.dataset.phases, self.step)

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.consumed = epoch, 0

    def state_dict(self) -> dict[str, Any]:
        data = self.dataset
        return {
            **{"epoch": self.epoch, "consumed": self.consumed, "step": self.step},
            **{"seed": data.seed, "frames": data.window, "batch_size": data.batch_size},
            **{"rank": data.rank, "world": data.world, "schedule": schedule_of(data.phases)},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at `state`'s place; the plan must be the same (seed, frames, batch,
        world, schedule)."""
        mine = self.state_dict()
        for name in ("seed", "frames", "batch_size", "world", "schedule"):
            if state.get(name, mine[name]) != mine[name]:
                raise ValueError(
                    f"loader state has {name}={state[name]}, this loader {mine[name]}: "
                    "an exact resume needs the same plan"
                )
        self.epoch, self.consumed = int(state["epoch"]), int(state["consumed"])
        self.step = int(state.get("step", self.consumed))

    def __len__(self) -> int:
        self.dataset.first_step = self.step - self.consumed
        return self.dataset.batches_per_epoch(self.epoch)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self.consumed >= len(self):  # the epoch was finished: iterate it again
            self.consumed = 0
        total = len(self)
        batches = self.stream()
        last = None
        while self.consumed < total:
            try:
                batch = next(batches)
            except StopIteration:  # past the `epochs` it was told of: new workers from here
                self.close()
                batches = self.stream()
                continue
            except Exception:  # a worker failed: the next iteration starts new workers
                self.close()
                raise
            self.consumed, self.step = self.consumed + 1, self.step + 1
            place = (self.epoch, self.consumed, self.step)
            self._stream = (
                batches,
                place if self.consumed < total else (self.epoch + 1, 0, self.step),
            )
            if isinstance(batch, Skipped):  # no clip of it decoded: counted
                self.skipped += 1
                if last is None or self.dataset.world == 1:
                    continue
                batch = last  # with ranks, every rank must take the same number of steps
            if isinstance(batch, dict):
                batch.pop(SENT_KEY, None)  # the worker's marker (batch_buffers.Sent)
            last = batch
            yield batch

    def stream(self) -> Iterator[Any]:
        """The open stream when its next batch is this loader's next, else a new one from
        this place (the old one's workers stopped)."""
        place = (self.epoch, self.consumed, self.step)
        if self._stream is not None and self._stream[1] == place:
            return self._stream[0]
        self.close()
        # Why here: the workers copy the dataset's place when the stream starts.
        self.dataset.first_step = self.step - self.consumed
        # The workers go on from epoch to epoch, through the run's last when it is known.
        left = None if self.epochs is None else max(1, self.epochs - self.epoch)
        self.dataset.set_epoch(self.epoch, left)
        self.dataset.resume_at(self.epoch, self.consumed)
        batches = iter(self.loader)
        if self.workers:  # taken from the workers in a thread, ahead of the loop
            batches = Receiver(batches)
        self._stream = (batches, place)
        self._open.append(batches)
        return batches

    def close(self) -> None:
        """Stop the workers (a later iteration starts new ones at the loader's place)."""
        self._stream = None
        close_streams(self._open)  # its DataLoader iterator goes, and stops its workers

    def __enter__(self) -> VideoLoader:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def close_streams(streams: list[Any]) -> None:
    """Close the open streams (the loader's close and its exit hook)."""
    while streams:
        streams.pop().close()


def schedule_of(phases: Any) -> list[list[Any]]:
    """The phases as the state keeps them (plain lists: a checkpoint round-trips them)."""
    return [[p.step, p.frames, p.size] for p in phases]

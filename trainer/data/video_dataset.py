"""The dataset behind `mmcurate.video_loader` (trainer/data/video_loader.py): batches of random
temporal windows of a build's video clips, one
bucket (frame size) per batch, for an outside training script (docs/recipes.md).

It is the bucketed image loader (trainer/data/buckets.py, trainer/data/bucket_plan.py) with clips
for images, so everything that loader guarantees carries over unchanged: the epoch plan is
a pure function of (seed, epoch, world), every rank yields the same number of batches, each
clip with a window comes exactly once per epoch, and a resume from (epoch, batches consumed)
continues exactly; shards come through the node's shard cache or streamed and verified.

- Which clips: the loader first indexes every sample's bucket and frame count
  (trainer/data/video_windows.py's ClipIndex). A `video_buckets` build has both in its shard
  metadata parquets (`bucket`, `num_frames`): read, no tar opened. Other builds' shards are
  read once when the loader is made and each clip's first frame decoded (its size is its
  bucket, "WxH"). Clips with fewer frames than the window, no video or an unreadable one are
  left out, counted by reason (`loader.dropped`).
- Which window: `window_start(seed, epoch, key, frames, T)`, so the same seed gives the same
  windows, another epoch others, and a resumed run the ones it would have drawn.
- How: each loader worker streams its shard runs; a clip waits for its batch in memory while
  the worker's waiting clips hold at most `shuffle_buffer_bytes` (64 MiB by default), else on
  local disk (a clip bigger than that goes to a file as it is read: never whole in memory).
  decord decodes the T frames from the keyframe before the window (video_windows.py states
  the bound), from the bytes or the file, which is then removed; a clip bigger than
  `shuffle_buffer_bytes` is decoded by PyAV instead (decode_window_bounded: decord reads
  packets ahead, which for such a clip is much memory; docs/scale.md gives the bound). A
  clip that cannot be decoded (or is not its bucket's size) is replaced by another clip of its
  batch (counted in the worker's log: `decode_failed`, `off_bucket`); a batch with none is
  skipped (`VideoLoader.skipped`). Windows are decoded into the batch's tensor, in shared
  memory in a worker (a buffer reused once no other process holds it: batch_buffers.py): it
  reaches the training process with no copy.
- Progressive resolution (`schedule`): phases from a global step (batches handed out since
  training began, kept in the state), each with its window length and frame size
  (video_windows.py). The rank's batch i of an epoch begun at step S is step S + i (as the
  DataLoader takes them from its workers, round-robin: VideoDataset.turn) on every rank:
  its phase's frames, and its bucket scaled to the phase's area (decord scales as it
  decodes). An epoch is planned with the most frames of the phases it reaches, so a switch
  needs no re-plan and a resume (epoch, batches consumed, step) replays the same batches.
- One-frame clips (images `video_buckets` took): their frame repeated T times, frame_start 0.
- Epochs: the loader workers run on from one epoch into the next (VideoDataset.stream keeps
  each epoch's first step), so one set of workers serves a run (trainer/data/video_epochs.py).
"""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from mmcurate.core.manifest import Manifest
from mmcurate.core.spill import Spilled
from mmcurate.trainer.data.batch import NoData
from mmcurate.trainer.data.batch_buffers import SENT_KEY, BatchBuffers, Buffer, Sent
from mmcurate.trainer.data.bucket_plan import (
    BucketEpoch,
    BucketWorkerPlan,
    epoch_labels,
    plan_epoch,
    worker_range,
)
from mmcurate.trainer.data.buckets import (
    BucketDataset,
    BucketLabels,
    caption,
    parse_bucket,
)
from mmcurate.trainer.data.hold import DEFAULT_LIMIT
from mmcurate.trainer.data.manifest import NoUsableData
from mmcurate.trainer.data.plan import Layout, epoch_pieces
from mmcurate.trainer.data.video_clips import (
    ClipReader,
    ClipStore,
    release_sample,
    video_member,
)
from mmcurate.trainer.data.video_windows import (
    ClipIndex,
    Phase,
    Skipped,
    clip_window,
    decode_window,
    decode_window_bounded,
    epoch_window,
    phase_at,
    scaled_size,
)
from torch.utils.data import get_worker_info

log = logging.getLogger(__name__)


class Clip(NamedTuple):
    key: str
    text: str
    start: int


class VideoDataset(BucketDataset):
    """BucketDataset whose samples are windows of clips (module docstring): `window` frames,
    or each batch its phase's frames and size when `phases` (parse_schedule's) are given."""

    def __init__(
        self,
        manifest: Manifest | Sequence[tuple[Manifest, float]],
        batch_size: int,
        window: int,
        index: ClipIndex,
        phases: Sequence[Phase] | None = None,
        **options: Any,
    ) -> None:
        if window < 1:
            raise ValueError(f"frames must be at least 1, not {window}")
        self.window, self.index = window, index
        self.phases = tuple(phases or (Phase(0, window),))
        self.first_step = 0  # the global step the current epoch began at (set by the loader)
        self._window: tuple[tuple[int, int], int] | None = None  # ((epoch, first step), T)
        self._planned: int | None = None  # the window self.labels are for
        self._layout: Layout | None = None  # this worker's place in the epoch (set by `plan`)
        self.held_peak = 0  # the most bytes of waiting clips held in memory at once
        self.failed: dict[str, int] = {}  # clips replaced in this worker, by reason
        self.threads = options.pop("threads", 1)  # decord's, per clip (decode_threads)
        self.keep_sent = 0  # batch buffers a worker keeps (batch_buffers.py; set by the loader)
        self._buffers: tuple[int, BatchBuffers] | None = None  # (process id, its buffers)
        labels = BucketLabels(index.names, index.labels(self.phases[0].frames))
        super().__init__(manifest, batch_size, labels=labels, **options)

    def epoch_frames(self, epoch: int) -> int:
        """The window `epoch` is planned with (video_windows.epoch_window)."""
        counts = {phase.frames for phase in self.phases}
        if len(counts) == 1:
            return counts.pop()
        place = (epoch, self.first_step)
        if self._window is None or self._window[0] != place:
            most = len(self.plan_for(epoch, min(counts))) // self.world
            self._window = (place, epoch_window(self.phases, self.first_step, most))
        return self._window[1]

    def plan_for(self, epoch: int, window: int) -> BucketEpoch:
        labels = epoch_labels(
            epoch_pieces(self.sources, self.seed, epoch), self.index.labels(window)
        )
        return plan_epoch(
            *(labels, self.batch_size, self.seed, epoch, self.world),
            multiple=self.step_batches,
            shuffle_buffer=self.shuffle_buffer,
        )

    def epoch_plan(self, epoch: int) -> BucketEpoch:
        window = self.epoch_frames(epoch)
        if self._planned != window:  # planned with another window: plan again
            self.labels = BucketLabels(self.index.names, self.index.labels(window))
            self._epoch, self._planned = None, window
        return super().epoch_plan(epoch)

    def plan(self, epoch: int, layout: Layout, consumed: int) -> BucketWorkerPlan:
        self._layout = layout  # what `turn` needs: this worker's place
        return super().plan(epoch, layout, consumed)

    def stream(self, epoch: int, consumed: int, epochs: int | None) -> Iterator[Any]:
        """ShardDataset's stream of epochs (its rotation of the workers' places after each
        epoch), each epoch begun at its own global step: the previous one's plus its batches
        (the loader hands out exactly that many, skipped ones counted), so a worker running
        on into the next epoch (trainer/data/video_epochs.py) plans it with the schedule's
        window and phases as the training process does."""
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        taken, first = -consumed, self.first_step
        stop = None if epochs is None else epoch + epochs
        try:
            while stop is None or epoch < stop:
                self.first_step = first
                layout = Layout(self.rank, self.world, (worker - taken) % workers, workers)
                yield from self.batches(self.plan(epoch, layout, consumed), epoch)
                self.first_step = first  # as the epoch's plan had it
                total = self.batches_per_epoch(epoch)
                taken, first, epoch, consumed = taken + total, first + total, epoch + 1, 0
        except NoUsableData as err:
            yield NoData(str(err))

    def turn(self, k: int, total: int) -> int:
        """Where the epoch's batch k comes in this rank's epoch: the DataLoader takes its
        workers' batches round-robin (worker p's j-th batch is the rank's j * workers + p)."""
        layout = self._layout or Layout(self.rank, self.world, 0, 1)
        first, _ = worker_range(total, layout)
        return (k - first) * layout.workers + layout.worker

    def reader(self) -> ClipReader:
        if self._reader is None or self._reader[0] != os.getpid():
            reader = ClipReader(
                *(self.shards, self.storage_options, self.cache_spec, self.verify),
                hold_bytes=self.shuffle_buffer_bytes,
                clip_bytes=self.hold_limit(),
            )
            self._reader = (os.getpid(), reader)
        return self._reader[1]  # type: ignore[return-value]

    def hold_limit(self) -> int:
        limit = self.shuffle_buffer_bytes
        return DEFAULT_LIMIT if limit is None else limit

    def batches(self, plan: BucketWorkerPlan, epoch: int) -> Iterator[dict[str, Any]]:  # type: ignore[override]
        epoch_plan = self.epoch_plan(epoch)
        frames = epoch_labels(self._epoch[1], self.index.frames)  # each position's clip frames
        for k, raws in zip(plan.batches, self.clip_samples(plan), strict=True):
            bucket = self.labels.names[int(epoch_plan.bucket[k])]
            phase = phase_at(self.phases, self.first_step + self.turn(k, len(epoch_plan)))
            yield self.clip_batch(raws, frames, (bucket, phase), epoch)
        if self.failed:
            log.warning("epoch %d: clips replaced by others of their batch: %s", epoch, self.failed)

    def clip_samples(self, plan: BucketWorkerPlan) -> Iterator[list]:
        """[(position, raw sample or None)] of each planned batch. Samples read before their
        batch wait in a ClipStore: at most `shuffle_buffer_bytes` of clips in memory."""
        epoch_plan = self._epoch[2]
        reader = self.read_positions(plan.segments)
        wanted = {int(p) for k in plan.batches for p in epoch_plan.batch(k)}
        pending = ClipStore(self.hold_limit(), self.reader().folder_path())
        try:
            for k in plan.batches:
                positions = [int(p) for p in epoch_plan.batch(k)]
                for position in positions:
                    while position not in pending:
                        found, sample = next(reader)
                        if found in wanted:
                            pending.put(found, sample)
                            self.held_peak = max(self.held_peak, pending.bytes)
                        else:  # a read-past gap
                            release_sample(sample)
                yield [(position, pending.pop(position)) for position in positions]
        finally:
            pending.close()

    def clip_batch(
        self, raws: list, frames: np.ndarray, where: tuple[str, Phase], epoch: int
    ) -> dict[str, Any] | Skipped:
        """One batch, every window decoded into its tensor; a failed clip replaced by another
        of the batch; a batch with none is skipped (Skipped, counted)."""
        bucket, phase = where
        width, height = scaled_size(*parse_bucket(bucket), phase.area)
        shape = (len(raws), phase.frames, height, width, 3)
        buffer = self.batch_buffer(shape)  # None outside a loader worker
        video = torch.empty(shape, dtype=torch.uint8) if buffer is None else buffer.tensor
        slots = video.numpy()
        clips = [
            self.clip(raw, int(frames[p]), where, epoch, slots[i])
            for i, (p, raw) in enumerate(raws)
        ]
        good = [i for i, clip in enumerate(clips) if clip is not None]
        if not good:
            if buffer is not None:
                BatchBuffers.unused(buffer)
            self.fail("batch_skipped")
            return Skipped(bucket, len(raws))
        for i, clip in enumerate(clips):
            if clip is None:  # another clip of the batch in its place
                clips[i] = clips[good[i % len(good)]]
                slots[i] = slots[good[i % len(good)]]
        batch = {
            # [B, T, C, H, W], a view: a transposing copy here cost more than decoding (0.34 s
            # per 44 MB batch); the step's own copy (to the GPU, to float) does it for free
            "video": video.permute(0, 1, 4, 2, 3),
            "txt": [clip.text for clip in clips],
            "__key__": [clip.key for clip in clips],
            "bucket": bucket,
            "frame_start": [clip.start for clip in clips],
        }
        if buffer is not None:  # pickled after `video`: the buffer was handed over
            batch[SENT_KEY] = Sent(buffer)
        return batch

    def batch_buffer(self, shape: tuple[int, ...]) -> Buffer | None:
        """In a loader worker, a shared-memory batch tensor, reused once no other process
        holds it (trainer/data/batch_buffers.py); None in the training process itself."""
        if get_worker_info() is None:
            return None
        if self._buffers is None or self._buffers[0] != os.getpid():
            self._buffers = (os.getpid(), BatchBuffers(self.keep_sent))
        return self._buffers[1].take(shape)

    def clip(
        self,
        raw: dict[str, Any] | None,
        frames: int,
        where: tuple[str, Phase],
        epoch: int,
        slot: np.ndarray,
    ) -> Clip | None:
        """The sample's window at its phase's length and size, written into `slot` ([T, H,
        W, 3]); None (counted) when it cannot be decoded or is not its bucket's size."""
        if raw is None:
            return self.fail("unreadable")
        bucket, phase = where
        try:
            value = video_member(raw)
            if value is None:
                return self.fail("no_video")
            start, count = clip_window(self.seed, epoch, raw["__key__"], frames, phase.frames)
            own = parse_bucket(bucket)
            scale = None if slot.shape[2:0:-1] == own else slot.shape[2:0:-1]
            out = slot[:count]
            if isinstance(value, Spilled) and value.size > self.hold_limit():
                video = decode_window_bounded(value.path, start, count, scale)
            else:  # waited in memory (decoded from its bytes) or in a file
                source = value.path if isinstance(value, Spilled) else io.BytesIO(value)
                video = decode_window(source, start, count, scale, out, self.threads)
            if video.shape != out.shape:
                return self.fail("off_bucket")
            if video is not out:
                out[...] = video
            if count < phase.frames:  # a one-frame clip (an image): its frame, T times
                slot[count:] = out[0]
            return Clip(raw["__key__"], caption(raw), start)
        except Exception:  # noqa: BLE001 - decord raises its own errors for every bad file
            return self.fail("decode_failed")
        finally:
            release_sample(raw)

    def fail(self, reason: str) -> None:
        self.failed[reason] = self.failed.get(reason, 0) + 1

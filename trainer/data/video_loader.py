"""`mmcurate.video_loader`: batches of random temporal windows of a build's video clips, one
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
- How: each loader worker streams its shard runs; a clip's tar member goes to a local file as
  it is read (never whole in memory), decord decodes the T frames from the keyframe before
  the window (video_windows.py states the bound), and the file is removed. A clip that cannot
  be decoded (or is not its bucket's size) is replaced by another clip of its batch (counted
  in the worker's log: `decode_failed`, `off_bucket`), so batches stay full and ranks equal.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any, NamedTuple

import fsspec
import numpy as np
import pyarrow.parquet as pq
import torch
from mmcurate.core.spill import Spilled, release, remove_folder, spill_bytes, spill_folder
from mmcurate.core.tario import SpillTo, iter_tar_samples
from mmcurate.trainer.data.bucket_plan import BucketWorkerPlan, epoch_labels
from mmcurate.trainer.data.buckets import BucketDataset, BucketLabels, caption, metadata_url
from mmcurate.trainer.data.dataset import make_loader
from mmcurate.trainer.data.manifest import Manifest, NoUsableData, Shard, read_manifest
from mmcurate.trainer.data.plan import mixed
from mmcurate.trainer.data.reader import ShardReader
from mmcurate.trainer.data.video_windows import (
    VIDEO_MEMBERS,
    ClipIndex,
    ClipInfo,
    decode_window,
    index_clips,
    probe_clip,
    window_start,
)

log = logging.getLogger(__name__)

INDEX_THREADS = 4  # shards indexed at once when the loader is made
CLIP_MEMBERS = VIDEO_MEMBERS | {"txt", "json"}  # what a worker reads of a sample


class ClipReader(ShardReader):
    """A ShardReader whose samples hold their video member as a local file (a Spilled),
    streamed to disk as the tar is read: a worker never holds a clip in memory."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.folder: tuple[int, str] | None = None  # (process id, spill folder)

    def folder_path(self) -> str:
        """This process's folder for clip files (made after a worker forks)."""
        if self.folder is None or self.folder[0] != os.getpid():
            self.folder = (os.getpid(), spill_folder())
            # Why: the folder outlives no reader (nor its process, which runs finalizers at exit).
            weakref.finalize(self, remove_folder, self.folder[1])
        return self.folder[1]

    def parse(self, f: IO[bytes], start: int, stop: int | None) -> Iterator[dict]:
        spill = SpillTo(self.folder_path(), -1, VIDEO_MEMBERS)  # every clip, whatever its size
        return iter_tar_samples(f, start, stop, spill=spill, columns=CLIP_MEMBERS)


def video_member(sample: dict[str, Any]) -> Any:
    return next((sample[ext] for ext in sorted(VIDEO_MEMBERS) if ext in sample), None)


def release_sample(sample: dict[str, Any] | None) -> None:
    if sample is not None:
        release(sample.values())


def clip_path(value: Any, folder: str) -> tuple[str, Spilled | None]:
    """A local path for a clip value, and the file made for it (bytes: written out)."""
    if isinstance(value, Spilled):
        return value.path, None
    made = spill_bytes(bytes(value), folder)
    return made.path, made


def probe_sample(sample: dict[str, Any] | None, folder: str) -> ClipInfo:
    """What one sample's clip is (its first frame decoded), or why it is none."""
    if sample is None:
        return ClipInfo(None, reason="unreadable")
    value = video_member(sample)
    if value is None:
        release_sample(sample)
        return ClipInfo(None, reason="no_video")
    path, made = clip_path(value, folder)
    try:
        bucket, frames = probe_clip(path)
        return ClipInfo(bucket, frames)
    except Exception:  # noqa: BLE001 - decord raises its own errors for every bad file
        return ClipInfo(None, reason="unreadable")
    finally:
        release_sample(sample)
        release([made])


def metadata_clips(shard: Shard, storage_options: dict[str, Any]) -> list[ClipInfo] | None:
    """The shard's clips from its metadata parquet (a video_buckets build); None without."""
    try:
        with fsspec.open(metadata_url(shard), "rb", **storage_options) as f:
            table = pq.ParquetFile(f)
            if not {"bucket", "num_frames"} <= set(table.schema_arrow.names):
                return None
            rows = table.read(columns=["bucket", "num_frames"]).to_pylist()
    except Exception:  # noqa: BLE001 - no parquet, or unreadable: index from the tar instead
        return None
    if len(rows) != shard.samples or any(r["bucket"] is None for r in rows):
        return None
    return [ClipInfo(r["bucket"], int(r["num_frames"] or 0)) for r in rows]


def shard_clips(reader: ClipReader, index: int, storage_options: dict[str, Any]) -> list[ClipInfo]:
    shard = reader.shards[index]
    found = metadata_clips(shard, storage_options)
    if found is not None:
        return found
    folder = reader.folder_path()
    clips = [probe_sample(sample, folder) for sample in reader.samples(index)]
    return clips + [ClipInfo(None, reason="unreadable")] * (shard.samples - len(clips))


def read_index(
    shards: Sequence[Shard],
    storage_options: dict[str, Any] | None = None,
    cache: tuple[str, int] | None = None,
    verify: bool = True,
) -> ClipIndex:
    """Every shard's clips (metadata parquets, else the shards read once; several at once)."""
    options = dict(storage_options or {})
    reader = ClipReader(shards, options, cache, verify)
    with ThreadPoolExecutor(INDEX_THREADS, "mmcurate-clips") as pool:
        found = list(pool.map(lambda i: shard_clips(reader, i, options), range(len(shards))))
    return index_clips(found)


class Clip(NamedTuple):
    video: np.ndarray  # uint8 [T, H, W, 3]
    key: str
    text: str
    start: int


class VideoDataset(BucketDataset):
    """BucketDataset whose samples are windows of `window` frames of clips (module docstring)."""

    def __init__(
        self,
        manifest: Manifest | Sequence[tuple[Manifest, float]],
        batch_size: int,
        window: int,
        index: ClipIndex,
        **options: Any,
    ) -> None:
        if window < 1:
            raise ValueError(f"frames must be at least 1, not {window}")
        self.window, self.index = window, index
        self.failed: dict[str, int] = {}  # clips replaced in this worker, by reason
        labels = BucketLabels(index.names, index.labels(window))
        super().__init__(manifest, batch_size, labels=labels, **options)

    def reader(self) -> ClipReader:
        if self._reader is None or self._reader[0] != os.getpid():
            reader = ClipReader(
                *(self.shards, self.storage_options, self.cache_spec, self.verify),
                hold_bytes=self.shuffle_buffer_bytes,
            )
            self._reader = (os.getpid(), reader)
        return self._reader[1]  # type: ignore[return-value]

    def batches(self, plan: BucketWorkerPlan, epoch: int) -> Iterator[dict[str, Any]]:  # type: ignore[override]
        epoch_plan = self.epoch_plan(epoch)
        frames = epoch_labels(self._epoch[1], self.index.frames)  # each position's clip frames
        previous = None
        for k, raws in zip(plan.batches, self.clip_samples(plan), strict=True):
            bucket = self.labels.names[int(epoch_plan.bucket[k])]
            previous = self.clip_batch(raws, frames, bucket, epoch, previous)
            yield previous
        if self.failed:
            log.warning("epoch %d: clips replaced by others of their batch: %s", epoch, self.failed)

    def clip_samples(self, plan: BucketWorkerPlan) -> Iterator[list]:
        """[(position, raw sample or None)] of each planned batch. Samples read before their
        batch wait here; each holds its clip as a local file, so memory stays small."""
        epoch_plan = self._epoch[2]
        reader = self.read_positions(plan.segments)
        wanted = {int(p) for k in plan.batches for p in epoch_plan.batch(k)}
        pending: dict[int, dict[str, Any] | None] = {}
        try:
            for k in plan.batches:
                positions = [int(p) for p in epoch_plan.batch(k)]
                for position in positions:
                    while position not in pending:
                        found, sample = next(reader)
                        if found in wanted:
                            pending[found] = sample
                        else:  # a read-past gap
                            release_sample(sample)
                yield [(position, pending.pop(position)) for position in positions]
        finally:
            for sample in pending.values():
                release_sample(sample)

    def clip_batch(
        self, raws: list, frames: np.ndarray, bucket: str, epoch: int, previous: Any
    ) -> dict[str, Any]:
        """One batch: every clip's window decoded; a failed one replaced by another clip of
        the batch; a batch with none is the previous batch again."""
        clips = [self.clip(raw, int(frames[p]), bucket, epoch) for p, raw in raws]
        good = [clip for clip in clips if clip is not None]
        if not good:
            if previous is None:
                raise NoUsableData(f"no clip of a batch of bucket {bucket} could be decoded")
            return previous
        filled = [c if c is not None else good[i % len(good)] for i, c in enumerate(clips)]
        video = torch.from_numpy(np.stack([clip.video for clip in filled]))
        return {
            "video": video.permute(0, 1, 4, 2, 3).contiguous(),  # channels before H, W
            "txt": [clip.text for clip in filled],
            "__key__": [clip.key for clip in filled],
            "bucket": bucket,
            "frame_start": [clip.start for clip in filled],
        }

    def clip(self, raw: dict[str, Any] | None, frames: int, bucket: str, epoch: int) -> Clip | None:
        """The sample's window, decoded; None (counted) when it cannot be."""
        if raw is None:
            return self.fail("unreadable")
        made = None
        try:
            value = video_member(raw)
            if value is None:
                return self.fail("no_video")
            path, made = clip_path(value, self.reader().folder_path())
            start = window_start(self.seed, epoch, raw["__key__"], frames, self.window)
            video = decode_window(path, start, self.window)
            height, width = self.labels.size(self.labels.names.index(bucket))
            if video.shape[1:3] != (height, width):
                return self.fail("off_bucket")
            return Clip(video, raw["__key__"], caption(raw), start)
        except Exception:  # noqa: BLE001 - decord raises its own errors for every bad file
            return self.fail("decode_failed")
        finally:
            release_sample(raw)
            release([made])

    def fail(self, reason: str) -> None:
        self.failed[reason] = self.failed.get(reason, 0) + 1


class VideoLoader:
    """What a training script iterates: one epoch of this rank's batches per iteration, each a
    dict with `video` (uint8 [B, T, C, H, W]), `txt`, `__key__`, `bucket` ("WxH") and
    `frame_start`. `set_epoch(n)` before an epoch; `state_dict()` after any batch, and
    `load_state_dict(state)` on a new loader continues that epoch exactly."""

    def __init__(self, dataset: VideoDataset, workers: int) -> None:
        self.dataset = dataset
        self.loader = make_loader(dataset, workers)
        self.epoch, self.consumed = 0, 0  # batches of `epoch` this loader has handed out

    @property
    def buckets(self) -> tuple[str, ...]:
        return self.dataset.labels.names

    @property
    def dropped(self) -> dict[str, int]:
        """Samples left out of every epoch, by reason (too_short, no_video, unreadable)."""
        return self.dataset.index.dropped(self.dataset.window)

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.consumed = epoch, 0

    def state_dict(self) -> dict[str, Any]:
        data = self.dataset
        return {
            "epoch": self.epoch,
            "consumed": self.consumed,
            **{"seed": data.seed, "frames": data.window, "batch_size": data.batch_size},
            **{"rank": data.rank, "world": data.world},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at `state`'s place; the plan must be the same (seed, frames, batch, world)."""
        mine = self.state_dict()
        for name in ("seed", "frames", "batch_size", "world"):
            if state.get(name, mine[name]) != mine[name]:
                raise ValueError(
                    f"loader state has {name}={state[name]}, this loader {mine[name]}: "
                    "an exact resume needs the same plan"
                )
        self.epoch, self.consumed = int(state["epoch"]), int(state["consumed"])

    def __len__(self) -> int:
        return self.dataset.batches_per_epoch(self.epoch)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self.consumed >= len(self):  # the epoch was finished: iterate it again
            self.consumed = 0
        # Why here: the workers copy the dataset's place when iteration starts.
        self.dataset.set_epoch(self.epoch, 1)
        self.dataset.resume_at(self.epoch, self.consumed)
        for batch in self.loader:
            self.consumed += 1
            yield batch


def video_loader(
    manifest: str | Manifest | Sequence[tuple[Manifest, float]],
    batch_size: int,
    frames: int,
    *,
    seed: int = 0,
    rank: int = 0,
    world: int = 1,
    workers: int = 2,
    storage_options: dict[str, Any] | None = None,
    cache: tuple[str, int] | None = None,
    verify: bool = True,
    **options: Any,
) -> VideoLoader:
    """A window loader over a build's manifest (a path or URL, a Manifest, or weighted
    Manifests). `options` are ShardDataset's: shuffle_buffer (in clips), step_batches."""
    if isinstance(manifest, str):
        manifest = read_manifest(manifest, storage_options)
    shards, _ = mixed(manifest)
    index = read_index(shards, storage_options, cache, verify)
    dataset = VideoDataset(
        *(manifest, batch_size, frames, index),
        **(options | {"seed": seed, "rank": rank, "world": world}),
        **{"storage_options": storage_options, "cache": cache, "verify": verify},
    )
    return VideoLoader(dataset, workers)

"""Video clips for the window loader (trainer/data/video_loader.py): what each clip of a build
is (its bucket and frame count), where its window starts each epoch, and the window decoded.

Pure parts (no video needed): `ClipIndex` holds, per shard, every sample's bucket label and
frame count, and gives the labels the bucketed plan (trainer/data/bucket_plan.py) takes for a
window length T: a clip with fewer than T frames, no video or an unreadable one gets no label
and so is left out of every epoch (counted by reason: `too_short`, `no_video`,
`unreadable`). `window_start` is a function of (seed, epoch, key, frames, T) only, so every
rank and worker draws the same window for a clip, and a resume draws it again.

Decoding (`decode_window`): decord opens the clip by path (a local file: the tar member
streamed to disk, never held in memory) with one thread, seeks once to the window's first
frame and reads T frames in order: decord seeks to the keyframe at or before the window and
decodes forward from there, so the work is at most (GOP length + T) frames and the memory
the T decoded frames plus decord's packet index (O(frames of the clip), a few dozen bytes a
frame), never the whole clip.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
from mmcurate.core.formats import VIDEO_COLUMNS
from mmcurate.trainer.data.bucket_plan import NO_BUCKET

VIDEO_MEMBERS = frozenset(VIDEO_COLUMNS)  # member extensions read as a clip


@dataclass(frozen=True)
class ClipInfo:
    """One sample as the loader sees it: its bucket ("WxH") and frames, or why it has none."""

    bucket: str | None
    frames: int = 0
    reason: str | None = None  # no_video | unreadable (set when bucket is None)


@dataclass(frozen=True)
class ClipIndex:
    """Every shard's clips: bucket labels (indices into `names`, NO_BUCKET for none) and frame
    counts, one entry per sample in shard order."""

    names: tuple[str, ...]  # "WxH", sorted by (width, height)
    buckets: tuple[np.ndarray, ...]  # int16 per shard
    frames: tuple[np.ndarray, ...]  # int32 per shard (0 where unknown)
    reasons: dict[str, int] = field(default_factory=dict)  # samples with no clip, by reason

    def labels(self, window: int) -> tuple[np.ndarray, ...]:
        """Each shard's labels for windows of `window` frames (shorter clips: NO_BUCKET)."""
        return tuple(
            np.where(frames >= window, buckets, NO_BUCKET).astype(np.int16)
            for buckets, frames in zip(self.buckets, self.frames, strict=True)
        )

    def dropped(self, window: int) -> dict[str, int]:
        """Samples left out of every epoch, by reason, for windows of `window` frames."""
        short = sum(
            int(np.count_nonzero((buckets != NO_BUCKET) & (frames < window)))
            for buckets, frames in zip(self.buckets, self.frames, strict=True)
        )
        out = dict(self.reasons)
        if short:
            out["too_short"] = short
        return out


def bucket_key(name: str) -> tuple[int, int]:
    width, _, height = name.partition("x")
    return (int(width), int(height)) if width.isdigit() and height.isdigit() else (0, 0)


def index_clips(shards: list[list[ClipInfo]]) -> ClipIndex:
    """A ClipIndex from each shard's ClipInfo list."""
    names = tuple(sorted({c.bucket for s in shards for c in s if c.bucket}, key=bucket_key))
    number = {name: i for i, name in enumerate(names)}
    buckets = tuple(
        np.array([number[c.bucket] if c.bucket else NO_BUCKET for c in s], dtype=np.int16)
        for s in shards
    )
    frames = tuple(
        np.array([c.frames if c.bucket else 0 for c in s], dtype=np.int32) for s in shards
    )
    reasons: dict[str, int] = {}
    for clip in (c for s in shards for c in s if not c.bucket):
        reason = clip.reason or "unreadable"
        reasons[reason] = reasons.get(reason, 0) + 1
    return ClipIndex(names, buckets, frames, reasons)


def window_start(seed: int, epoch: int, key: str, frames: int, window: int) -> int:
    """Where the clip's window of `window` frames begins this epoch (uniform over the
    frames - window + 1 starts); the same in every process for the same arguments."""
    if frames < window:
        raise ValueError(f"{key}: {frames} frames, fewer than the window's {window}")
    return random.Random(f"{seed}:{epoch}:{key}").randrange(frames - window + 1)


def probe_clip(path: str) -> tuple[str, int]:
    """(bucket "WxH" of its decoded frames, frame count as decord indexes it) of a clip."""
    reader = open_clip(path)
    height, width = reader[0].shape[:2]  # one frame: decord gives no size without decoding
    return f"{width}x{height}", len(reader)


def decode_window(path: str, start: int, window: int) -> np.ndarray:
    """Frames [start, start + window) of the clip at `path`: uint8 [T, H, W, 3]. One seek
    (to the keyframe at or before `start`, decoding forward to it), then T frames in order."""
    reader = open_clip(path)
    if start < 0 or start + window > len(reader):
        raise ValueError(f"window {start}+{window} outside the clip's {len(reader)} frames")
    reader.seek_accurate(start)
    return np.stack([rgb(reader.next()) for _ in range(window)])


def rgb(frame: object) -> np.ndarray:
    """A decord frame as [H, W, 3]. Why not get_batch: decord 0.6/decord2 copies a frame whose
    RGB rows are padded (e.g. 48 pixels wide: 144 bytes, kept as 192) as [H, W, 4] and
    get_batch then fails; the rows are the RGB bytes then padding, so they are cut back."""
    array = np.asarray(frame.asnumpy() if hasattr(frame, "asnumpy") else frame)
    height, width = array.shape[:2]
    if array.shape[2] == 3:
        return array
    return np.ascontiguousarray(array.reshape(height, -1)[:, : width * 3].reshape(height, width, 3))


def open_clip(path: str):  # noqa: ANN201 - decord's VideoReader (imported lazily)
    from decord import VideoReader, cpu

    # One thread: the loader's workers are the parallelism; more would oversubscribe.
    return VideoReader(path, ctx=cpu(0), num_threads=1)

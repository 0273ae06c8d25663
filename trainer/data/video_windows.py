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
frame), never the whole clip. decord reads packets ahead of the decoder, which for a clip of
huge packets (lossless, 4K) is much memory: clips bigger than the loader's clip budget are
decoded by `decode_window_bounded` (PyAV: packets read as decoded).

Progressive resolution (`Phase`, `parse_schedule`): a schedule of phases, each from a global
step (batches the loader has handed out since training began) with its window length and
frame size; `epoch_window` is the window an epoch is planned with, `scaled_size` a bucket's
frame size in a phase. One-frame clips (images that `video_buckets` took) fit any window:
their frame is repeated T times (`clip_window`).
"""

from __future__ import annotations

import ctypes
import math
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

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
            np.where(fits_window(frames, window), buckets, NO_BUCKET).astype(np.int16)
            for buckets, frames in zip(self.buckets, self.frames, strict=True)
        )

    def dropped(self, window: int) -> dict[str, int]:
        """Samples left out of every epoch, by reason, for windows of `window` frames."""
        short = sum(
            int(np.count_nonzero((buckets != NO_BUCKET) & ~fits_window(frames, window)))
            for buckets, frames in zip(self.buckets, self.frames, strict=True)
        )
        out = dict(self.reasons)
        if short:
            out["too_short"] = short
        return out


def fits_window(frames: np.ndarray, window: int) -> np.ndarray:
    """Which clips can give a window: enough frames, or one frame (an image: repeated)."""
    return (frames >= window) | (frames == 1)


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


def clip_window(seed: int, epoch: int, key: str, frames: int, window: int) -> tuple[int, int]:
    """(first frame, frames to decode) of the clip's window: a one-frame clip (an image)
    decodes its frame, which the loader repeats `window` times."""
    if frames == 1:
        return 0, 1
    return window_start(seed, epoch, key, frames, window), window


@dataclass(frozen=True)
class Phase:
    """From global step `step` on: windows of `frames` frames, each bucket scaled to the
    pixel area `area` (None: the bucket's own size)."""

    step: int
    frames: int
    area: int | None = None
    size: str | None = None  # as given ("256x144", "144p"), for the state and messages


def size_area(size: str) -> int:
    """Pixels of a schedule size: "WxH" -> W*H; "Np" -> the N-line 16:9 frame's (the
    video_buckets preset's class budget: "360p" is 640 x 360)."""
    text = size.strip().lower()
    if text.endswith("p") and text[:-1].isdigit() and int(text[:-1]) > 0:
        lines = int(text[:-1])
        return round(lines * 16 / 9) * lines
    width, _, height = text.partition("x")
    if width.isdigit() and height.isdigit() and int(width) > 0 and int(height) > 0:
        return int(width) * int(height)
    raise ValueError(f'schedule size {size!r} is not "WxH" or "<lines>p" (e.g. "640x360", "360p")')


def parse_schedule(schedule: Sequence[dict[str, Any]] | None, frames: int) -> tuple[Phase, ...]:
    """The phases of a schedule ([{"step", "size", "frames"}], steps increasing); `frames`
    and the buckets' own size hold before its first step and where an entry leaves them
    out. ValueError (one line) for a bad entry."""
    phases = [Phase(0, frames)]
    for number, entry in enumerate(schedule or ()):
        if not isinstance(entry, dict) or set(entry) - {"step", "size", "frames"}:
            raise ValueError(f"schedule entry {entry!r}: give step, and size and/or frames")
        step, count = entry.get("step"), entry.get("frames", frames)
        first = number == 0 and step == 0  # replaces the default phase
        if not isinstance(step, int) or step < 0 or (step <= phases[-1].step and not first):
            raise ValueError(f"schedule step {step!r}: whole numbers from 0, increasing")
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ValueError(f"schedule frames {count!r} at step {step}: at least 1")
        size = entry.get("size")
        area = None if size is None else size_area(str(size))
        if first:
            phases.pop()
        phases.append(Phase(step, count, area, None if size is None else str(size)))
    return tuple(phases)


def phase_at(phases: Sequence[Phase], step: int) -> Phase:
    """The phase in effect at global step `step`."""
    return next(p for p in reversed(phases) if p.step <= step)


def epoch_window(phases: Sequence[Phase], first_step: int, most_batches: int) -> int:
    """The window an epoch is planned with: the most frames of any phase in effect during
    [first_step, first_step + most_batches), so every clip of its plan has enough frames for
    every phase the epoch reaches. `most_batches`: its batches when planned with the fewest
    frames of the schedule (fewer frames never leave fewer clips, so never fewer batches)."""
    stop = first_step + max(most_batches, 1)
    active = [
        p.frames
        for p, after in zip(phases, [*phases[1:], None], strict=True)
        if p.step < stop and (after is None or after.step > first_step)
    ]
    return max(active)


def scaled_size(width: int, height: int, area: int | None) -> tuple[int, int]:
    """A bucket's (width, height) in a phase: its shape at `area` pixels, sides rounded to
    multiples of 8 (at least 8), never above the bucket's own (no upscaling)."""
    if area is None or area >= width * height:
        return width, height
    scale = math.sqrt(area / (width * height))
    return (
        min(width, max(8, round(width * scale / 8) * 8)),
        min(height, max(8, round(height * scale / 8) * 8)),
    )


def probe_clip(path: str) -> tuple[str, int]:
    """(bucket "WxH" of its decoded frames, frame count as decord indexes it) of a clip."""
    reader = open_clip(path)
    height, width = reader[0].shape[:2]  # one frame: decord gives no size without decoding
    return f"{width}x{height}", len(reader)


def decode_window(
    path: Any,
    start: int,
    window: int,
    size: tuple[int, int] | None = None,
    out: np.ndarray | None = None,
    threads: int = 1,
) -> np.ndarray:
    """Frames [start, start + window) of the clip at `path` (or a file object): uint8
    [T, H, W, 3], from the keyframe at or before `start` onwards; with `size` (width,
    height), scaled by the decoder as it goes. One `get_batch` call (measured 2x faster than
    a seek and T `next` calls); the frame-by-frame path where get_batch fails (`rgb`).
    `out` (C-contiguous uint8 [T, H, W, 3]): written there and returned; frames of another
    shape are returned as they are (the caller compares). `threads`: decord's decoding threads."""
    reader = open_clip(path, size, threads)
    if start < 0 or start + window > len(reader):
        raise ValueError(f"window {start}+{window} outside the clip's {len(reader)} frames")
    try:
        frames = reader.get_batch(list(range(start, start + window)))
        if len(frames.shape) == 4 and frames.shape[0] == window and frames.shape[3] == 3:
            return copy_frames(frames, out)
    except Exception:  # noqa: BLE001 - decord's own error type for padded rows
        pass
    if hasattr(path, "seek"):
        path.seek(0)
    reader = open_clip(
        path, size, threads
    )  # a fresh reader: the failed call may have moved this one
    reader.seek_accurate(start)
    stacked = np.stack([rgb(reader.next()) for _ in range(window)])
    if out is not None and out.shape == stacked.shape:
        out[...] = stacked
        return out
    return stacked


def copy_frames(frames: Any, out: np.ndarray | None) -> np.ndarray:
    """decord's frames as numpy: into `out` when it has their shape (one copy, straight
    into the batch's shared memory: asnumpy and a stack would be two more), else a new array."""
    if out is None or tuple(frames.shape) != out.shape or not out.flags.c_contiguous:
        return frames.asnumpy()
    from decord._ffi.base import _LIB, check_call

    pointer = out.ctypes.data_as(ctypes.c_void_p)
    check_call(_LIB.DECORDArrayCopyToBytes(frames.handle, pointer, ctypes.c_size_t(out.nbytes)))
    return out


def decode_window_bounded(
    path: str, start: int, window: int, size: tuple[int, int] | None = None
) -> np.ndarray:
    """decode_window for a clip too big to hold (the loader's choice, by its size): PyAV
    reads packets only as it decodes (decord reads ahead: a window of a 1.2 GiB lossless
    720p clip took up to 1.1 GB above its baseline, bench/video_loader.py), seeks to the
    keyframe at or before the window and converts only the window's frames. Memory: the
    decoder's reference frames, one packet, and the T frames. The frame number comes from
    each frame's time at the stream's average rate (a constant rate, as video_buckets
    writes); a seek that lands past the window (another rate) is an error."""
    import av

    out: list[np.ndarray] = []
    with av.open(path) as box:
        stream = box.streams.video[0]
        stream.codec_context.thread_count = 1
        origin = stream.start_time or 0
        per_frame = 1 / (stream.average_rate * stream.time_base)
        box.seek(int(origin + start * per_frame), stream=stream, backward=True)
        for frame in box.decode(stream):
            index = round((frame.pts - origin) / per_frame)
            if index > start and not out:
                raise ValueError(f"frame {index} came before frame {start}: not a constant rate")
            if index >= start:
                width, height = size or (frame.width, frame.height)
                out.append(frame.to_ndarray(format="rgb24", width=width, height=height))
                if len(out) == window:
                    break
    if len(out) < window:
        raise ValueError(f"window {start}+{window}: the clip ended after {len(out)} frames")
    return np.stack(out)


def rgb(frame: object) -> np.ndarray:
    """A decord frame as [H, W, 3]. Why decode_window needs this path: decord 0.6/decord2
    copies a frame whose RGB rows are padded (e.g. 48 pixels wide: 144 bytes, kept as 192) as
    [H, W, 4] and get_batch then fails; the rows are the RGB bytes then padding, cut back."""
    array = np.asarray(frame.asnumpy() if hasattr(frame, "asnumpy") else frame)
    height, width = array.shape[:2]
    if array.shape[2] == 3:
        return array
    return np.ascontiguousarray(array.reshape(height, -1)[:, : width * 3].reshape(height, width, 3))


def open_clip(path: Any, size: tuple[int, int] | None = None, threads: int = 1):  # noqa: ANN201 - decord's reader
    from decord import VideoReader, cpu

    width, height = size or (-1, -1)
    # One thread by default: the loader's workers are the parallelism (decode_threads).
    return VideoReader(path, ctx=cpu(0), num_threads=threads, width=width, height=height)


def decode_threads(workers: int) -> int:
    """decord threads per loader worker: the process's cores shared among its workers (one
    each when there are as many workers as cores; more would only oversubscribe them)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, cores // max(workers, 1))


class Skipped(NamedTuple):
    """In place of a batch none of whose clips could be decoded: the loader counts it
    (`VideoLoader.skipped`) and hands out nothing for it (with several ranks, the rank's
    previous batch again, so that ranks keep equal steps); it still counts as a planned batch
    (resume and schedule arithmetic)."""

    bucket: str
    clips: int

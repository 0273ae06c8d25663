"""Cut a video into clips (pure; runs in the isolated decoder process).

Boundaries: `fixed` windows of `window_s` every `stride_s`; or `scenes`: hard cuts where the
mean absolute difference of consecutive analysed frames (grey, 32x32, `analysis_fps` frames a
second) exceeds `threshold` (0-255). Clips shorter than `min_clip_s` are left out. A clip that
is the whole video keeps the source value; any other is re-encoded with PyAV (H.264 in mp4,
same size and frame rate, video only, upright), whatever the source's container (webm, mkv,
mov, avi): its column is CLIP_CONTAINER, so the member's extension names what it holds.
Times are the frames' own timestamps, so a variable-frame-rate video is cut where its frames
are shown.

The source is bytes or a Spilled file (read by path as it is decoded, never whole). Given a
`prefix` (a folder and a name start), each clip is encoded straight into its own file
`<prefix>-<n>.mp4` and comes back as a Spilled value, so no clip is ever held in memory;
without one (direct calls) clips come back as bytes.
"""

from __future__ import annotations

import io
import math
import os
import shutil
from collections.abc import Callable
from fractions import Fraction
from typing import Any, NamedTuple

import av
import numpy as np
from mmcurate.core.progress import report
from mmcurate.core.spill import Media, Spilled
from mmcurate.stages.lib.video_decode import NoFrames, Watched, upright
from mmcurate.stages.lib.video_probe import NoVideoStream, media_source, refuse_images

CLIP_CONTAINER = "mp4"  # what ClipWriter writes: a re-encoded clip's column and extension


def fixed_bounds(duration: float, window: float, stride: float) -> list[tuple[float, float]]:
    bounds, start = [], 0.0
    while start < duration - 1e-9:
        bounds.append((round(start, 6), round(min(duration, start + window), 6)))
        start += stride
    return bounds


def scene_bounds(cuts: list[float], duration: float) -> list[tuple[float, float]]:
    edges = [0.0, *sorted(c for c in cuts if 0 < c < duration), duration]
    return [(round(a, 6), round(b, 6)) for a, b in zip(edges[:-1], edges[1:], strict=True)]


def scene_cuts(frames: list[np.ndarray], times: list[float], threshold: float) -> list[float]:
    """Times of the analysed frames that differ from the previous one by more than threshold."""
    cuts = []
    for prev, cur, t in zip(frames[:-1], frames[1:], times[1:], strict=True):
        if float(np.abs(cur.astype(np.int16) - prev.astype(np.int16)).mean()) > threshold:
            cuts.append(t)
    return cuts


class Scan(NamedTuple):
    count: int
    fps: float  # average
    size: tuple[int, int]  # coded width, height
    rotation: int  # display rotation, degrees counterclockwise
    times: np.ndarray  # each frame's time in seconds, ascending
    small: list[tuple[float, np.ndarray]]  # (time, grey 32x32) of the analysed frames


def scan(
    value: Media,
    analysis_fps: float | None,
    watched: Watched | None = None,
    on_frame: Callable[[Any], None] | None = None,
) -> Scan:
    """Pass 1, streaming: frame count, times, size, and (for scene cuts) small grey copies of
    frames `analysis_fps` a second, chosen by their timestamps (variable frame rates too).
    `on_frame` is given every decoded frame in order (transnetv2 scores them as they come).
    Seconds scanned are reported as decoded (core/progress.py)."""
    refuse_images(value)
    watched = watched or Watched()
    with av.open(media_source(value)) as box:
        if not box.streams.video:
            raise NoVideoStream("no video stream")
        stream = box.streams.video[0]
        stream.codec_context.thread_count = 1
        fps = float(stream.average_rate or 25)
        times: list[float] = []
        size, rotation, small, due, origin = (0, 0), 0, [], -math.inf, 0.0
        for frame in box.decode(stream):
            size, t = (frame.width, frame.height), frame_time(frame, len(times), fps)
            if not times:  # a negative first time (B-frame delay) counts as 0
                rotation, origin = int(round(getattr(frame, "rotation", 0) or 0)), min(t, 0.0)
            t -= origin
            if analysis_fps and t + 0.5 / fps >= due:  # half a frame early is on time
                small.append((t, grey_small(frame.to_ndarray(format="rgb24"))))
                due = (math.floor((t + 0.5 / fps) * analysis_fps) + 1) / analysis_fps
            times.append(t)
            if on_frame is not None:
                on_frame(frame)
            watched.to(t)
    if not times:
        raise NoFrames("no frames")
    stamps = np.maximum.accumulate(np.asarray(times, dtype=np.float64))
    return Scan(len(times), fps, size, rotation % 360, stamps, small)


def header_seconds(value: Media) -> float:
    """The video's length as its container states it, without decoding (0.0: none stated)."""
    with av.open(media_source(value)) as box:
        if box.duration:
            return max(0.0, box.duration / av.time_base)
        streams = box.streams.video
        if streams and streams[0].duration and streams[0].time_base:
            return max(0.0, float(streams[0].duration * streams[0].time_base))
    return 0.0


def frame_time(frame: Any, number: int, fps: float) -> float:
    return float(frame.time) if frame.time is not None else number / fps


def end_time(times: np.ndarray, fps: float) -> float:
    """When the last frame ends: its time plus the step before it, and never before
    frames / average fps (millisecond timestamps, as in webm, make that last step short)."""
    step = float(times[-1] - times[-2]) if len(times) > 1 else 0.0
    return max(len(times) / fps, float(times[-1]) + max(step, 0.0))


def frame_span(times: np.ndarray, start: float, end: float) -> tuple[int, int]:
    """Numbers of the frames shown from `start` to `end` seconds, as a half-open range."""
    first, stop = np.searchsorted(times, [start - 1e-6, end - 1e-6])
    return int(first), int(stop)


def grey_small(pixels: np.ndarray) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.fromarray(pixels).convert("L").resize((32, 32), Image.Resampling.BOX))


def split_video(
    value: Media, opts: dict[str, Any], prefix: str | None = None
) -> list[dict[str, Any]]:
    """[{start, end, data (None: the whole source)}] for the clips of one video; `data` is a
    Spilled file `<prefix>-<n>.mp4` when a prefix is given, else bytes."""
    scenes, watched = opts["mode"] == "scenes", Watched()
    found = scan(value, opts["analysis_fps"] if scenes else None, watched)
    duration = end_time(found.times, found.fps)
    watched.to(duration)
    if scenes:
        small = found.small
        cuts = scene_cuts([g for _, g in small], [t for t, _ in small], opts["threshold"])
        bounds = scene_bounds(cuts, duration)
    else:
        bounds = fixed_bounds(duration, opts["window_s"], opts["stride_s"] or opts["window_s"])
    return cut_clips(value, found, bounds, opts, prefix)


def cut_clips(
    value: Media,
    found: Scan,
    bounds: list[tuple[float, float]],
    opts: dict[str, Any],
    prefix: str | None = None,
) -> list[dict[str, Any]]:
    """The clips of `bounds` (seconds), as split_video returns them: those shorter than
    `min_clip_s` left out, at most `max_clips`, each encoded once (the whole video: None)."""
    bounds = [(a, b) for a, b in bounds if b - a >= opts["min_clip_s"] - 1e-9]
    bounds = bounds[: opts["max_clips"]] if opts.get("max_clips") else bounds
    spans = [frame_span(found.times, a, b) for a, b in bounds]
    kept = [(bound, span) for bound, span in zip(bounds, spans, strict=True) if span[1] > span[0]]
    whole = (0, found.count)
    targets = ClipTargets(prefix)
    encoded = encode_clips(value, [span for _, span in kept], found, whole, targets)
    clips, given = [], set()
    for (a, b), span in kept:
        if span == whole or span in encoded:
            data = None if span == whole else encoded[span]
            if span in given and isinstance(data, Spilled):  # each clip owns its own file
                data = targets.copy(data)
            given.add(span)
            clips.append({"start": a, "end": b, "data": data})
    return clips


class ClipTargets:
    """Where clips are encoded: new files `<prefix>-<n>.mp4` (one prefix per call, so the
    caller finds and removes a killed call's files), or memory when there is no prefix."""

    def __init__(self, prefix: str | None) -> None:
        self.prefix, self.count = prefix, 0

    def writer(self, found: Scan) -> ClipWriter:
        return ClipWriter(found.fps, found.size, found.rotation, self.next_path())

    def next_path(self) -> str | None:
        if self.prefix is None:
            return None
        self.count += 1
        return f"{self.prefix}-{self.count - 1:05d}.{CLIP_CONTAINER}"

    def copy(self, clip: Spilled) -> Spilled:
        """A second file with the same clip (two windows that hold the same frames)."""
        path = self.next_path()
        shutil.copyfile(clip.path, path)
        return Spilled(path, clip.size)


def encode_clips(
    value: Media, spans: list[tuple[int, int]], found: Scan, skip: tuple, targets: ClipTargets
) -> dict[tuple[int, int], Media]:
    """Pass 2, streaming: every frame goes to the encoders of the clips that contain it, so
    memory holds encoders, not frames. The span `skip` (the whole video) is not re-encoded."""
    todo = sorted(set(spans) - {skip})
    writers: dict[tuple[int, int], ClipWriter] = {}
    done: dict[tuple[int, int], Media] = {}
    if not todo:
        return done
    with av.open(media_source(value)) as box:
        stream = box.streams.video[0]
        stream.codec_context.thread_count = 1
        for number, frame in enumerate(box.decode(stream)):
            for span in todo:
                if span[0] <= number < span[1]:
                    if span not in writers:
                        writers[span] = targets.writer(found)
                    writers[span].add(frame)
                    report(1 / found.fps, "cut_s")  # a frame's worth of this clip
                    if number == span[1] - 1:
                        done[span] = writers.pop(span).close()
            if number >= todo[-1][1] and not writers:
                break
    for span, writer in writers.items():  # the file ended early
        done[span] = writer.close()
    return done


class ClipWriter:
    """An H.264 mp4 encoder, at the source's frame rate, into the file `path` (else memory).
    Frames are stored upright (the source's display rotation applied; the clip has none).
    yuv420p needs even sides: an odd last row or column is cropped off, and a side of 1 pixel
    is doubled to 2."""

    def __init__(
        self, fps: float, size: tuple[int, int], rotation: int = 0, path: str | None = None
    ) -> None:
        self.path, self.out = path, io.BytesIO()
        self.box = av.open(path if path is not None else self.out, "w", format=CLIP_CONTAINER)
        self.stream = self.box.add_stream("libx264", rate=Fraction(fps).limit_denominator(1001))
        self.rotation = rotation
        width, height = size[::-1] if rotation % 180 == 90 else size
        self.width, self.height = even_side(width), even_side(height)
        self.stream.width, self.stream.height = self.width, self.height
        self.stream.pix_fmt = "yuv420p"
        self.stream.options = {"preset": "veryfast", "crf": "18"}

    def add(self, frame: Any) -> None:
        pixels = upright(frame.to_ndarray(format="rgb24"), self.rotation)
        pixels = fit(pixels, self.height, self.width)
        image = av.VideoFrame.from_ndarray(np.ascontiguousarray(pixels), format="rgb24")
        for packet in self.stream.encode(image):
            self.box.mux(packet)

    def close(self) -> Media:
        for packet in self.stream.encode():
            self.box.mux(packet)
        self.box.close()
        if self.path is None:
            return self.out.getvalue()
        return Spilled(self.path, os.path.getsize(self.path))


def even_side(side: int) -> int:
    return max(2, side - side % 2)


def fit(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """Crop to height x width, repeating the edge where the frame is smaller (1-pixel sides)."""
    pixels = pixels[:height, :width]
    pad = ((0, height - pixels.shape[0]), (0, width - pixels.shape[1]), (0, 0))
    return np.pad(pixels, pad, mode="edge") if pad[0][1] or pad[1][1] else pixels

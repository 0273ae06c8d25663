"""motion_score: how much and how the camera moves in each video or clip, from the codec's own
motion vectors (no optical flow computed), in the isolated decoder process like video_frames.

Writes into `<key>.json`: `motion_score` (frame diagonals per second, stages/lib/motion_vectors.py:
the median over analysed frames of the median vector length; independent of resolution and
frame rate), `camera_motion` (static, pan_left, pan_right, tilt_up, tilt_down, zoom_in, zoom_out,
shake, mixed: from a least-squares affine fit of each analysed frame's field), `motion_method`
(`vectors` or `flow`), `motion_frames` (frames analysed) and, for a file cut off mid-stream,
`motion_partial: true` (scored on the frames before the cut).

How: FFmpeg exports a frame's motion vectors while decoding when `flags2=+export_mvs` is set on
the codec context; every frame is decoded (a codec needs them all) but only the P-frames due at
`sample_fps` (at most `max_frames` over the clip) are fitted. I-frames carry no vectors and
B-frames are passed over (for a slow pan an encoder may average the frames on either side with
zero vectors), so the next P-frame is taken. A P-frame may predict from any of several earlier
frames and its vectors do not say which, so the frame before it and the frame itself (and any
B-frames between) are turned grey and the fitted field is checked at a few thousand pixels for
the number of frames it spans (motion_vectors.reference_distance): with x264's default three
references a 0.5 px/frame pan otherwise reads as 1 px/frame. No other frame becomes pixels.
Codecs that export no vectors (VP9, AV1, HEVC, all-intra streams such as MJPEG; none within
the first PROBE_FRAMES frames) fall back to dense optical flow (OpenCV Farneback on grey
frames `flow_width` wide, each due frame with the frame after it) under `method: auto`;
`method: flow` always uses flow, `method: vectors` drops them as `no_motion_vectors`.

A clip cut by clip_split holds only its own frames (re-encoded, or the whole source), so its
window is [0, clip_end - clip_start) of its file; any other video is analysed whole.
Drops: `low_motion` (< `min_score`), `high_motion` (> `max_score`), `no_video`,
`empty_video` (0 bytes), `no_video_stream`, `no_frames` (no frame decodable), `decode_error`
(unreadable: a file cut off before its index, garbage), `too_few_frames` (one frame: no
motion to measure), `too_many_pixels` (frames above `max_pixels` by the header: 8K passes,
a 16k x 9k frame does not), `no_motion_vectors`, `decode_timeout`. A file cut off after its
index is scored on the frames before the cut (`motion_partial`).
"""

from __future__ import annotations

import gc
import math
from collections.abc import Iterator
from typing import Any, Literal

import numpy as np
from mmcurate.core.formats import VIDEO_COLUMNS, meta_json, sample_meta
from mmcurate.core.spill import Media, media_size, release
from mmcurate.stages.base import Columns, Stage, StageOptions, media_column, register
from mmcurate.stages.lib.isolation import CallCrashed, CallFailed, CallTimeout, Isolated
from mmcurate.stages.lib.motion_vectors import (
    FrameMotion,
    camera_motion,
    codec_flow,
    fit_frame,
    motion_score,
    per_frame,
    reference_distance,
    upright_motion,
)
from mmcurate.stages.lib.video_child import PARENT, decoder_input
from mmcurate.stages.lib.video_probe import NoVideoStream, media_source, refuse_images
from pydantic import Field, model_validator

PROBE_FRAMES = 8  # decoded frames without a single vector: the stream has none
# PyAV (18.1) frames whose side_data was read form a reference cycle with it that keeps the
# decoded picture alive, and decoding makes too few Python objects for the garbage collector
# to run by itself: a 1 GiB 720p file then grew the decoder by ~1 MB a frame (0.8 GiB at
# 1,300 frames). A full collection every GC_EVERY frames bounds it (~5-15 ms each).
GC_EVERY = 16
P_FRAME = 2  # AVPictureType AV_PICTURE_TYPE_P (PyAV 18 gives pict_type as an int)
FLOW_GRID = 4  # flow vectors are read every FLOW_GRID pixels of the small frame
REASONS = {
    "NoVideoStream": "no_video_stream",
    "NoFrames": "no_frames",
    "TooFewFrames": "too_few_frames",
    "NoMotionVectors": "no_motion_vectors",
    "TooManyPixels": "too_many_pixels",
}


class NoFrames(Exception):
    pass


class TooFewFrames(Exception):
    pass


class NoMotionVectors(Exception):
    pass


class TooManyPixels(Exception):
    pass


class MotionScoreOptions(StageOptions):
    method: Literal["auto", "vectors", "flow"] = Field(
        "auto", description="auto: codec vectors, optical flow where a stream has none"
    )
    sample_fps: float = Field(8.0, gt=0, description="frames analysed a second")
    max_frames: int = Field(64, ge=2, description="at most this many over a clip")
    min_score: float | None = Field(None, ge=0, description="drop below: low_motion")
    max_score: float | None = Field(None, ge=0, description="drop above: high_motion")
    flow_width: int = Field(160, ge=16, le=1024, description="flow: width of analysed frames")
    max_pixels: int = Field(
        36_000_000, gt=0, description="frames larger (width x height) drop as too_many_pixels"
    )
    timeout_s: float = Field(60.0, gt=0, description="per video, then the decoder is killed")

    @model_validator(mode="after")
    def _ordered(self) -> MotionScoreOptions:
        low, high = self.min_score, self.max_score
        if low is not None and high is not None and low > high:
            raise ValueError(f"min_score {low} is above max_score {high}")
        return self


@register
class MotionScore(Stage):
    name = "motion_score"
    Options = MotionScoreOptions

    def setup(self) -> None:
        self.decoder = Isolated(preload=("mmcurate.stages.motion_score", "av"))

    def process(self, batch: Columns) -> tuple[Columns, list[str | None]]:
        size = len(batch["__key__"])
        reasons: list[str | None] = [None] * size
        metas = list(batch.get("json") or [None] * size)
        opts = self.options.model_dump()
        for row in range(size):
            col = media_column(batch, row, VIDEO_COLUMNS)
            if col is None or media_size(batch[col][row]) == 0:
                reasons[row] = "no_video" if col is None else "empty_video"
                continue
            meta = sample_meta(metas[row])
            window = clip_window(meta, batch.get(PARENT, [None] * size)[row] is not None)
            result, reasons[row] = self.measure(batch[col][row], opts, window)
            if result is None:
                continue
            meta.update(
                motion_score=round(result["score"], 5),
                camera_motion=result["label"],
                motion_method=result["method"],
                motion_frames=result["frames"],
            )
            if result["partial"]:
                meta["motion_partial"] = True  # the file was cut off: scored up to the cut
            metas[row] = meta_json(meta, sort_keys=True)
            reasons[row] = score_reason(result["score"], self.options)
        batch["json"] = metas
        return batch, reasons

    def measure(
        self, value: Media, opts: dict, window: tuple[float, float]
    ) -> tuple[dict | None, str | None]:
        sent, temporary = decoder_input(value)
        try:
            return self.decoder.call(measure_motion, (sent, opts, window), opts["timeout_s"]), None
        except CallTimeout:
            return None, "decode_timeout"
        except CallCrashed:
            return None, "decode_error"
        except CallFailed as err:
            return None, REASONS.get(str(err).split(":", 1)[0], "decode_error")
        finally:
            release(temporary)


def score_reason(score: float, options: MotionScoreOptions) -> str | None:
    if options.min_score is not None and score < options.min_score:
        return "low_motion"
    if options.max_score is not None and score > options.max_score:
        return "high_motion"
    return None


def clip_window(meta: dict, is_clip: bool) -> tuple[float, float]:
    """Seconds of the file to analyse: a clip_split clip's own length, else the whole file."""
    start, end = meta.get("clip_start"), meta.get("clip_end")
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (start, end))
    if is_clip and numbers and math.isfinite(end - start) and end > start:
        return 0.0, float(end - start)
    return 0.0, math.inf


def measure_motion(value: Media, opts: dict[str, Any], window: tuple[float, float]) -> dict:
    """{score, label, method, frames} for one video (runs in the decoder process)."""
    refuse_images(value)
    if opts["method"] != "flow":
        found = vector_motion(value, opts, window)
        if found is not None:
            return found
        if opts["method"] == "vectors":
            raise NoMotionVectors("the stream carries no motion vectors")
    try:
        import cv2  # noqa: F401  (the flow fallback's only need)
    except ImportError:
        raise NoMotionVectors("no motion vectors, and no OpenCV for optical flow") from None
    return flow_motion(value, opts, window)


class Timeline:
    """Decoded frames of the window with their times, and which of them are due for analysis
    (one each 1/sample_fps seconds, at most max_frames over the window)."""

    def __init__(self, box: Any, opts: dict[str, Any], window: tuple[float, float]) -> None:
        if not box.streams.video:
            raise NoVideoStream("no video stream")
        self.box, self.stream = box, box.streams.video[0]
        pixels = self.stream.codec_context.width * self.stream.codec_context.height
        if pixels > opts["max_pixels"]:  # checked on the header, before any frame is decoded
            raise TooManyPixels(f"{pixels} pixels a frame")
        self.stream.codec_context.thread_count = 1  # one core per task, as the other stages
        self.fps = float(self.stream.average_rate or 25)
        self.start, self.end = window
        length = min(self.end, box.duration / 1e6 if box.duration else math.inf) - self.start
        spread = length / opts["max_frames"] if math.isfinite(length) and length > 0 else 0.0
        self.step = max(1 / opts["sample_fps"], spread)
        self.due, self.count, self.partial, self.rotation = self.start, 0, False, 0

    def frames(self) -> Iterator[tuple[Any, float]]:
        """The window's frames in display order. A packet the codec rejects (damaged, or cut
        off with the file) is skipped and the stream read on; a container that cannot be read
        on ends it. Either makes the result `partial`."""
        origin = None
        for frame in self.decoded():
            t = float(frame.time) if frame.time is not None else self.count / self.fps
            if origin is None:  # a negative first time (B-frame delay) counts as 0
                origin, self.rotation = min(t, 0.0), int(getattr(frame, "rotation", 0) or 0)
            t -= origin
            if t >= self.end - 0.5 / self.fps:
                return
            if t >= self.start - 0.5 / self.fps:
                self.count += 1
                yield frame, t

    def decoded(self) -> Iterator[Any]:
        import av

        packets = self.box.demux(self.stream)
        while True:
            try:
                packet = next(packets, None)
            except av.error.FFmpegError:
                self.partial, packet = True, None
            if packet is None:
                return
            try:
                yield from packet.decode()
            except av.error.InvalidDataError:
                self.partial = True

    def is_due(self, t: float) -> bool:
        return t + 0.5 / self.fps >= self.due

    def taken(self, t: float) -> None:
        self.due = max(self.due + self.step, t + self.step / 2)

    def checked(self) -> None:
        if self.count == 0:
            raise NoFrames("no frames decoded")
        if self.count < 2:
            raise TooFewFrames("one frame: no motion to measure")


def vector_motion(value: Media, opts: dict[str, Any], window: tuple[float, float]) -> dict | None:
    """From the codec's motion vectors; None when the stream has none (an intra-only codec or
    one FFmpeg exports none for). Frames are converted to grey only around the analysed ones
    (the frame before and the frame itself), for `reference_distance`."""
    import av

    with av.open(media_source(value)) as box:
        line = Timeline(box, opts, window)
        line.stream.codec_context.options = {"flags2": "+export_mvs"}
        fits, seen, before = [], False, None
        for frame, t in line.frames():
            vectors = frame.side_data.get("MOTION_VECTORS")
            seen = seen or vectors is not None
            if int(frame.pict_type) != P_FRAME:
                vectors = None  # B-frames may average the frames around them with zero vectors
            if not seen and line.count >= PROBE_FRAMES:
                return None
            grey = grey_frame(frame) if line.is_due(t + 1 / line.fps) else None
            if vectors is not None and line.is_due(t):
                fitted = fit_frame(*codec_flow(vectors.to_ndarray()), *frame_size(frame))
                if fitted is not None:
                    gap = (t - before[0]) * line.fps if before is not None else math.inf
                    k = reference_distance(before[1], grey, fitted) if abs(gap - 1) < 0.5 else 1
                    fits.append(per_frame(fitted, k))
                    line.taken(t)
            before = (t, grey) if grey is not None else None
            if line.count % GC_EVERY == 0:
                del frame, vectors
                gc.collect()
    line.checked()
    return None if not seen else summary(fits, line, "vectors")


def grey_frame(frame: Any) -> np.ndarray:
    return frame.to_ndarray(format="gray")


def frame_size(frame: Any) -> tuple[int, int]:
    return int(frame.width), int(frame.height)


def flow_motion(value: Media, opts: dict[str, Any], window: tuple[float, float]) -> dict:
    """Dense optical flow (OpenCV Farneback) between each due frame and the one after it."""
    import av
    import cv2

    cv2.setNumThreads(1)
    fits: list[FrameMotion] = []
    with av.open(media_source(value)) as box:
        line = Timeline(box, opts, window)
        held: tuple[float, np.ndarray] | None = None
        for frame, t in line.frames():
            if held is None and not line.is_due(t):
                continue
            grey = small_grey(frame, opts["flow_width"])
            if held is not None:
                flow = cv2.calcOpticalFlowFarneback(held[1], grey, None, 0.5, 3, 15, 3, 5, 1.2, 0)
                fitted = grid_fit(flow, max((t - held[0]) * line.fps, 1.0))
                if fitted is not None:
                    fits.append(fitted)
                held = None
            if line.is_due(t):
                held = (t, grey)
                line.taken(t)
    line.checked()
    return summary(fits, line, "flow")


def small_grey(frame: Any, width: int) -> np.ndarray:
    width = min(width, frame.width)
    height = max(8, round(frame.height * width / frame.width / 2) * 2)
    return frame.reformat(width=width, height=height, format="gray").to_ndarray()


def grid_fit(flow: np.ndarray, frames_apart: float) -> FrameMotion | None:
    height, width = flow.shape[:2]
    ys, xs = np.mgrid[FLOW_GRID // 2 : height : FLOW_GRID, FLOW_GRID // 2 : width : FLOW_GRID]
    positions = np.stack([xs.ravel(), ys.ravel()], axis=1).astype(np.float64)
    vectors = flow[ys.ravel(), xs.ravel()].astype(np.float64) / frames_apart
    return fit_frame(positions, vectors, width, height)


def summary(fits: list[FrameMotion], line: Timeline, method: str) -> dict[str, Any]:
    fits = upright_motion(fits, line.rotation)  # directions as the video is shown
    label = camera_motion(fits, line.fps)
    return {
        "score": motion_score(fits, line.fps, shake=label == "shake"),
        "label": label,
        "method": method,
        "frames": len(fits),
        "partial": line.partial,
    }

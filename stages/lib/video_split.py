"""Cut a video into clips (pure; runs in the isolated decoder process).

Boundaries: `fixed` windows of `window_s` every `stride_s`; or `scenes`: hard cuts where the
mean absolute difference of consecutive analysed frames (grey, 32x32, `analysis_fps` frames a
second) exceeds `threshold` (0-255). Clips shorter than `min_clip_s` are left out. A clip that
is the whole video keeps the source bytes; any other is re-encoded with PyAV (H.264 in mp4,
same size and frame rate, video only).
"""

from __future__ import annotations

import io
from fractions import Fraction
from typing import Any

import av
import numpy as np

from stages.lib.video_decode import NoFrames, NoVideoStream


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


def scan(data: bytes, analysis_fps: float | None) -> tuple[int, float, tuple[int, int], list]:
    """Pass 1, streaming: frame count, frame rate, size, and (for scene cuts) small grey
    copies of `analysis_fps` frames a second with their times."""
    with av.open(io.BytesIO(data)) as box:
        if not box.streams.video:
            raise NoVideoStream("no video stream")
        stream = box.streams.video[0]
        stream.codec_context.thread_count = 1
        fps = float(stream.average_rate or 25)
        step = max(1, round(fps / analysis_fps)) if analysis_fps else 0
        count, size, small = 0, (0, 0), []
        for frame in box.decode(stream):
            size = (frame.width, frame.height)
            if step and count % step == 0:
                small.append((count / fps, grey_small(frame.to_ndarray(format="rgb24"))))
            count += 1
    if count == 0:
        raise NoFrames("no frames")
    return count, fps, size, small


def grey_small(pixels: np.ndarray) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.fromarray(pixels).convert("L").resize((32, 32), Image.Resampling.BOX))


def split_video(data: bytes, opts: dict[str, Any]) -> list[dict[str, Any]]:
    """[{start, end, data (None: the whole source)}] for the clips of one video."""
    scenes = opts["mode"] == "scenes"
    count, fps, size, small = scan(data, opts["analysis_fps"] if scenes else None)
    duration = count / fps
    if scenes:
        cuts = scene_cuts([g for _, g in small], [t for t, _ in small], opts["threshold"])
        bounds = scene_bounds(cuts, duration)
    else:
        bounds = fixed_bounds(duration, opts["window_s"], opts["stride_s"] or opts["window_s"])
    bounds = [(a, b) for a, b in bounds if b - a >= opts["min_clip_s"] - 1e-9]
    bounds = bounds[: opts["max_clips"]] if opts.get("max_clips") else bounds
    spans = [(round(a * fps), min(count, round(b * fps))) for a, b in bounds]
    kept = [(bound, span) for bound, span in zip(bounds, spans, strict=True) if span[1] > span[0]]
    whole = (0, count)
    encoded = encode_clips(data, [span for _, span in kept], fps, size, skip=whole)
    return [
        {"start": a, "end": b, "data": None if span == whole else encoded[span]}
        for (a, b), span in kept
        if span == whole or span in encoded
    ]


def encode_clips(
    data: bytes, spans: list[tuple[int, int]], fps: float, size: tuple[int, int], skip: tuple
) -> dict[tuple[int, int], bytes]:
    """Pass 2, streaming: every frame goes to the encoders of the clips that contain it, so
    memory holds encoders, not frames. The span `skip` (the whole video) is not re-encoded."""
    todo = sorted(set(spans) - {skip})
    writers: dict[tuple[int, int], ClipWriter] = {}
    done: dict[tuple[int, int], bytes] = {}
    if not todo:
        return done
    with av.open(io.BytesIO(data)) as box:
        stream = box.streams.video[0]
        stream.codec_context.thread_count = 1
        for number, frame in enumerate(box.decode(stream)):
            for span in todo:
                if span[0] <= number < span[1]:
                    writers.setdefault(span, ClipWriter(fps, size)).add(frame)
                    if number == span[1] - 1:
                        done[span] = writers.pop(span).close()
            if number >= todo[-1][1] and not writers:
                break
    for span, writer in writers.items():  # the file ended early
        done[span] = writer.close()
    return done


class ClipWriter:
    """An H.264 mp4 encoder in memory, at the source's frame rate; yuv420p needs even sides,
    so an odd last row or column is cropped off."""

    def __init__(self, fps: float, size: tuple[int, int]) -> None:
        self.out = io.BytesIO()
        self.box = av.open(self.out, "w", format="mp4")
        self.stream = self.box.add_stream("libx264", rate=Fraction(fps).limit_denominator(1001))
        self.width, self.height = size[0] - size[0] % 2, size[1] - size[1] % 2
        self.stream.width, self.stream.height = self.width, self.height
        self.stream.pix_fmt = "yuv420p"
        self.stream.options = {"preset": "veryfast", "crf": "18"}

    def add(self, frame: Any) -> None:
        pixels = frame.to_ndarray(format="rgb24")[: self.height, : self.width]
        image = av.VideoFrame.from_ndarray(np.ascontiguousarray(pixels), format="rgb24")
        for packet in self.stream.encode(image):
            self.box.mux(packet)

    def close(self) -> bytes:
        for packet in self.stream.encode():
            self.box.mux(packet)
        self.box.close()
        return self.out.getvalue()

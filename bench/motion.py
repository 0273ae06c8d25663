"""Bench: motion_score from codec motion vectors vs OpenCV Farneback flow on every frame.

Input: H.264 videos (libx264, its defaults: preset medium, 3 references, B-frames) panning,
tilting and zooming over a mosaic of four real photos (scikit-image, 1920x1920) at known
speeds, 10 s at 30 fps, at the chosen size (default 640x360). Everything on one core
(decoder threads 1, cv2 threads 1).
- mmcurate: `stages.motion_score.measure_motion` (vectors of the P-frames due at 8 fps, the
  reference-distance check on their grey frames), called in this process.
- Farneback: decode every frame, grey at the same resolution, Farneback (0.5, 3, 15, 3, 5,
  1.2) between each pair of consecutive frames, the same affine fit and score on a 4-px grid.
CPU seconds per video-minute (process time), and Spearman of each method's scores against the
known speeds within each kind of motion.

    .venv/bin/python bench/motion.py [--size 640x360] [--seconds 10]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import time
from fractions import Fraction

import av
import cv2
import numpy as np
from mmcurate.stages.lib.motion_vectors import motion_score
from mmcurate.stages.motion_score import grid_fit, measure_motion
from PIL import Image
from scipy.stats import spearmanr
from skimage import data

FPS = 30
OPTS = {
    "method": "vectors",
    "sample_fps": 8.0,
    "max_frames": 1000,
    "flow_width": 160,
    "max_pixels": 36_000_000,
}
CASES = [("pan", s) for s in (0.5, 1, 2, 3, 4)] + [("tilt", s) for s in (0.5, 1.5, 3)]
CASES += [("zoom", s) for s in (0.002, 0.004, 0.008)]  # zoom: share of the width a frame


def mosaic() -> Image.Image:
    """Four photos, each at 960x960 (about 2x up), side by side: 1920x1920 of real texture."""
    names = ("astronaut", "coffee", "chelsea", "rocket")
    tiles = [Image.fromarray(getattr(data, n)()).convert("RGB").resize((960, 960)) for n in names]
    out = Image.new("RGB", (1920, 1920))
    for i, tile in enumerate(tiles):
        out.paste(tile, ((i % 2) * 960, (i // 2) * 960))
    return out


def frames(kind: str, speed: float, size: tuple[int, int], count: int, image: Image.Image):
    width, height = size
    cx, cy = image.width / 2, image.height / 2
    for i in range(count):
        s = (i - count / 2) * speed
        w = width * (1.5 * (1 - speed) ** i if kind == "zoom" else 1)
        dx, dy = (s, 0) if kind == "pan" else (0, s) if kind == "tilt" else (0, 0)
        h = w * height / width
        box = (cx + dx - w / 2, cy + dy - h / 2, cx + dx + w / 2, cy + dy + h / 2)
        yield np.asarray(image.resize(size, Image.Resampling.BILINEAR, box=box))


def encode(pixels, size: tuple[int, int]) -> bytes:
    out = io.BytesIO()
    with av.open(out, "w", format="mp4") as box:
        stream = box.add_stream("libx264", rate=Fraction(FPS))
        stream.width, stream.height = size
        stream.pix_fmt = "yuv420p"
        for frame in pixels:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                box.mux(packet)
        for packet in stream.encode():
            box.mux(packet)
    return out.getvalue()


def farneback_every_frame(video: bytes) -> float:
    with av.open(io.BytesIO(video)) as box:
        stream = box.streams.video[0]
        stream.codec_context.thread_count = 1
        fits, before = [], None
        for frame in box.decode(stream):
            grey = frame.to_ndarray(format="gray")
            if before is not None:
                flow = cv2.calcOpticalFlowFarneback(before, grey, None, 0.5, 3, 15, 3, 5, 1.2, 0)
                fitted = grid_fit(flow, 1.0)
                if fitted is not None:
                    fits.append(fitted)
            before = grey
    return motion_score(fits, FPS)


def timed(fn, *args) -> tuple[float, float]:
    started = time.process_time()
    value = fn(*args)
    return value, time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="640x360")
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    size = tuple(int(v) for v in args.size.split("x"))
    count = int(args.seconds * FPS)
    cv2.setNumThreads(1)
    rows, image = [], mosaic()
    for kind, speed in CASES:
        video = encode(frames(kind, speed, size, count, image), size)
        ours, ours_s = timed(measure_motion, video, OPTS, (0.0, float("inf")))
        flow, flow_s = timed(farneback_every_frame, video)
        rows.append((kind, speed, ours["score"], ours["label"], ours_s, flow, flow_s))
        print(
            f"{kind} {speed}: vectors {ours['score']:.4f} {ours['label']} {ours_s:.2f}s | "
            f"farneback {flow:.4f} {flow_s:.2f}s",
            flush=True,
        )
    minutes = len(rows) * args.seconds / 60
    ours_cpu, flow_cpu = sum(r[4] for r in rows), sum(r[6] for r in rows)
    ranks = {}
    for kind in ("pan", "tilt", "zoom"):
        part = [r for r in rows if r[0] == kind]
        ranks[kind] = {
            "vectors": spearmanr([r[1] for r in part], [r[2] for r in part]).statistic,
            "farneback": spearmanr([r[1] for r in part], [r[5] for r in part]).statistic,
        }
    labels = sum(r[3].startswith(r[0]) for r in rows)
    print(
        json.dumps(
            {
                "size": args.size,
                "videos": len(rows),
                "seconds_each": args.seconds,
                "vectors_cpu_s_per_video_minute": round(ours_cpu / minutes, 2),
                "farneback_cpu_s_per_video_minute": round(flow_cpu / minutes, 2),
                "ratio": round(flow_cpu / ours_cpu, 1),
                "spearman": ranks,
                "labels_right": f"{labels}/{len(rows)}",
                "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()

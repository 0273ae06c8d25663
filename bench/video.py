"""Bench: uniform 8-frame sampling per core, mmcurate vs a plain PyAV loop and decode-only.

Input: H.264 videos with motion (pipeline/video_data.py: a moving gradient and a changing
frame number), 10 s at 30 fps, 360p and 720p, encoded with PyAV (libx264, preset fast, its
default GOP of 250 frames). Everything on one core (decoder threads 1).
- mmcurate: the video_frames sampler (`stages.lib.video_decode.with_decord`: decord, planned
  indices, `get_batch`) -> 8 RGB frames.
- plain PyAV: decode every frame in order, keep the 8 planned ones as RGB arrays.
- decode-only: PyAV decoding every frame, no conversion: how fast frames come out at all.
- stage: the whole video_frames stage (isolated decoder process, resize to 224 and centre
  crop, JPEG) for scale.
Rate: sampled frames per second (8 per video); decode-only: decoded frames per second.

    .venv/bin/python bench/video.py [--videos 4]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import time

import av
import numpy as np
from mmcurate.pipeline.video_data import frame_pixels
from mmcurate.stages.lib.video_decode import plan_indices, with_decord
from mmcurate.stages.registry import build_stage

OPTS = {"mode": "uniform", "num_frames": 8, "fps": 1.0, "size": 224, "crop": True, "quality": 90}


def encode(size: tuple[int, int], frames: int = 300, fps: int = 30, seed: int = 0) -> bytes:
    out = io.BytesIO()
    with av.open(out, "w", format="mp4") as box:
        stream = box.add_stream("libx264", rate=fps)
        stream.width, stream.height = size
        stream.pix_fmt = "yuv420p"
        stream.options = {"preset": "fast"}
        for index in range(frames):
            pixels = frame_pixels(index + seed * 1000, *size)
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                box.mux(packet)
        for packet in stream.encode():
            box.mux(packet)
    return out.getvalue()


def plain_pyav(data: bytes) -> list[np.ndarray]:
    with av.open(io.BytesIO(data)) as box:
        stream = box.streams.video[0]
        stream.codec_context.thread_count = 1
        count = stream.frames
        wanted = set(plan_indices("uniform", count, float(stream.average_rate), 8, 1.0, []))
        return [
            frame.to_ndarray(format="rgb24")
            for number, frame in enumerate(box.decode(stream))
            if number in wanted
        ]


def decode_only(data: bytes) -> int:
    with av.open(io.BytesIO(data)) as box:
        stream = box.streams.video[0]
        stream.codec_context.thread_count = 1
        return sum(1 for _ in box.decode(stream))


def timed(fn, videos: list[bytes]) -> tuple[float, int]:  # noqa: ANN001
    started = time.perf_counter()
    produced = 0
    for data in videos:
        result = fn(data)
        produced += result if isinstance(result, int) else len(result)
    return time.perf_counter() - started, produced


def stage_rate(videos: list[bytes]) -> tuple[float, int]:
    stage = build_stage({"name": "video_frames", "num_frames": 8, "size": 224})
    batch = {
        "__key__": [f"v{i}" for i in range(len(videos))],
        "__drop__": [None] * len(videos),
        "__drop_stage__": [None] * len(videos),
        "mp4": list(videos),
        "txt": ["x"] * len(videos),
        "json": [None] * len(videos),
    }
    stage({k: v[:1] for k, v in batch.items()})  # start the decoder process
    started = time.perf_counter()
    out = stage(batch)
    return time.perf_counter() - started, sum(1 for v in out["007.jpg"] if v) * 8


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--videos", type=int, default=4)
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"
    print(json.dumps({"machine": f"{platform.machine()}, {os.cpu_count()} CPUs, 1 core used"}))
    for label, size in (("360p", (640, 360)), ("720p", (1280, 720))):
        videos = [encode(size, seed=i) for i in range(args.videos)]
        decord_sampler = lambda data: with_decord(data, OPTS, lambda f: f)["frames"]  # noqa: E731
        rows = {}
        for name, fn in (
            ("mmcurate_decord", decord_sampler),
            ("plain_pyav", plain_pyav),
            ("decode_only_pyav", decode_only),
        ):
            timed(fn, videos[:1])  # warm caches and codec init
            seconds, produced = timed(fn, videos)
            rows[name] = round(produced / seconds, 1)
        seconds, produced = stage_rate(videos)
        rows["video_frames_stage"] = round(produced / seconds, 1)
        ratio = round(rows["mmcurate_decord"] / rows["plain_pyav"], 2)
        print(json.dumps({"size": label, "frames_per_s": rows, "mmcurate_vs_plain": ratio}))


if __name__ == "__main__":
    main()

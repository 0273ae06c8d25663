"""Bench: `mmcurate.video_loader` against a plain webdataset + decord loop, and a loader
worker's memory on a ~1 GiB clip.

speed (default): one `video_buckets` build of real-photo clips (scikit-image photos, a camera
drifting over them, 640x360 / 480x480 / 360x640, 48 frames, H.264 as video_buckets writes it),
then in interleaved rounds, each with the same loader workers, batch size, window length and
resize (each bucket scaled to the area of `--size`, its own shape; `--size none`: the bucket's
size), one epoch of every clip's window:
- mmcurate: `mmcurate.video_loader(..., schedule=[{"step": 0, "size": SIZE}])` (made inside
  the round: its index read from the metadata parquets is timed too).
- plain: `webdataset.WebDataset(shards)` split by worker, decord `VideoReader` over the
  member's bytes (its defaults), `get_batch` of the same window (`window_start`), torch
  `interpolate` (bilinear, antialias) to the same size, batches grouped by the json's bucket,
  in a DataLoader with the same workers.
- decode alone: the same windows decoded and scaled (`decode_window`, decord scaling as it
  decodes) from clip files already on local disk, in a pool of the same number of processes:
  no tar, no batching, no transfer. The loader's share of it is how near the decode bound it runs.
Rate: clips (windows) per second.

memory: one clip of about `--clip-mib` MiB (1280x720 noise, lossless H.264) in a build; a
fresh process makes `mmcurate.video_loader(manifest, 1, 16, workers=1)` and reads `--epochs`
windows; the peak PSS of it and its worker (bench/memwatch.py), beside a 16 MiB clip of the
same frame size, and the baseline after imports.

    .venv/bin/python bench/video_loader.py speed [--clips 48] [--workers 2] [--rounds 2]
    .venv/bin/python bench/video_loader.py memory [--clip-mib 1024]
    .venv/bin/python bench/video_loader.py recipe [--epochs 1] [--rounds 3] [--demand 0.9]

recipe: bench/video_recipe.py (the data wait of docs/recipes.md's loop at 90% demand).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import time
from multiprocessing import Pool
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import av  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from mmcurate.trainer.data.video_windows import (  # noqa: E402
    decode_window,
    parse_schedule,
    scaled_size,
    window_start,
)

import mmcurate  # noqa: E402

SHAPES = [(640, 360), (480, 480), (360, 640)]
BUCKETS = ["640x360", "480x480", "360x640"]
SEED = 0


def photo_clip(width: int, height: int, frames: int, photo: np.ndarray) -> bytes:
    """A camera drifting over a real photo, H.264 (libx264 ultrafast, crf 18)."""
    from PIL import Image

    side = min(photo.shape[:2]) * 3 // 4
    crop_w, crop_h = (
        (side, side * height // width)
        if width >= height
        else (
            side * width // height,
            side,
        )
    )
    out = io.BytesIO()
    with av.open(out, "w", format="mp4") as box:
        stream = box.add_stream("libx264", rate=24)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "ultrafast", "crf": "18"}
        for i in range(frames):
            x, y = 2 * i % (photo.shape[1] - crop_w), i % (photo.shape[0] - crop_h)
            window = Image.fromarray(photo[y : y + crop_h, x : x + crop_w])
            pixels = np.asarray(window.resize((width, height), Image.Resampling.BILINEAR))
            box.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
        box.mux(stream.encode())
    return out.getvalue()


def make_speed_build(root: Path, clips: int, frames: int) -> Path:
    from skimage import data

    photos = [data.astronaut(), data.coffee(), data.chelsea(), data.rocket()]
    manifest = root / "out" / "manifest.json"
    if manifest.exists():
        return manifest
    folder = root / "in"
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(clips):
        width, height = SHAPES[i % len(SHAPES)]
        data_ = photo_clip(width, height, frames, photos[i % len(photos)])
        (folder / f"c{i:04d}.mp4").write_bytes(data_)
        (folder / f"c{i:04d}.txt").write_text(f"clip {i}")
    buckets = [{"size": b, "min_frames": 16} for b in BUCKETS]
    result = mmcurate.build(
        {
            "source": {"kind": "videos", "path": str(folder)},
            "stages": [{"name": "video_buckets", "buckets": buckets, "inline_clip_bytes": 0}],
            "output": {"path": str(root / "out"), "shard_max_samples": 8},
            "ray": {"runtime": "local", "num_cpus": 2},
        }
    )
    return Path(result["manifest"])


def target(bucket: str, size: str | None) -> tuple[int, int]:
    width, height = map(int, bucket.split("x"))
    area = parse_schedule([{"step": 0, "size": size}], 1)[0].area if size else None
    return scaled_size(width, height, area)


def ours(manifest: Path, workers: int, batch: int, frames: int, size: str | None) -> int:
    schedule = [{"step": 0, "size": size}] if size else None
    loader = mmcurate.video_loader(
        str(manifest), batch, frames, seed=SEED, workers=workers, schedule=schedule, epochs=1
    )
    with loader:  # one epoch: its workers decode none of a next one (as the plain loop's)
        return sum(len(b["__key__"]) for b in loader)


class PlainLoop(torch.utils.data.IterableDataset):
    """The plain loop: webdataset samples, decord over the bytes, the same window and size."""

    def __init__(self, shards: list[str], batch: int, frames: int, size: str | None) -> None:
        self.shards, self.batch, self.frames, self.size = shards, batch, frames, size

    def __iter__(self):  # noqa: ANN204
        import decord
        import webdataset as wds

        groups: dict[str, list] = {}
        source = wds.WebDataset(
            self.shards,
            shardshuffle=False,
            nodesplitter=None,
            workersplitter=wds.split_by_worker,
            empty_check=False,
        )
        for sample in source:
            meta = json.loads(sample["json"])
            reader = decord.VideoReader(io.BytesIO(sample["mp4"]))
            start = window_start(SEED, 0, sample["__key__"], len(reader), self.frames)
            window = reader.get_batch(list(range(start, start + self.frames))).asnumpy()
            video = torch.from_numpy(window).permute(0, 3, 1, 2)
            width, height = target(meta["bucket"], self.size)
            if (height, width) != tuple(video.shape[-2:]):
                scaled = torch.nn.functional.interpolate(
                    video.float(), size=(height, width), mode="bilinear", antialias=True
                )
                video = scaled.round().clamp(0, 255).to(torch.uint8)
            group = groups.setdefault(meta["bucket"], [])
            group.append((video, sample["txt"].decode(), sample["__key__"]))
            if len(group) == self.batch:
                yield collate(groups.pop(meta["bucket"]))
        for group in groups.values():
            yield collate(group)


def collate(group: list) -> dict:
    return {
        "video": torch.stack([v for v, _, _ in group]),
        "txt": [t for _, t, _ in group],
        "__key__": [k for _, _, k in group],
    }


def plain(manifest: Path, workers: int, batch: int, frames: int, size: str | None) -> int:
    shards = [str(manifest.parent / s["name"]) for s in json.loads(manifest.read_text())["shards"]]
    loop = PlainLoop(shards, batch, frames, size)
    loader = torch.utils.data.DataLoader(loop, batch_size=None, num_workers=workers)
    return sum(len(b["__key__"]) for b in loader)


def extract(manifest: Path, folder: Path) -> list[tuple[str, int, str]]:
    """Every clip to a local file: (path, frames, bucket)."""
    folder.mkdir(exist_ok=True)
    found = []
    for shard in json.loads(manifest.read_text())["shards"]:
        with tarfile.open(manifest.parent / shard["name"]) as tar:
            members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
        for name, value in members.items():
            if name.endswith(".json"):
                meta = json.loads(value)
                path = folder / name.replace(".json", ".mp4")
                path.write_bytes(members[name.replace(".json", ".mp4")])
                found.append((str(path), meta["num_frames"], meta["bucket"]))
    return found


def decode_one(job: tuple[str, int, int, tuple[int, int] | None]) -> int:
    path, start, frames, scale = job
    return len(decode_window(path, start, frames, scale))


def decode_alone(clips: list, workers: int, frames: int, size: str | None) -> int:
    jobs = []
    for path, count, bucket in clips:
        own = tuple(map(int, bucket.split("x")))
        scale = target(bucket, size)
        key = Path(path).stem
        start = window_start(SEED, 0, key, count, frames)
        jobs.append((path, start, frames, None if scale == own else scale))
    with Pool(max(workers, 1)) as pool:
        return len(pool.map(decode_one, jobs, chunksize=1))


def speed(args: argparse.Namespace) -> None:
    root = Path(args.root)
    manifest = make_speed_build(root / "speed", args.clips, args.frames_per_clip)
    clips = extract(manifest, root / "speed" / "files")
    size = None if args.size == "none" else args.size
    runs = {
        "mmcurate.video_loader": lambda: ours(
            manifest, args.workers, args.batch, args.window, size
        ),
        "plain webdataset + decord": lambda: plain(
            manifest, args.workers, args.batch, args.window, size
        ),
        "decode alone": lambda: decode_alone(clips, args.workers, args.window, size),
    }
    rates: dict[str, list[float]] = {name: [] for name in runs}
    per_cpu: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():
            began, cpu = time.perf_counter(), cpu_seconds()
            count = run()
            rates[name].append(count / (time.perf_counter() - began))
            per_cpu[name].append(count / (cpu_seconds() - cpu))
            assert count == len(clips), (name, count)
    report = {name: max(values) for name, values in rates.items()}
    print(json.dumps({"machine": machine(), "args": vars(args), "rates": rates}, indent=1))
    print(json.dumps({"clips per CPU second": per_cpu}, indent=1))
    eff = {name: statistics.median(values) for name, values in per_cpu.items()}
    ours_cpu, plain_cpu = eff["mmcurate.video_loader"], eff["plain webdataset + decord"]
    print(
        f"clips per CPU second (median): ratio {ours_cpu / plain_cpu:.2f}x; "
        f"decode bound share {ours_cpu / eff['decode alone']:.0%}"
    )
    ours_rate, plain_rate = report["mmcurate.video_loader"], report["plain webdataset + decord"]
    share = ours_rate / report["decode alone"]
    print(f"best: ratio {ours_rate / plain_rate:.2f}x; decode bound share {share:.0%}")
    mid = {name: statistics.median(values) for name, values in rates.items()}
    ratio = mid["mmcurate.video_loader"] / mid["plain webdataset + decord"]
    share = mid["mmcurate.video_loader"] / mid["decode alone"]
    print(f"median: {mid}; ratio {ratio:.2f}x; decode bound share {share:.0%}")


def cpu_seconds() -> float:
    """CPU time of this process and its ended children (loader workers, pool processes):
    the work a run did, whatever else the machine runs (its wall rate depends on that)."""
    import resource

    own, children = (
        resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}"


def noise_clip(path: Path, mib: int) -> None:
    """About `mib` MiB of 1280x720 noise, lossless H.264 (every frame about 1.4 MB)."""
    rng = np.random.default_rng(0)
    frames = max(20, mib * (1 << 20) // 1_400_000)
    with av.open(str(path), "w", format="mp4") as box:
        stream = box.add_stream("libx264", rate=24)
        stream.width, stream.height, stream.pix_fmt = 1280, 720, "yuv420p"
        stream.options = {"preset": "ultrafast", "qp": "0", "keyint": "48"}
        pool = [rng.integers(0, 256, (720, 1280, 3), dtype=np.uint8) for _ in range(8)]
        for i in range(frames):
            box.mux(stream.encode(av.VideoFrame.from_ndarray(pool[i % 8], format="rgb24")))
        box.mux(stream.encode())


def memory_build(root: Path, mib: int) -> Path:
    manifest = root / f"mem{mib}" / "out" / "manifest.json"
    if manifest.exists():
        return manifest
    folder = root / f"mem{mib}" / "in"
    folder.mkdir(parents=True, exist_ok=True)
    noise_clip(folder / "big.mp4", mib)
    (folder / "big.txt").write_text("noise")
    result = mmcurate.build(
        {
            "source": {"kind": "videos", "path": str(folder)},
            "stages": [],
            "output": {"path": str(root / f"mem{mib}" / "out")},
            "ray": {"runtime": "local", "num_cpus": 1},
        }
    )
    return Path(result["manifest"])


def read_windows(manifest: str, epochs: int) -> None:
    """In a fresh process: peak PSS of it and its loader worker while reading windows."""
    from memwatch import PeakMemory, tree_pss

    base = tree_pss()
    with PeakMemory(0.05) as peak:
        loader = mmcurate.video_loader(manifest, 1, 16, workers=1)
        shapes = []
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            shapes += [tuple(b["video"].shape) for b in loader]
    clip = sum(s["bytes"] for s in json.loads(Path(manifest).read_text())["shards"])
    print(json.dumps({"shard_bytes": clip, "baseline": base, "peak": peak.bytes, "shapes": shapes}))


def memory(args: argparse.Namespace) -> None:
    root = Path(args.root)
    for mib in (16, args.clip_mib):
        manifest = memory_build(root, mib)
        command = [sys.executable, __file__, "_read", str(manifest), str(args.epochs)]
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
        out = subprocess.run(command, check=True, capture_output=True, text=True, env=env)
        found = json.loads(out.stdout.strip().splitlines()[-1])
        mb = {k: round(found[k] / 2**20, 1) for k in ("shard_bytes", "baseline", "peak")}
        print(f"clip {mib} MiB: {mb} MiB, windows {found['shapes'][:1]} x {len(found['shapes'])}")


def main() -> None:
    parser = argparse.ArgumentParser()
    modes = ["speed", "recipe", "memory", "_read"]
    parser.add_argument("mode", nargs="?", default="speed", choices=modes)
    parser.add_argument("rest", nargs="*")
    parser.add_argument("--root", default="/tmp/mmcurate-bench-video-loader")
    parser.add_argument("--clips", type=int, default=48)
    parser.add_argument("--frames-per-clip", type=int, default=48)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--size", default="256x144")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clip-mib", type=int, default=1024)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--demand", type=float, default=0.9, help="recipe: step at this share")
    parser.add_argument("--step", choices=["sleep", "busy"], default="sleep")
    args = parser.parse_args()
    if args.mode == "_read":
        read_windows(args.rest[0], int(args.rest[1]))
    elif args.mode == "memory":
        memory(args)
    elif args.mode == "recipe":
        from video_recipe import recipe

        recipe(args, make_speed_build(Path(args.root) / "speed", args.clips, args.frames_per_clip))
    else:
        speed(args)


if __name__ == "__main__":
    main()

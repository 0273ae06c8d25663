"""The bucketed loader (trainer/data/buckets.py) against the plain webdataset bucket loop of
docs/recipes.md (kohya-style per-bucket lists), on the same aspect_buckets build of real
photos, one process each (no loader workers, one decode thread), the same decoder
(torchvision's libjpeg-turbo), interleaved rounds A, B, A, B:
`python bench/bucket_loader.py [--images 240] [--rounds 4]`.

Both yield uint8 [B, 3, H, W] batches of one bucket with their captions; ours also plans the
epoch from the metadata parquets (timed: the loader is made inside each round), shuffles,
and yields SDXL's conditioning."""

from __future__ import annotations

import argparse
import collections
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from mmcurate.pipeline.build import run_build  # noqa: E402
from mmcurate.pipeline.config import BuildConfig  # noqa: E402
from mmcurate.pipeline.demo_data import SUBJECTS, source_photo  # noqa: E402
from mmcurate.trainer.data.buckets import bucketed_loader  # noqa: E402
from torchvision.io import ImageReadMode, decode_jpeg  # noqa: E402

BUCKETS = ["256x256", "384x256", "256x384", "512x256", "320x256"]
SHAPES = [(300, 300), (450, 300), (300, 450), (600, 300), (400, 320)]


def make_build(root: Path, n: int) -> Path:
    folder = root / "in"
    folder.mkdir()
    names = list(SUBJECTS)
    for i in range(n):
        width, height = SHAPES[i % len(SHAPES)]
        image = source_photo(names[i % len(names)]).convert("RGB").resize((width, height))
        out = io.BytesIO()
        image.save(out, "JPEG", quality=90)
        (folder / f"p{i:05d}.jpg").write_bytes(out.getvalue())
        (folder / f"p{i:05d}.txt").write_text(f"photo {i}")
    cfg = BuildConfig.model_validate(
        {
            "source": {"kind": "images", "path": str(folder)},
            "stages": [{"name": "aspect_buckets", "buckets": BUCKETS}],
            "output": {"path": str(root / "out"), "shard_max_samples": 50},
            "ray": {"runtime": "local", "num_cpus": 1},
        }
    )
    run_build(cfg, progress=False)
    return root / "out"


def ours(out: Path, batch: int) -> int:
    loader = bucketed_loader(
        str(out / "manifest.json"), batch, workers=0, decode_threads=1, shuffle_buffer=0
    )
    return sum(len(b.keys) for b in loader)


def reference(out: Path, batch: int) -> int:
    import webdataset as wds

    urls = [str(p) for p in sorted(out.glob("shard-*.tar"))]
    pending: dict[tuple, list] = collections.defaultdict(list)
    count = 0
    for sample in wds.WebDataset(urls, shardshuffle=False, empty_check=False):
        data = torch.frombuffer(bytearray(sample["jpg"]), dtype=torch.uint8)
        image = decode_jpeg(data, mode=ImageReadMode.RGB)
        group = pending[tuple(image.shape)]
        group.append((image, sample["txt"].decode()))
        if len(group) == batch:
            count += len(torch.stack([g[0] for g in group]))
            pending[tuple(image.shape)] = []
    rest = [group for group in pending.values() if group]  # remainders: short batches
    return count + sum(len(torch.stack([g[0] for g in group])) for group in rest)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=240)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        out = make_build(Path(tmp), args.images)
        ours(out, args.batch), reference(out, args.batch)  # warm-up: imports, page cache
        wall: dict[str, list[float]] = {"mmcurate": [], "webdataset": []}
        cpu: dict[str, list[float]] = {"mmcurate": [], "webdataset": []}
        for _ in range(args.rounds):
            for name, run in (("mmcurate", ours), ("webdataset", reference)):
                start, start_cpu = time.perf_counter(), time.process_time()
                samples = run(out, args.batch)
                wall[name].append(samples / (time.perf_counter() - start))
                cpu[name].append(samples / (time.process_time() - start_cpu))
    for name in wall:
        print(
            f"{name}: median {statistics.median(wall[name]):.0f} samples/s wall, "
            f"{statistics.median(cpu[name]):.0f} per CPU-second, {args.rounds} rounds"
        )
    for label, rates in (("wall", wall), ("CPU time", cpu)):
        ratio = statistics.median(rates["mmcurate"]) / statistics.median(rates["webdataset"])
        print(f"ratio mmcurate / webdataset ({label}): {ratio:.2f}x")


if __name__ == "__main__":
    main()

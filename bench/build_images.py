"""Bench: `images` folder -> decode/resize/re-encode -> shards, against a plain process pool.

The reference is the simplest fast thing a user could write instead: a multiprocessing pool with
one process per core doing the same PIL work (draft decode, EXIF transpose, RGB, resize to 256 px
shorter side, JPEG q95) and writing tars. It is close to the per-image work's physical limit on
this machine, so the ratio says what Ray, planning, signatures and the two-phase write cost.

    .venv/bin/python bench/build_images.py [--n 3000] [--out /tmp/mmcurate-bench]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shutil
import tarfile
import time
from multiprocessing import Pool
from pathlib import Path

from photos import make_photos
from PIL import Image

from stages.decode_image import DecodeImageOptions, encode, target_size, transform

OPTS = DecodeImageOptions.model_validate({"resize": {"size": 256, "mode": "keep_ratio"}})


def reference_chunk(args: tuple[list[str], str]) -> int:
    """One pool task: the same decode/resize/encode, written as one tar."""
    paths, tar_path = args
    with tarfile.open(tar_path, "w") as tar:
        for path in paths:
            image = Image.open(path)
            image.draft("RGB", target_size(image.width, image.height, OPTS.resize))
            data = encode(transform(image, OPTS.resize), "jpg", OPTS.quality)
            caption = Path(path).with_suffix(".txt").read_bytes()
            for ext, blob in (("jpg", data), ("txt", caption)):
                info = tarfile.TarInfo(f"{Path(path).stem}.{ext}")
                info.size = len(blob)
                tar.addfile(info, io.BytesIO(blob))
    return len(paths)


def run_reference(folder: Path, out: Path, processes: int, chunk: int = 256) -> float:
    out.mkdir(parents=True, exist_ok=True)
    paths = sorted(str(p) for p in folder.glob("*.jpg"))
    jobs = [(paths[i : i + chunk], str(out / f"{i:08d}.tar")) for i in range(0, len(paths), chunk)]
    started = time.perf_counter()
    with Pool(processes) as pool:
        done = sum(pool.imap_unordered(reference_chunk, jobs))
    elapsed = time.perf_counter() - started
    assert done == len(paths)
    return elapsed


def run_mmcurate(folder: Path, out: Path) -> tuple[float, dict]:
    from pipeline.objectstore import loopback_only_env

    os.environ.update(loopback_only_env())  # before Ray is imported: nothing leaves loopback
    import ray

    from pipeline.build import run_build
    from pipeline.config import BuildConfig

    cfg = BuildConfig.model_validate(
        {
            "source": {"kind": "images", "path": str(folder), "files_per_task": 256},
            "stages": [{"name": "decode_image", "resize": {"size": 256, "mode": "keep_ratio"}}],
            "output": {"path": str(out), "overwrite": True},
        }
    )
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, logging_level="WARNING")
    started = time.perf_counter()
    manifest = run_build(cfg, progress=False)
    elapsed = time.perf_counter() - started
    ray.shutdown()
    return elapsed, manifest


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--out", default="/tmp/mmcurate-bench")
    args = parser.parse_args()
    root = Path(args.out)
    shutil.rmtree(root, ignore_errors=True)
    input_bytes = make_photos(root / "in", args.n)
    ref_s = run_reference(root / "in", root / "ref", os.cpu_count() or 1)
    mm_s, manifest = run_mmcurate(root / "in", root / "mm")
    assert manifest["samples"] == args.n
    result = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "images": args.n,
        "input_mb": round(input_bytes / 1e6, 1),
        "reference_pool_img_s": round(args.n / ref_s, 1),
        "mmcurate_img_s": round(args.n / mm_s, 1),
        "ratio_mmcurate_over_reference": round(ref_s / mm_s, 3),
        "mmcurate_phases_s": json.loads((root / "mm" / "stats.json").read_text())["phases"],
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

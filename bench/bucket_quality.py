"""Bucket quality per preset on a web-like size mix: mean aspect error (|log ratio| to the
bucket) and mean share of pixels cropped. Pure planning, no images:
`python bench/bucket_quality.py`.

The mix: 60% common camera/web shapes (4:3, 3:2, 16:9, 1:1 and their portrait turns, weighted
landscape 3:1 over portrait), 40% log-normal ratios around 4:3 (sigma 0.35); shorter side
512-2048 px. Seeded, so every run prints the same figures."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mmcurate.stages.lib import buckets as plan  # noqa: E402

COMMON = [(4, 3), (3, 2), (16, 9), (1, 1)]


def size_mix(n: int, seed: int = 0) -> list[tuple[int, int]]:
    rng = np.random.default_rng(seed)
    sizes = []
    for _ in range(n):
        if rng.random() < 0.6:
            w, h = COMMON[rng.integers(len(COMMON))]
            ratio = w / h if rng.random() < 0.75 else h / w
        else:
            ratio = math.exp(rng.normal(math.log(4 / 3), 0.35))
        short = int(rng.integers(512, 2049))
        sizes.append((round(short * ratio), short) if ratio >= 1 else (short, round(short / ratio)))
    return sizes


def quality(buckets: list[plan.Bucket], sizes: list[tuple[int, int]]) -> tuple[float, float]:
    errors, crops = [], []
    for w, h in sizes:
        bucket = plan.nearest_bucket(w, h, buckets)
        errors.append(plan.aspect_error(w, h, bucket))
        crops.append(plan.placement(w, h, bucket).crop_share)
    return float(np.mean(errors)), float(np.mean(crops))


def main() -> None:
    sizes = size_mix(20_000)
    presets = {
        "sdxl": plan.sdxl_buckets(),
        "kohya base 512": plan.kohya_buckets(512),
        "kohya base 1024": plan.kohya_buckets(1024),
        "novelai": plan.novelai_buckets(),
        "square 1024 only": [(1024, 1024)],
    }
    print(f"{'preset':<18}{'buckets':>8}{'mean aspect error':>20}{'mean share cropped':>20}")
    for name, buckets in presets.items():
        error, crop = quality(buckets, sizes)
        print(f"{name:<18}{len(buckets):>8}{error:>20.4f}{crop:>20.4f}")


if __name__ == "__main__":
    main()

"""Bench: reading one shard's samples, `core.tario.iter_tar_samples` against tarfile's stream
mode for every member (the reader before the fast path), and the loader's JPEG header check
(`trainer.data.transform.check_image_header`) against PIL's `Image.open`; same run, best of N.

    .venv/bin/python bench/tar_read.py --shard SHARD.tar [--repeats 7]
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mmcurate.core.tario import group_samples, iter_tar_samples  # noqa: E402
from mmcurate.trainer.data.transform import check_image_header  # noqa: E402
from PIL import Image  # noqa: E402


def tarfile_samples(fileobj: Any) -> Iterator[dict[str, Any]]:
    def files() -> Iterator[tuple[str, Callable[[], bytes]]]:
        with tarfile.open(fileobj=fileobj, mode="r|*") as tar:
            for member in tar:
                if member.isfile():
                    yield member.name, tar.extractfile(member).read

    return group_samples(files())


def best_ms(fn: Callable[[], int], repeats: int) -> float:
    """Best wall time of `fn` in ms per item (it returns how many items it did)."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        items = fn()
        times.append((time.perf_counter() - started) * 1000 / items)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shard", required=True)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    def read(reader: Callable[[Any], Iterator[dict]]) -> Callable[[], int]:
        def run() -> int:
            with open(args.shard, "rb") as f:
                return sum(1 for _ in reader(f))

        return run

    with open(args.shard, "rb") as f:
        jpegs = [s["jpg"] for s in iter_tar_samples(f) if "jpg" in s]

    def headers(check: Callable[[bytes], Any]) -> Callable[[], int]:
        return lambda: sum(1 for data in jpegs if check(data) or True)

    ours = best_ms(read(iter_tar_samples), args.repeats)
    library = best_ms(read(tarfile_samples), args.repeats)
    jpeg_ours = best_ms(headers(check_image_header), args.repeats)
    jpeg_pil = best_ms(headers(lambda data: Image.open(io.BytesIO(data))), args.repeats)
    result = {
        "machine": f"{platform.machine()}, Python {platform.python_version()}",
        "shard": args.shard,
        "ms_per_sample": {"iter_tar_samples": round(ours, 4), "tarfile": round(library, 4)},
        "tar_speedup": round(library / ours, 2),
        "ms_per_jpeg_header": {
            "check_image_header": round(jpeg_ours, 4),
            "pil": round(jpeg_pil, 4),
        },
        "header_speedup": round(jpeg_pil / jpeg_ours, 2),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

"""Bench: the per-image work of ingest alone, per core: mmcurate's Pillow path against
img2dataset's OpenCV path, on the same photos (no download, no files written).

- Pillow (mmcurate's `decode_image`): libjpeg-turbo draft decode (DCT scaling, never below the
  target), area (BOX) resize to 256 px on the short side, JPEG q95.
- mmcurate as it runs: the same, with the resize on fast_image_resize's SIMD kernels
  (`stages/lib/fast_resize.shrink`, what `decode_image` calls).
- OpenCV (img2dataset's resizer): full `imdecode`, INTER_AREA resize, `imencode` q95, one
  OpenCV thread.
Each path runs where its library is installed: the main venv has Pillow, img2dataset's venv
has OpenCV. `--pool` also runs mmcurate's image work in 1 and 2 processes: the cap the cores
give to any tool doing that work.

    .venv/bin/python bench/image_work.py --photos <folder of JPEGs> [--n 300] [--pool]
    bench/.venv-img2dataset/bin/python bench/image_work.py --photos <folder>
"""

from __future__ import annotations

import argparse
import io
import json
import time
from multiprocessing import Pool
from pathlib import Path

SHORT_SIDE = 256


def target(width: int, height: int) -> tuple[int, int]:
    scale = SHORT_SIDE / min(width, height)
    return round(width * scale), round(height * scale)


def pillow_steps(blob: bytes, simd: bool = False) -> tuple[float, float, float]:
    """(decode, resize, encode) CPU seconds of one image on the Pillow path; `simd`: resized
    as mmcurate resizes."""
    from PIL import Image

    t0 = time.process_time()
    image = Image.open(io.BytesIO(blob))
    size = target(*image.size)
    image.draft("RGB", size)
    image.load()
    t1 = time.process_time()
    rgb = image.convert("RGB")
    if simd:
        from mmcurate.stages.lib.fast_resize import shrink

        small = shrink(rgb, size, Image.Resampling.BOX)
    else:
        small = rgb.resize(size, Image.Resampling.BOX)
    t2 = time.process_time()
    small.save(io.BytesIO(), "JPEG", quality=95)
    return t1 - t0, t2 - t1, time.process_time() - t2


def opencv_steps(blob: bytes) -> tuple[float, float, float]:
    """(decode, resize, encode) CPU seconds of one image on the OpenCV path."""
    import cv2
    import numpy as np

    t0 = time.process_time()
    pixels = cv2.imdecode(np.frombuffer(blob, np.uint8), cv2.IMREAD_UNCHANGED)
    t1 = time.process_time()
    size = target(pixels.shape[1], pixels.shape[0])
    small = cv2.resize(pixels, size, interpolation=cv2.INTER_AREA)
    t2 = time.process_time()
    cv2.imencode(".jpg", small, [cv2.IMWRITE_JPEG_QUALITY, 95])
    return t1 - t0, t2 - t1, time.process_time() - t2


def per_image_ms(steps, blobs: list[bytes], rounds: int = 3) -> dict[str, float]:  # noqa: ANN001
    """Best of `rounds` mean ms per image for each step."""
    best = None
    for _ in range(rounds):
        totals = [sum(col) for col in zip(*(steps(b) for b in blobs), strict=True)]
        best = totals if best is None or sum(totals) < sum(best) else best
    names = ("decode", "resize", "encode")
    result = {name: round(t / len(blobs) * 1000, 3) for name, t in zip(names, best, strict=True)}
    return result | {"total": round(sum(best) / len(blobs) * 1000, 3)}


def mmcurate_steps(blob: bytes) -> tuple[float, float, float]:
    return pillow_steps(blob, simd=True)


def pool_work(paths: list[str]) -> int:
    for path in paths:
        mmcurate_steps(Path(path).read_bytes())
    return len(paths)


def pool_rates(paths: list[str], counts: tuple[int, ...] = (1, 2)) -> dict[str, float]:
    """Images per second of mmcurate's image work in 1 and 2 processes (wall time)."""
    rates = {}
    for processes in counts:
        with Pool(processes) as pool:
            started = time.perf_counter()
            done = sum(pool.map(pool_work, [paths] * processes))
            rates[f"{processes}_processes_img_s"] = round(done / (time.perf_counter() - started), 1)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--photos", required=True, help="a folder of JPEG photos")
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--pool", action="store_true")
    args = parser.parse_args()
    paths = sorted(str(p) for p in Path(args.photos).glob("*.jpg"))[: args.n]
    blobs = [Path(p).read_bytes() for p in paths]
    result: dict = {"images": len(blobs)}
    try:
        import cv2

        cv2.setNumThreads(1)
        result["opencv_ms"] = per_image_ms(opencv_steps, blobs)
    except ImportError:
        pass
    try:
        import PIL  # noqa: F401

        result["pillow_ms"] = per_image_ms(pillow_steps, blobs)
        result["mmcurate_ms"] = per_image_ms(mmcurate_steps, blobs)
        if args.pool:
            result |= pool_rates(paths)
    except ImportError:
        pass
    print(json.dumps(result))


if __name__ == "__main__":
    main()

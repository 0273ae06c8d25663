"""The SIMD shrink (stages/lib/fast_resize.py) against Pillow's resample, on real photos."""

from __future__ import annotations

import io
import threading

import numpy as np
import pytest
from PIL import Image

from pipeline.demo_data import SUBJECTS, source_photo
from stages.decode_image import DecodeImage, DecodeImageOptions
from stages.lib import fast_resize
from stages.lib.fast_resize import FILTER_NAMES, shrink

PHOTOS = [source_photo(name).convert("RGB") for name in list(SUBJECTS)[:4]]
# Sizes a 256-px resize meets after libjpeg's draft (factors 1-2), a large factor, and slivers.
SIZES = [(0.62, 0.62), (0.97, 0.97), (0.5, 0.5), (0.13, 0.13), (0.9, 0.01), (0.003, 0.4)]


def differences(a: Image.Image, b: Image.Image) -> np.ndarray:
    assert a.size == b.size and a.mode == b.mode == "RGB"
    return np.abs(np.asarray(a, np.int16) - np.asarray(b, np.int16))


@pytest.mark.parametrize("method", list(FILTER_NAMES))
def test_shrink_matches_pillow_within_rounding(method):
    assert fast_resize.available()  # a test dependency: the SIMD path is the one under test
    for photo in PHOTOS:
        for fx, fy in SIZES:
            size = (max(1, round(photo.width * fx)), max(1, round(photo.height * fy)))
            diff = differences(shrink(photo, size, method), photo.resize(size, method))
            assert diff.mean() < 0.5, (method, size)
            # A box filter's edge may fall one pixel over where Pillow puts it: rare columns.
            assert (diff > 3).mean() < 0.01, (method, size)


def test_shrink_leaves_other_modes_and_the_source_to_pillow():
    grey = PHOTOS[0].convert("L")
    size = (grey.width // 3, grey.height // 3)
    out = shrink(grey, size, Image.Resampling.BOX)
    assert out.mode == "L" and out.tobytes() == grey.resize(size, Image.Resampling.BOX).tobytes()
    before = PHOTOS[1].tobytes()
    shrink(PHOTOS[1], (10, 10), Image.Resampling.BOX)
    assert PHOTOS[1].tobytes() == before


def test_threads_shrinking_at_once_get_what_one_thread_gets():
    jobs = [(photo, (photo.width // k, photo.height // k)) for photo in PHOTOS for k in (2, 3, 5)]
    serial = [shrink(p, s, Image.Resampling.BOX).tobytes() for p, s in jobs]
    results: dict[int, list[bytes]] = {}

    def run(index: int) -> None:
        results[index] = [shrink(p, s, Image.Resampling.BOX).tobytes() for p, s in jobs * 3]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(out == serial * 3 for out in results.values())


def test_decode_image_output_is_pillows_within_jpeg_noise(monkeypatch):
    blobs = []
    for photo in PHOTOS:
        buf = io.BytesIO()
        photo.save(buf, "JPEG", quality=92)
        blobs.append(buf.getvalue())
    stage = DecodeImage(DecodeImageOptions())
    stage.setup()
    fast = [stage.decode_one(b) for b in blobs]
    monkeypatch.setattr(fast_resize, "Resizer", None)  # the fallback: Pillow's resample
    plain = [stage.decode_one(b) for b in blobs]
    for (fast_bytes, fast_meta, _), (plain_bytes, plain_meta, _) in zip(fast, plain, strict=True):
        assert fast_meta == plain_meta and min(fast_meta["width"], fast_meta["height"]) == 256
        a, b = (Image.open(io.BytesIO(x)).convert("RGB") for x in (fast_bytes, plain_bytes))
        psnr = 10 * np.log10(255**2 / max(float((differences(a, b) ** 2).mean()), 1e-9))
        assert psnr > 38  # q95 re-encodes of two images equal within rounding

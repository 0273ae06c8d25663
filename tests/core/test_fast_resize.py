"""The SIMD shrink (stages/lib/fast_resize.py) against Pillow's resample, on real photos and
on sharp drawn content; its fallbacks to Pillow."""

from __future__ import annotations

import io
import threading

import numpy as np
import pytest
from mmcurate.pipeline.demo_data import SUBJECTS, source_photo
from mmcurate.stages.decode_image import DecodeImage, DecodeImageOptions
from mmcurate.stages.lib import fast_resize
from mmcurate.stages.lib.fast_resize import FAST_FILTERS, shrink
from PIL import Image, ImageDraw

PHOTOS = [source_photo(name).convert("RGB") for name in list(SUBJECTS)[:4]]
# Sizes a 256-px resize meets after libjpeg's draft (factors 1-2), a large factor, and slivers.
SIZES = [(0.62, 0.62), (0.97, 0.97), (0.5, 0.5), (0.13, 0.13), (0.9, 0.01), (0.003, 0.4)]


def drawing() -> Image.Image:
    """Text and thin lines: the content where resampling kernels differ most."""
    image = Image.new("RGB", (1000, 700), "white")
    draw = ImageDraw.Draw(image)
    for i in range(0, 1000, 7):
        draw.line([(i, 0), (1000 - i, 700)], fill=(i % 256, 40, 200), width=1)
    for row in range(20):
        draw.text((10, 10 + 34 * row), "The quick brown fox 0123456789 " * 3, fill="black")
    return image


def differences(a: Image.Image, b: Image.Image) -> np.ndarray:
    assert a.size == b.size and a.mode == b.mode == "RGB"
    return np.abs(np.asarray(a, np.int16) - np.asarray(b, np.int16))


@pytest.fixture(autouse=True)
def simd_path_is_present():
    assert fast_resize.available()  # a dependency: the SIMD path is the one under test


@pytest.mark.parametrize("method", list(FAST_FILTERS))
def test_shrink_matches_pillow(method):
    for image in [*PHOTOS, drawing()]:
        for fx, fy in SIZES:
            size = (max(1, round(image.width * fx)), max(1, round(image.height * fy)))
            diff = differences(shrink(image, size, method), image.resize(size, method))
            assert diff.mean() < 0.25, (method, size)  # rounding: mostly 0, at most 1 level
            # A box filter's edge may fall one pixel over from where Pillow puts it: a rare
            # column or row differs, everything else within a level or two.
            assert (diff > 2).mean() < 0.005, (method, size)


@pytest.mark.parametrize("method", [Image.Resampling.BICUBIC, Image.Resampling.LANCZOS])
def test_other_filters_and_modes_are_pillows_own(method):
    image = drawing()
    size = (image.width // 3, image.height // 3)
    assert shrink(image, size, method).tobytes() == image.resize(size, method).tobytes()
    grey = image.convert("L")
    assert (
        shrink(grey, size, Image.Resampling.BOX).tobytes()
        == grey.resize(size, Image.Resampling.BOX).tobytes()
    )


def test_the_source_image_is_left_as_it_was():
    before = PHOTOS[1].tobytes()
    shrink(PHOTOS[1], (10, 10), Image.Resampling.BOX)
    assert PHOTOS[1].tobytes() == before


class Broken:
    """An extension that fails, as cykooz.resizer does with Pillow 10's image capsule."""

    def resize_pil(self, *args: object) -> None:
        raise ValueError("PyCapsule_GetPointer called with incorrect name")


class Garbage:
    """An extension that writes wrong pixels (a Pillow whose memory layout it misreads)."""

    def resize_pil(self, src: Image.Image, dst: Image.Image, options: object) -> None:
        dst.paste((255, 0, 255), (0, 0, *dst.size))


@pytest.mark.parametrize("extension", [Broken, Garbage, None])
def test_a_failing_or_missing_extension_leaves_the_work_to_pillow(monkeypatch, extension):
    monkeypatch.setattr(fast_resize, "Resizer", extension)
    monkeypatch.setattr(fast_resize, "_USABLE", [])
    assert not fast_resize.available()
    size = (PHOTOS[0].width // 2, PHOTOS[0].height // 2)
    out = shrink(PHOTOS[0], size, Image.Resampling.BOX)
    assert out.tobytes() == PHOTOS[0].resize(size, Image.Resampling.BOX).tobytes()


def test_an_unchecked_pillow_version_leaves_the_work_to_pillow(monkeypatch):
    monkeypatch.setattr(fast_resize.PIL, "__version__", "99.0.0")
    monkeypatch.setattr(fast_resize, "_USABLE", [])
    assert not fast_resize.available()


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
    monkeypatch.setattr(fast_resize, "_USABLE", [False])  # Pillow's resample, as a fallback
    plain = [stage.decode_one(b) for b in blobs]
    for (fast_bytes, fast_meta, _), (plain_bytes, plain_meta, _) in zip(fast, plain, strict=True):
        assert fast_meta == plain_meta and min(fast_meta["width"], fast_meta["height"]) == 256
        a, b = (Image.open(io.BytesIO(x)).convert("RGB") for x in (fast_bytes, plain_bytes))
        psnr = 10 * np.log10(255**2 / max(float((differences(a, b) ** 2).mean()), 1e-9))
        assert psnr > 38  # q95 re-encodes of two images equal within rounding

"""Shrinking an RGB image with SIMD convolutions (fast_image_resize, via `cykooz.resizer`).

Pillow's resample has no SIMD in its wheels: shrinking a photo to 256 px costs it about 1.1 ms
here, against 0.35-0.45 ms for fast_image_resize's AVX2 kernels (docs/benchmarks/ingest.md). Only
the box (`area`) and bilinear filters take this path: there the two agree within a level or two
(a box edge may fall one pixel over). Their bicubic and Lanczos kernels differ from Pillow's by
tens of levels at sharp edges, so those stay on Pillow, as does any mode other than RGB.

fast_image_resize reads Pillow's image memory in place, through a layout that differs between
Pillow versions (Pillow 10 fails it outright). So the SIMD path is used only with a Pillow major
checked here, and only after it has matched Pillow on a test image in this process; otherwise,
or where the wheel is missing, Pillow does the work.
"""

from __future__ import annotations

import logging

import PIL
from PIL import Image, ImageChops

try:
    from cykooz_resizer import FilterType, ResizeAlg, ResizeOptions, Resizer
except ImportError:  # no wheel for this platform
    Resizer = None

log = logging.getLogger(__name__)

CHECKED_PILLOW_MAJORS = (11, 12, 13)  # each run against tests/core/test_fast_resize.py's checks
FAST_FILTERS = {Image.Resampling.BOX: "box", Image.Resampling.BILINEAR: "bilinear"}
MAX_CHECK_DIFFERENCE = 2  # levels, on the test image
_OPTIONS = (
    {
        method: ResizeOptions(resize_alg=ResizeAlg.convolution(getattr(FilterType, name)))
        for method, name in FAST_FILTERS.items()
    }
    if Resizer is not None
    else {}
)
_USABLE: list[bool] = []  # the check's verdict, once per process


def available() -> bool:
    """Whether `shrink` takes the SIMD path in this process."""
    if not _USABLE:
        _USABLE.append(_check())
    return _USABLE[0]


def shrink(image: Image.Image, size: tuple[int, int], method: Image.Resampling) -> Image.Image:
    """`image.resize(size, method)` for a shrink (no side grows); SIMD where it applies."""
    if image.mode != "RGB" or method not in FAST_FILTERS or not available():
        return image.resize(size, method)
    return _simd(image, size, method)


def _simd(image: Image.Image, size: tuple[int, int], method: Image.Resampling) -> Image.Image:
    out = Image.new("RGB", size)
    # A Resizer costs ~1 us and keeps scratch buffers: one per call frees them with it.
    Resizer().resize_pil(image, out, _OPTIONS[method])
    return out


def _check() -> bool:
    if Resizer is None:
        return False
    major = int(PIL.__version__.split(".")[0])
    if major not in CHECKED_PILLOW_MAJORS:
        log.warning("Pillow %s is not one the SIMD resize was checked with", PIL.__version__)
        return False
    sample = Image.merge(
        "RGB",
        [
            Image.linear_gradient("L").resize((97, 61)),
            Image.radial_gradient("L").resize((97, 61)),
            Image.linear_gradient("L").rotate(90).resize((97, 61)),
        ],
    )
    try:
        fast = _simd(sample, (40, 25), Image.Resampling.BOX)
    # Why broad: whatever goes wrong in the extension, Pillow can still do the work.
    except Exception as err:  # noqa: BLE001
        log.warning("SIMD resize unusable here (%s); Pillow resizes", err)
        return False
    plain = sample.resize((40, 25), Image.Resampling.BOX)
    worst = max(high for _, high in ImageChops.difference(fast, plain).getextrema())
    if worst > MAX_CHECK_DIFFERENCE:
        log.warning("SIMD resize differs from Pillow's by %d levels; Pillow resizes", worst)
    return worst <= MAX_CHECK_DIFFERENCE

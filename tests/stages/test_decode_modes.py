"""decode_image on the images a real folder holds beyond 8-bit RGB photos: grey deeper than
8 bits keeps its brightness, and enlarging (`upscale`) never builds more pixels than
`max_pixels` allows, however thin the source."""

from __future__ import annotations

import io

import numpy as np
import pytest
from mmcurate.stages.base import DROP
from mmcurate.stages.registry import build_stage
from PIL import Image

from tests.kit_stages import batch_of


def encoded(image: Image.Image, fmt: str) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt)
    return out.getvalue()


def decode(blobs: list[bytes], **options) -> tuple[list[str | None], list[Image.Image | None]]:
    stage = build_stage({"name": "decode_image", "format": "png", **options})
    out = stage(batch_of(blobs))
    images = [None if b is None else Image.open(io.BytesIO(b)) for b in out["png"]]
    return out[DROP], images


@pytest.mark.parametrize(
    ("value", "expected"), [(0, 0), (255, 1), (256, 1), (32768, 128), (65535, 255)]
)
def test_sixteen_bit_grey_is_scaled_by_its_own_range_not_by_its_values(value, expected):
    """A dark 16-bit PNG whose values all stay under 256 used to be read as 8-bit: white."""
    png = encoded(Image.fromarray(np.full((8, 8), value, dtype=np.uint16)), "PNG")
    assert Image.open(io.BytesIO(png)).mode == "I;16"
    drops, (image,) = decode([png], resize={"mode": "none"})
    assert drops == [None]
    assert np.asarray(image.convert("RGB"))[0, 0].tolist() == [expected] * 3


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([0.0, 0.5, 1.0], [0, 128, 255]),  # a 0-1 float image
        ([0.0, 100.0, 255.0], [0, 100, 255]),  # float holding 8-bit values
        ([0.0, 1000.0, 65535.0], [0, 4, 255]),  # float holding 16-bit values
        ([float("nan"), 0.5, float("inf")], [0, 128, 0]),  # not numbers: black, not a crash
    ],
)
def test_float_grey_is_scaled_to_the_smallest_usual_range_holding_it(values, expected):
    pixels = np.array([values] * 3, dtype=np.float32)
    tiff = encoded(Image.fromarray(pixels, mode="F"), "TIFF")
    drops, (image,) = decode([tiff], resize={"mode": "none"})
    assert drops == [None]
    assert np.asarray(image.convert("L"))[0].tolist() == expected


def test_enlarging_a_thin_strip_crops_first_and_keeps_within_max_pixels():
    """1 x 4,000 pixels, enlarged to a 256 px short side: 256 x 1,024,000 pixels if enlarged
    whole before the centre crop; the crop comes first, so only its square is enlarged."""
    strip = encoded(Image.new("RGB", (1, 4000), (10, 200, 10)), "PNG")
    center = {"size": 256, "mode": "center_crop", "upscale": True}
    drops, (image,) = decode([strip], resize=center, max_pixels=1_000_000)
    assert drops == [None] and image.size == (256, 256)
    assert np.asarray(image.convert("RGB"))[128, 128].tolist() == [10, 200, 10]
    keep = {"size": 256, "mode": "keep_ratio", "upscale": True}  # 256 x 1,024,000 to produce
    assert decode([strip], resize=keep, max_pixels=1_000_000)[0] == ["too_many_pixels"]
    short = encoded(Image.new("RGB", (2, 40), (10, 200, 10)), "PNG")  # 256 x 5,120 to produce
    drops, (image,) = decode([short], resize=keep, max_pixels=1_400_000)
    assert drops == [None] and image.size == (256, 5120)
    assert decode([short], resize=keep, max_pixels=1_300_000)[0] == ["too_many_pixels"]


def test_centre_crop_after_enlarging_one_short_side_is_the_same_square():
    """200 x 1,000 with a 256 px crop: the centred 200 px square enlarged, as the enlarged
    image's centred square was before (same pixels within rounding)."""
    rng = np.random.default_rng(0)
    photo = Image.fromarray(rng.integers(0, 256, (1000, 200, 3), dtype=np.uint8))
    center = {"size": 256, "mode": "center_crop", "upscale": True}
    drops, (image,) = decode([encoded(photo, "PNG")], resize=center)
    assert drops == [None] and image.size == (256, 256)
    whole = photo.resize((256, 1280), Image.Resampling.BICUBIC).crop((0, 512, 256, 768))
    difference = np.abs(np.asarray(image, dtype=int) - np.asarray(whole, dtype=int))
    assert difference.mean() < 1.0

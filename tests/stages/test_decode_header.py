"""The loader's image decode reads a JPEG's size from its frame header (not through PIL's
parser) for the decompression-bomb check: the size must be PIL's, the limit PIL's, and a
damaged file must still end as an error the loader counts, never a crash or a wrong size."""

from __future__ import annotations

import io
import random
import warnings

import numpy as np
import pytest
import torch
from mmcurate.trainer.data.transform import check_image_header, decode_rgb, jpeg_size
from PIL import Image

from tests.http_corpus import photo_bytes

PIL_DEFAULT_LIMIT = 1024 * 1024 * 1024 // 4 // 3  # Image.MAX_IMAGE_PIXELS as PIL ships it
USABLE_ERRORS = (OSError, ValueError, RuntimeError, Image.DecompressionBombError)


@pytest.fixture(autouse=True)
def pil_default_limit(monkeypatch):
    """PIL's limit as it ships: a decode_image stage set up by another test of the same
    process raises the global limit to its `max_pixels`."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", PIL_DEFAULT_LIMIT)


def jpegs() -> dict[str, bytes]:
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: neither decoder applies it, so sizes agree
    return {
        "baseline": photo_bytes(size=(320, 240)),
        "progressive": photo_bytes("coffee", size=(257, 301), progressive=True),
        "optimized q30": photo_bytes(size=(64, 48), quality=30, optimize=True),
        "exif": photo_bytes(size=(200, 100), exif=exif.tobytes()),
        "icc + comment": photo_bytes(size=(90, 60), icc_profile=b"\x00" * 3000, comment=b"hi"),
        "restart markers": photo_bytes(size=(150, 170), restart_marker_blocks=1),
        "4:2:0 odd size": photo_bytes(size=(33, 17), subsampling=2),
        "grey": grey_jpeg(),
        "cmyk": photo_bytes(size=(80, 40), mode="CMYK"),
    }


def grey_jpeg() -> bytes:
    out = io.BytesIO()
    Image.new("L", (31, 7), 128).save(out, "JPEG")
    return out.getvalue()


@pytest.mark.parametrize("name", list(jpegs()))
def test_frame_header_size_is_pils_and_the_decode_matches(name):
    data = jpegs()[name]
    image = Image.open(io.BytesIO(data))
    assert jpeg_size(data) == image.size
    decoded = decode_rgb(data)
    assert decoded.dtype == torch.uint8 and tuple(decoded.shape) == (3, image.height, image.width)
    reference = torch.from_numpy(np.array(image.convert("RGB"))).permute(2, 0, 1)
    assert (decoded.int() - reference.int()).abs().float().mean() < 2  # same pixels, ±rounding


def test_fill_bytes_before_a_marker_are_skipped_as_pil_does():
    data = jpegs()["baseline"]
    padded = data[:2] + b"\xff\xff\xff" + data[2:]  # fill bytes: allowed before any marker
    assert jpeg_size(padded) == Image.open(io.BytesIO(padded)).size == (320, 240)


def test_not_jpegs_and_malformed_segments_leave_the_header_to_pil():
    data = jpegs()["baseline"]
    assert jpeg_size(photo_bytes(fmt="PNG")) is None
    assert jpeg_size(b"") is None and jpeg_size(data[:3]) is None
    broken_length = data[:4] + b"\x00\x01" + data[6:]  # a segment length under 2
    assert jpeg_size(broken_length) is None
    assert jpeg_size(data[:20]) is None  # cut before the frame header
    decode_rgb(photo_bytes(fmt="PNG"))  # PIL's path: decodes
    with pytest.raises(USABLE_ERRORS):
        decode_rgb(data[:20])


def test_the_decompression_bomb_limit_is_pils(monkeypatch):
    data = jpegs()["baseline"]  # 320 x 240 = 76,800 pixels
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 30_000)  # twice it is under the image
    with pytest.raises(Image.DecompressionBombError):
        decode_rgb(data)
    with pytest.raises(Image.DecompressionBombError):
        check_image_header(data)
    with pytest.raises(Image.DecompressionBombError):  # PIL itself agrees
        Image.open(io.BytesIO(data))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 50_000)  # over the limit, under twice it
    with pytest.warns(Image.DecompressionBombWarning):
        assert tuple(decode_rgb(data).shape) == (3, 240, 320)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_image_header(data)


def test_a_huge_frame_header_is_refused_before_any_decode():
    """A 65,535 x 65,535 frame header on a few bytes: refused from the header alone."""
    data = jpegs()["baseline"]
    at = next(i for i in range(2, len(data)) if data[i] == 0xFF and data[i + 1] == 0xC0)
    huge = data[: at + 5] + b"\xff\xff\xff\xff" + data[at + 9 :]
    assert jpeg_size(huge) == (65535, 65535)
    with pytest.raises(Image.DecompressionBombError):
        decode_rgb(huge)


def test_damaged_jpegs_decode_or_fail_with_a_counted_error():
    rng = random.Random(3)
    base = list(jpegs().values())
    outcomes = set()
    for _ in range(300):
        data = bytearray(rng.choice(base))
        for _ in range(rng.randrange(1, 6)):
            where = rng.randrange(min(len(data), 700)) if rng.random() < 0.7 else None
            where = rng.randrange(len(data)) if where is None else where
            data[where] = rng.randrange(256)
        if rng.random() < 0.3:
            data = data[: rng.randrange(len(data))]
        try:
            image = decode_rgb(bytes(data))
        except USABLE_ERRORS:
            outcomes.add("error")
            continue
        assert image.dtype == torch.uint8 and image.dim() == 3 and image.shape[0] == 3
        size = jpeg_size(bytes(data))
        assert size is None or tuple(image.shape[1:]) == (size[1], size[0])
        outcomes.add("image")
    assert outcomes == {"error", "image"}


def test_a_frame_header_hidden_from_the_decoder_does_not_pass_the_limit(monkeypatch):
    """Headers crafted so that a naive marker walk finds a 1 x 1 frame the decoder never
    reads: a stuffed 0xFF00 "marker" jumping into a comment, and a second frame header. The
    limit must still hold the real 320 x 240 frame, as PIL's own check does."""
    real = jpegs()["baseline"]
    fake_frame = b"\xff\xc0\x00\x11\x08\x00\x01\x00\x01\x03\x01\x11\x00\x02\x11\x01\x03\x11\x01"
    comment = b"\xff\xfe" + (5 + len(fake_frame)).to_bytes(2, "big") + b"pad" + fake_frame
    stuffed = b"\xff\xd8\xff\x00\x00\x09" + comment + real[2:]
    frame = real.index(b"\xff\xc0")
    two_frames = (
        real[:frame] + b"\xff\xc0\x00\x0b\x08\x00\x01\x00\x01\x01\x01\x11\x00" + real[frame:]
    )
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    for crafted in (stuffed, two_frames):
        assert jpeg_size(crafted) is None  # left to PIL
        for check in (check_image_header, decode_rgb):
            with pytest.raises(Image.DecompressionBombError):
                check(crafted)


def test_a_zero_limit_refuses_every_image_as_pil_does(monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 0)
    with pytest.raises(Image.DecompressionBombError):
        check_image_header(jpegs()["grey"])

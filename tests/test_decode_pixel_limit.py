"""The build's decode_image stage drops big images itself (`too_many_pixels`) and must not
take PIL's decompression-bomb limit away from anything else in the process: a build and a
training loader share one interpreter in `mmcurate demo` and in notebooks."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
from PIL import Image

from stages.base import DROP
from stages.registry import build_stage
from tests.test_stages import batch_of, jpeg
from trainer.data.transform import check_image_header

PIL_DEFAULT_LIMIT = 1024 * 1024 * 1024 // 4 // 3  # Image.MAX_IMAGE_PIXELS as PIL ships it


@pytest.fixture(autouse=True)
def pil_default_limit(monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", PIL_DEFAULT_LIMIT)


def huge_header_jpeg() -> bytes:
    """A small JPEG whose frame header says 65,535 x 65,535 (4.3 billion pixels)."""
    data = jpeg((32, 24))
    at = next(i for i in range(2, len(data)) if data[i] == 0xFF and data[i + 1] == 0xC0)
    return data[: at + 5] + b"\xff\xff\xff\xff" + data[at + 9 :]


def test_importing_every_stage_leaves_pils_limit_alone():
    code = (
        "from PIL import Image; before = Image.MAX_IMAGE_PIXELS; "
        "import pipeline.build, stages.registry, trainer.data.dataset; "
        "print(before, Image.MAX_IMAGE_PIXELS)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    before, after = out.stdout.split()
    assert before == after == str(PIL_DEFAULT_LIMIT)


@pytest.mark.parametrize(
    ("limit", "max_pixels", "expected"),
    [
        (PIL_DEFAULT_LIMIT, 1000, PIL_DEFAULT_LIMIT),  # a lower cap does not lower PIL's
        (PIL_DEFAULT_LIMIT, 500_000_000, 500_000_000),  # a higher one raises it to the cap
        (None, 500_000_000, None),  # a user who turned it off keeps it off
    ],
)
def test_setup_raises_pils_limit_to_max_pixels_only_where_lower(
    monkeypatch, limit, max_pixels, expected
):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", limit)
    build_stage({"name": "decode_image", "max_pixels": max_pixels}).setup()
    assert Image.MAX_IMAGE_PIXELS == expected


def test_a_loader_after_a_build_in_the_same_process_still_refuses_a_bomb():
    stage = build_stage({"name": "decode_image"})
    out = stage(batch_of([jpeg((300, 200)), huge_header_jpeg()]))
    assert out[DROP] == [None, "too_many_pixels"]
    with pytest.raises(Image.DecompressionBombError):
        check_image_header(huge_header_jpeg())  # the trainer's check, same interpreter


def test_an_image_over_a_limit_lowered_after_setup_is_a_size_drop_not_a_crash(monkeypatch):
    stage = build_stage({"name": "decode_image"})
    assert stage(batch_of([jpeg((20, 20))]))[DROP] == [None]  # set up
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # e.g. set by the user's own code
    out = stage(batch_of([jpeg((100, 100)), jpeg((20, 20))]))  # 10,000 > 2 x 1,000
    assert out[DROP] == ["too_many_pixels", None]
    assert Image.open(io.BytesIO(out["jpg"][1])).size == (20, 20)

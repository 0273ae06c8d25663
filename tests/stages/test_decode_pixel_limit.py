"""The build's decode_image stage drops big images itself (`too_many_pixels`) and must not
take PIL's decompression-bomb limit away from anything else in the process: a build and a
training loader share one interpreter in `mmcurate demo` and in notebooks."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
from mmcurate.stages.base import DROP
from mmcurate.stages.registry import build_stage
from mmcurate.trainer.data.transform import check_image_header
from PIL import Image

from tests.kit_stages import batch_of, jpeg

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
        "import mmcurate.pipeline.build, mmcurate.stages.registry, mmcurate.trainer.data.dataset; "
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


# ---- every stage that decodes applies decode_image's limit from the header (issue 45) ----

HUGE_SIDE = 12_000  # 144 million pixels: over decode_image's 100 million, under 2 x PIL's


@pytest.fixture(scope="module")
def huge_png(tmp_path_factory) -> bytes:
    """A real, decodable 12,000 x 12,000 PNG of about 18 KB (blank 1-bit compresses well);
    decoded to RGB it is 432 MB."""
    path = tmp_path_factory.mktemp("huge") / "huge.png"
    Image.new("1", (HUGE_SIDE, HUGE_SIDE)).save(path, "PNG")
    return path.read_bytes()


def aesthetic_weights(folder) -> str:
    import torch

    torch.manual_seed(0)
    path = str(folder / "head.pth")
    torch.save(torch.nn.Linear(64, 1).state_dict(), path)
    return path


TINY = {"model": "mmcurate-tiny", "pretrained": None, "num_gpus": 0}
DECODING_STAGES = {
    "clip_score": lambda d: {"name": "clip_score", **TINY},
    "aesthetic_score": lambda d: {
        "name": "aesthetic_score",
        "weights": aesthetic_weights(d),
        **TINY,
    },
    "semantic_dedupe": lambda d: {
        "name": "semantic_dedupe",
        "model": "mmcurate-tiny",
        "pretrained": None,
    },
    "exact_dedupe of pixels": lambda d: {"name": "exact_dedupe", "of": "pixels"},
    "near_dedupe": lambda d: {"name": "near_dedupe"},
    "aspect_buckets": lambda d: {"name": "aspect_buckets", "preset": "sdxl"},
    "decode_image": lambda d: {"name": "decode_image"},
}


@pytest.mark.parametrize("name", DECODING_STAGES)
def test_every_decoding_stage_drops_a_huge_image_as_decode_image_does(tmp_path, huge_png, name):
    stage = build_stage(DECODING_STAGES[name](tmp_path))
    stage.setup()
    small = jpeg((1024, 1024))
    out = stage(batch_of([small, huge_png]))
    assert out[DROP] == [None, "too_many_pixels"]


PEAK_SCRIPT = """
import resource, sys
from mmcurate.stages.registry import build_stage
from tests.kit_stages import batch_of, jpeg
stage = build_stage({"name": "aesthetic_score", "weights": sys.argv[1], "model": "mmcurate-tiny",
                     "pretrained": None, "num_gpus": 0})
stage.setup()
stage(batch_of([jpeg((64, 64))]))  # the model loaded and run once: its peak is behind us
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = stage(batch_of([open(sys.argv[2], "rb").read()]))
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(out["__drop__"][0], grown // 1024)
"""


def test_a_model_stage_listed_first_never_decodes_the_huge_image(tmp_path, huge_png):
    """The issue's case in a fresh process: aesthetic_score first, one 12,000 x 12,000 PNG.
    Decoded, the worker's peak grew by about 600 MB; refused from its header, by nothing."""
    png = tmp_path / "huge.png"
    png.write_bytes(huge_png)
    out = subprocess.run(
        [sys.executable, "-c", PEAK_SCRIPT, aesthetic_weights(tmp_path), str(png)],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    reason, grown_mib = out.stdout.split()
    assert reason == "too_many_pixels"
    assert int(grown_mib) < 64  # RGB of it alone is 412 MiB

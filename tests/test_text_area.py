"""text_area: the PP-OCRv4 detector (from the installed rapidocr wheel, through onnxruntime) on
real photos with rendered text of known extent, on textures without text, and on bad input."""

from __future__ import annotations

import io
import json
import struct
import zlib

import av
import numpy as np
import pytest
import skimage.data
from mmcurate.core.config_io import ConfigError
from mmcurate.stages.base import DROP, DROP_STAGE
from mmcurate.stages.lib.text_detect import union_area
from mmcurate.stages.registry import build_stage
from PIL import Image, ImageDraw, ImageFont

WORDS = ["SALE 50% OFF", "Breaking news today", "subscribe now", "Weather 21C", "GOAL 2:1"]


def jpeg(pixels: np.ndarray | Image.Image) -> bytes:
    image = pixels if isinstance(pixels, Image.Image) else Image.fromarray(pixels)
    out = io.BytesIO()
    image.convert("RGB").save(out, "JPEG", quality=92)
    return out.getvalue()


def with_text(base: Image.Image, size: int, lines: int, seed: int) -> tuple[Image.Image, float]:
    """`base` with `lines` lines of text; the true share is the union of the lines' boxes."""
    rng = np.random.default_rng(seed)
    image = base.convert("RGB").copy()
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=size)
    boxes, top = [], int(image.height * 0.08)
    for k in range(lines):
        text = WORDS[(seed + k) % len(WORDS)]
        xy = (int(rng.integers(4, max(5, image.width // 6))), top)
        box = draw.textbbox(xy, text, font=font)
        dark = float(np.asarray(image.crop(box).convert("L")).mean()) > 128
        draw.text(xy, text, font=font, fill=(10, 10, 10) if dark else (255, 255, 255))
        boxes.append([box[0] / image.width, box[1] / image.height])
        boxes[-1] += [min(box[2], image.width) / image.width, box[3] / image.height]
        top = box[3] + int(size * 0.9)
    return image, union_area(np.array(boxes, np.float32))


def plain(width: int, height: int, colour: tuple[int, int, int]) -> Image.Image:
    return Image.new("RGB", (width, height), colour)


def text_cases() -> list[tuple[str, Image.Image, float]]:
    photos = {
        "astronaut": Image.fromarray(skimage.data.astronaut()),
        "coffee": Image.fromarray(skimage.data.coffee()),
        "chelsea": Image.fromarray(skimage.data.chelsea()),
    }
    specs = [
        ("astronaut", 40, 2),
        ("astronaut", 24, 4),
        ("coffee", 48, 1),
        ("coffee", 30, 3),
        ("chelsea", 36, 2),
        ("chelsea", 20, 5),
        ("plain_white", 32, 3),
        ("plain_blue", 56, 2),
        ("plain_grey_small", 16, 2),
        ("astronaut_small", 18, 2),
    ]
    cases = []
    for seed, (name, size, lines) in enumerate(specs):
        if name in photos:
            base = photos[name]
        elif name == "astronaut_small":
            base = photos["astronaut"].resize((256, 256))
        elif name == "plain_grey_small":
            base = plain(200, 120, (120, 120, 120))
        else:
            base = plain(640, 400, (255, 255, 255) if name == "plain_white" else (20, 40, 160))
        image, truth = with_text(base, size, lines, seed)
        cases.append((f"{name}-{size}px-{lines}lines", image, truth))
    return cases


def textures() -> dict[str, np.ndarray]:
    x = np.arange(320)
    stripes = np.where((x // 12) % 2 == 0, 230, 25).astype(np.uint8)
    rng = np.random.default_rng(3)
    bars = np.repeat(rng.integers(1, 5, 60), 2)  # bar widths 1-4 px, alternating colour
    code = np.concatenate([np.full(w, 0 if k % 2 else 255) for k, w in enumerate(bars)])
    barcode = np.full((160, 360), 255, np.uint8)
    barcode[30:130, 20 : 20 + min(len(code), 320)] = code[:320]
    return {
        "brick": skimage.data.brick(),
        "gravel": skimage.data.gravel(),
        "stripes": np.tile(stripes, (240, 1)),
        "barcode": barcode,
    }


def run(stage, columns: dict) -> dict:
    size = len(columns["__key__"])
    batch = {**columns, DROP: [None] * size, DROP_STAGE: [None] * size}
    return stage(batch)


@pytest.fixture(scope="module")
def stage():
    return build_stage({"name": "text_area", "max_area": 0.3, "batch_size": 4})


def test_area_matches_the_rendered_text(stage):
    cases = text_cases()
    out = run(stage, {"__key__": [c[0] for c in cases], "jpg": [jpeg(c[1]) for c in cases]})
    errors = {}
    for (name, _, truth), meta in zip(cases, out["json"], strict=True):
        fields = json.loads(meta)
        errors[name] = (round(fields["text_area"] - truth, 3), round(truth, 3))
        assert fields["text_boxes"] and all(0 <= v <= 1 for b in fields["text_boxes"] for v in b)
    close = [name for name, (err, _) in errors.items() if abs(err) <= 0.05]
    assert len(close) >= 0.9 * len(cases), errors


def test_textures_without_text_score_near_zero(stage):
    names, pictures = zip(*textures().items(), strict=True)
    out = run(stage, {"__key__": list(names), "png": [png(p) for p in pictures]})
    areas = {n: json.loads(m)["text_area"] for n, m in zip(names, out["json"], strict=True)}
    assert all(area < 0.01 for area in areas.values()), areas
    assert out[DROP] == [None] * len(names)


def png(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def test_max_area_drops_and_bad_images_get_their_reason(stage):
    full, _ = with_text(plain(320, 200, (255, 255, 255)), 44, 4, 0)
    clean = jpeg(skimage.data.brick())
    out = run(
        stage,
        {
            "__key__": ["full", "clean", "corrupt", "huge", "none"],
            "jpg": [jpeg(full), clean, clean[:300], None, None],
            "png": [None, None, None, huge_png_header(), None],
        },
    )
    assert out[DROP] == ["text_area", None, "decode_error", "too_many_pixels", "no_image"]
    assert out[DROP_STAGE][0] == "text_area"
    assert json.loads(out["json"][0])["text_area"] > 0.3


def huge_png_header() -> bytes:
    """A real small PNG whose header claims 20,000 x 20,000 pixels (refused unread)."""
    data = png(np.zeros((8, 8), np.uint8))
    ihdr = b"IHDR" + struct.pack(">II", 20_000, 20_000) + data[24:29]
    return data[:12] + ihdr + struct.pack(">I", zlib.crc32(ihdr)) + data[33:]


def test_video_takes_its_frame_with_most_text(stage):
    texty, truth = with_text(Image.fromarray(skimage.data.coffee()), 40, 3, 1)
    frames = {"000.jpg": [jpeg(skimage.data.coffee())], "001.jpg": [jpeg(texty)]}
    out = run(stage, {"__key__": ["v"], "mp4": [b"unused: frames are there"], **frames})
    fields = json.loads(out["json"][0])
    assert abs(fields["text_area"] - truth) <= 0.05


def test_video_without_frames_is_decoded_here(stage):
    texty, truth = with_text(plain(160, 96, (20, 40, 160)), 18, 2, 2)
    out = run(stage, {"__key__": ["v", "bad"], "mp4": [encode([texty] * 24), b"\x00" * 500]})
    assert out[DROP][1] in {"decode_error", "no_video_stream", "no_frames"}
    assert abs(json.loads(out["json"][0])["text_area"] - truth) <= 0.05


def encode(frames: list[Image.Image]) -> bytes:
    out = io.BytesIO()
    with av.open(out, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=12)
        stream.width, stream.height, stream.pix_fmt = frames[0].width, frames[0].height, "yuv420p"
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_image(frame)))
        container.mux(stream.encode())
    return out.getvalue()


@pytest.mark.parametrize(
    "options, words",
    [
        ({"recognize": True}, "not available yet"),
        ({"min_area": 0.5, "max_area": 0.2}, "above max_area"),
        ({"max_area": 1.5}, "max_area"),
    ],
)
def test_bad_options_are_one_line(options, words):
    with pytest.raises(ConfigError) as err:
        build_stage({"name": "text_area", **options})
    assert words in str(err.value) and "\n" not in str(err.value)

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

from tests.kit_text_area import jpeg, with_text


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


FONTS = [
    "dejavu/DejaVuSans.ttf",
    "dejavu/DejaVuSerif-Bold.ttf",
    "liberation/LiberationMono-Regular.ttf",
    "liberation/LiberationSans-BoldItalic.ttf",
    "liberation/LiberationSerif-Regular.ttf",
    "dejavu/DejaVuSansCondensed-Oblique.ttf",
]
FONT_DIR = "/usr/share/fonts/truetype/"
LEXICON = (
    "sale today breaking news weather live goal final offer new season subscribe watch now "
    "limited free shipping best price world cup exclusive interview"
).split()
PHOTOS = ["astronaut", "coffee", "chelsea", "rocket", "cat", "hubble_deep_field"]


def line_of_words(draw: ImageDraw.ImageDraw, font, width: float, rng) -> str:
    text = LEXICON[rng.integers(len(LEXICON))]
    while True:
        longer = f"{text} {LEXICON[rng.integers(len(LEXICON))]}"
        if draw.textlength(longer, font=font) > width:
            return text
        text = longer


def dense_text(seed: int) -> tuple[Image.Image, float]:
    """A real photo covered with lines of text (several fonts and sizes, outlined as overlays
    are): 0.3 to 0.8 of it is text. The true share is the union of the lines' boxes."""
    rng = np.random.default_rng(seed)
    base = Image.fromarray(getattr(skimage.data, PHOTOS[seed % len(PHOTOS)])()).convert("RGB")
    scale = 480 / max(base.size) * rng.uniform(0.8, 1.2)
    image = base.resize((int(base.width * scale), int(base.height * scale)))
    draw, (width, height) = ImageDraw.Draw(image), image.size
    # spaced lines, lines packed close, or lines packed close across nearly the whole width
    packing = seed % 3
    wide = (0.75, 0.97) if packing < 2 else (0.9, 0.98)
    gaps = [(0.1, 0.4), (0.0, 0.06), (0.0, 0.02)][packing]
    boxes, top = [], int(height * rng.uniform(0.01, 0.06))
    while True:
        size = int(height * rng.uniform(0.08, 0.16 if packing < 2 else 0.2))
        font = ImageFont.truetype(FONT_DIR + FONTS[rng.integers(len(FONTS))], size)
        text = line_of_words(draw, font, width * rng.uniform(*wide), rng)
        if packing == 2:  # the line's size set so that it spans the chosen width
            fit = width * rng.uniform(*wide) / draw.textlength(text, font=font)
            font = font.font_variant(size=max(8, min(int(size * fit), int(height * 0.25))))
        x = int(rng.uniform(0.02, 0.98) * max(1, width - draw.textlength(text, font=font)))
        stroke = int(rng.integers(1, 3))
        box = draw.textbbox((x, top), text, font=font, stroke_width=stroke)
        if box[3] > height * 0.97:
            break
        dark = float(np.asarray(image.crop(box).convert("L")).mean()) > 128
        ink, edge = ((10, 10, 10), (255, 255, 255)) if dark else ((255, 255, 255), (0, 0, 0))
        draw.text((x, top), text, font=font, fill=ink, stroke_width=stroke, stroke_fill=edge)
        boxes.append([box[0] / width, box[1] / height, min(box[2], width) / width, box[3] / height])
        top = box[3] + int(size * rng.uniform(*gaps))
    return image, union_area(np.array(boxes, np.float32))


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


def test_area_of_pictures_mostly_covered_by_text(stage):
    """0.3 to 0.8 of a real photo is text (lines of several fonts and sizes, spaced or packed
    close): text_area is within 0.05 of the union of the lines' boxes on >= 90% of them."""
    cases = [dense_text(seed) for seed in range(12)]
    assert all(0.3 <= truth <= 0.8 for _, truth in cases), [t for _, t in cases]
    assert max(truth for _, truth in cases) > 0.7
    out = run(stage, {"__key__": [f"d{i}" for i in range(12)], "jpg": [jpeg(c[0]) for c in cases]})
    errors = [
        json.loads(m)["text_area"] - truth for m, (_, truth) in zip(out["json"], cases, strict=True)
    ]
    assert sum(abs(e) <= 0.05 for e in errors) >= 0.9 * len(cases), np.round(errors, 3)


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
        ({"recognize": True, "text_score": 1.5}, "text_score"),
        ({"min_area": 0.5, "max_area": 0.2}, "above max_area"),
        ({"max_area": 1.5}, "max_area"),
    ],
)
def test_bad_options_are_one_line(options, words):
    with pytest.raises(ConfigError) as err:
        build_stage({"name": "text_area", **options})
    assert words in str(err.value) and "\n" not in str(err.value)


READ = ["SALE 50% OFF", "Breaking news", "Weather 21C", "subscribe now", "GOAL 2:1", "Hello World"]


def rendered_lines(seed: int) -> tuple[Image.Image, list[tuple[str, list[float]]]]:
    """A real photo with the READ lines in several fonts and sizes: (picture, [(text, box)])."""
    image = Image.fromarray(getattr(skimage.data, PHOTOS[seed])()).convert("RGB")
    image = image.resize((640, int(640 * image.height / image.width)))
    draw, lines, top = ImageDraw.Draw(image), [], 12
    for k, text in enumerate(READ):
        font = ImageFont.truetype(FONT_DIR + FONTS[(seed + k) % len(FONTS)], 26 + 3 * k)
        box = draw.textbbox((16 + 9 * k, top), text, font=font, stroke_width=2)
        draw.text(
            (16 + 9 * k, top), text, font=font, fill="white", stroke_width=2, stroke_fill="black"
        )
        lines.append(
            (
                text,
                [
                    box[0] / image.width,
                    box[1] / image.height,
                    box[2] / image.width,
                    box[3] / image.height,
                ],
            )
        )
        top = box[3] + 14
    return image, lines


def test_recognize_reads_rendered_lines():
    """recognize: true stores `text_lines` (box, text, score) in reading order; the boxes inside
    each rendered line, read left to right, give its text (spaces aside: the recogniser may
    drop those between words) for most lines."""
    stage = build_stage({"name": "text_area", "recognize": True})
    pictures = [rendered_lines(seed) for seed in range(2)]
    out = run(stage, {"__key__": ["a", "b"], "jpg": [jpeg(p) for p, _ in pictures]})
    right, total = 0, 0
    for meta, (_, truth) in zip(out["json"], pictures, strict=True):
        found = json.loads(meta)["text_lines"]
        assert all(set(f) == {"box", "text", "score"} and 0.5 <= f["score"] <= 1 for f in found)
        for text, box in truth:
            inside = [
                f["text"] for f in found if box[1] <= (f["box"][1] + f["box"][3]) / 2 <= box[3]
            ]
            right += "".join(inside).replace(" ", "") == text.replace(" ", "")
            total += 1
    assert right >= 0.8 * total, out["json"]

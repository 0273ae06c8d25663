"""clip_score `mask_text: true` (T-MARS, issue 50): the text boxes text_area stored in the json
are masked before scoring, so the score of a picture with rendered text changes and the score
of one without text (no boxes) does not; a sample without text_area's boxes is a counted drop."""

from __future__ import annotations

import io
import json

import numpy as np
from mmcurate.pipeline.demo_data import iter_samples
from mmcurate.stages.base import DROP
from mmcurate.stages.lib.picture_batches import box_pixels, mask_boxes
from mmcurate.stages.registry import build_stage
from PIL import Image, ImageDraw, ImageFont

from tests.kit_stages import batch_of

TINY = {"name": "clip_score", "model": "mmcurate-tiny", "pretrained": None, "num_gpus": 0}
CAPTION = "a red sign that says open"


def with_text(photo: bytes) -> tuple[bytes, list[float]]:
    """The photo with the caption's words rendered large; its normalised box (as text_area
    stores `text_boxes`)."""
    image = Image.open(io.BytesIO(photo)).convert("RGB").resize((128, 128))
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=22)
    box = draw.textbbox((6, 40), "OPEN SIGN", font=font)
    draw.rectangle(box, fill=(250, 250, 250))
    draw.text((6, 40), "OPEN SIGN", font=font, fill=(200, 10, 10))
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue(), [box[0] / 128, box[1] / 128, box[2] / 128, box[3] / 128]


def scores(options: dict, pictures: list[bytes], metas: list[dict | None]) -> list:
    batch = batch_of(pictures, [CAPTION] * len(pictures))
    batch["json"] = [json.dumps(m) if m is not None else None for m in metas]
    out = build_stage({**TINY, **options})(batch)
    return [(s, r) for s, r in zip(out["clip_score"], out[DROP], strict=True)]


def test_masking_changes_the_score_of_text_only():
    photos = [s.data for s in iter_samples(2, seed=7)]
    texted, box = with_text(photos[0])
    plain = photos[1]
    metas = [{"text_boxes": [box]}, {"text_boxes": []}, {}]
    pictures = [texted, plain, plain]
    before = scores({}, pictures, metas)
    masked = scores({"mask_text": True}, pictures, metas)
    blurred = scores({"mask_text": True, "mask_fill": "blur"}, pictures, metas)
    assert before[0][1] is None and masked[0][1] is None
    assert masked[0][0] != before[0][0] and blurred[0][0] != before[0][0]
    assert masked[0][0] != blurred[0][0]  # the two fills differ
    assert masked[1] == before[1] and blurred[1] == before[1]  # no boxes: the same score
    assert masked[2] == (None, "no_text_boxes")  # text_area did not run on it: counted drop
    assert before[2][1] is None  # without mask_text the boxes are not needed


def test_mask_fills_exactly_the_boxes():
    pixels = np.random.default_rng(0).integers(0, 256, (40, 60, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    box = [0.1, 0.25, 0.5, 0.5]
    masked = np.asarray(Image.open(io.BytesIO(mask_boxes(out.getvalue(), [box], "mean"))))
    x0, y0, x1, y1 = box_pixels(box, 60, 40)
    assert (x0, y0, x1, y1) == (6, 10, 30, 20)
    mean = pixels.reshape(-1, 3).mean(axis=0).round()
    assert (masked[y0:y1, x0:x1] == mean).all()
    outside = np.ones((40, 60), bool)
    outside[y0:y1, x0:x1] = False
    assert (masked[outside] == pixels[outside]).all()
    assert mask_boxes(b"not read", [], "mean") == b"not read"  # no box: bytes untouched

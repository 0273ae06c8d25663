"""Pictures with rendered text of known extent for text_area tests, and their JPEG bytes."""

import io

import numpy as np
from mmcurate.stages.lib.text_detect import union_area
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

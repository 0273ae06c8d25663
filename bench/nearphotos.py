"""Distinct real photos and injected near-duplicates, for the near-dedupe benches.

Originals: non-overlapping 96 px (or `tile`) tiles of the scikit-image photos (all bundled
with scikit-image, no download), enlarged to 192 px, minus near-blank tiles (pixel std < 12: a
patch of sky or black space is not a distinct photo). With `orientations=4`, each tile also
appears mirrored left-right, top-bottom and rotated 180 degrees, as separate originals (their
pHashes are unrelated), for bigger sets. Variants, one transform each:
  requality  JPEG re-encoded at quality 30-70 (original saved at 95)
  resized    scaled to 50-80% per side
  cropped    up to 4% of each side's length cut, split at random between its two edges
  brightness brightness changed by -10% .. +10%
  png2jpeg   original saved as PNG, the variant as JPEG quality 75
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageEnhance, ImageOps

from pipeline.demo_data import SUBJECTS, source_photo

TILE = 96
SIDE = 192
TRANSFORMS = ("requality", "resized", "cropped", "brightness", "png2jpeg")


@dataclass(frozen=True)
class Item:
    key: str
    group: int  # the original it comes from
    transform: str  # "original" or one of TRANSFORMS
    data: bytes


def tiles(orientations: int = 1, tile: int = TILE) -> Iterator[Image.Image]:
    flips = [lambda im: im, ImageOps.mirror, ImageOps.flip, lambda im: im.rotate(180)]
    for name in SUBJECTS:
        photo = source_photo(name).convert("RGB")
        w, h = photo.size
        for y in range(0, h - tile + 1, tile):
            for x in range(0, w - tile + 1, tile):
                patch = photo.crop((x, y, x + tile, y + tile))
                if np.asarray(patch.convert("L"), np.float32).std() < 12:
                    continue
                patch = patch.resize((SIDE, SIDE), Image.Resampling.BICUBIC)
                for flip in flips[:orientations]:
                    yield flip(patch)


def jpeg(image: Image.Image, quality: int) -> bytes:
    out = io.BytesIO()
    image.save(out, "JPEG", quality=quality)
    return out.getvalue()


def png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def variant(image: Image.Image, transform: str, rng: np.random.Generator) -> bytes:
    w, h = image.size
    if transform == "requality":
        return jpeg(image, int(rng.integers(30, 71)))
    if transform == "resized":
        scale = rng.uniform(0.5, 0.8)
        return jpeg(image.resize((round(w * scale), round(h * scale))), 90)
    if transform == "cropped":
        cut_w, cut_h = int(w * rng.uniform(0, 0.04)), int(h * rng.uniform(0, 0.04))
        left, top = int(rng.integers(0, cut_w + 1)), int(rng.integers(0, cut_h + 1))
        return jpeg(image.crop((left, top, w - (cut_w - left), h - (cut_h - top))), 90)
    if transform == "brightness":
        return jpeg(ImageEnhance.Brightness(image).enhance(rng.uniform(0.9, 1.1)), 90)
    if transform == "png2jpeg":
        return jpeg(image, 75)
    raise ValueError(transform)


def make_items(
    variants_per_original: int = 2,
    orientations: int = 1,
    seed: int = 0,
    limit: int | None = None,
    tile: int = TILE,
) -> list[Item]:
    """Originals plus `variants_per_original` variants each, transforms drawn at random."""
    rng = np.random.default_rng(seed)
    items: list[Item] = []
    for group, patch in enumerate(tiles(orientations, tile)):
        if limit is not None and group >= limit:
            break
        kinds = rng.choice(TRANSFORMS, size=variants_per_original, replace=False)
        original = png(patch) if "png2jpeg" in kinds else jpeg(patch, 95)
        items.append(Item(f"g{group:05d}-0", group, "original", original))
        for i, kind in enumerate(kinds):
            data = variant(patch, kind, rng)
            items.append(Item(f"g{group:05d}-{i + 1}", group, str(kind), data))
    return items

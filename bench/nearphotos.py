"""Distinct real photos and injected near-duplicates, for the near-dedupe benches.

Two sets. `make_items` (the small set): originals are non-overlapping 96 px (or `tile`) tiles
of the scikit-image photos (all bundled with scikit-image, no download), enlarged to 192 px,
minus near-blank tiles (pixel std < 12: a patch of sky or black space is not a distinct
photo). With `orientations=4`, each tile also appears mirrored left-right, top-bottom and
rotated 180 degrees, as separate originals (their pHashes are unrelated), for bigger sets.
Variants, one transform each:
  requality  JPEG re-encoded at quality 30-70 (original saved at 95)
  resized    scaled to 50-80% per side
  cropped    up to 4% of each side's length cut, split at random between its two edges
  brightness brightness changed by -10% .. +10%
  png2jpeg   original saved as PNG, the variant as JPEG quality 75

`make_views` (the larger-photo set, 384-900 px): distinct views of the same 18 photos, each a
crop window (45-95% of each side, anywhere), one of 8 orientations (flips, rotations by 90
degrees, transposes) and a colour change (hue, saturation, gamma or a tint), resized to a long
side of 384-900 px. Views of one photo in one orientation overlap a lot (same scene, different
crops) but never by more than `MAX_IOU` of their windows: a 1-4% crop per side keeps at least
0.85, so near-duplicates and distinct views stay apart, and precision is tested where it is
hard. A fraction of views gets one injected near-duplicate (the transforms above, crops cutting
1-4% of every side), and some get an exact byte copy.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from mmcurate.pipeline.demo_data import SUBJECTS, source_photo
from PIL import Image, ImageEnhance, ImageOps

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


# ---- the larger-photo set ---------------------------------------------------------------------

MAX_IOU = 0.7  # views of one photo and orientation overlap at most this much
ORIENTATIONS = (
    None,
    Image.Transpose.FLIP_LEFT_RIGHT,
    Image.Transpose.FLIP_TOP_BOTTOM,
    Image.Transpose.ROTATE_90,
    Image.Transpose.ROTATE_180,
    Image.Transpose.ROTATE_270,
    Image.Transpose.TRANSPOSE,
    Image.Transpose.TRANSVERSE,
)


def iou(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    area = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1])
    return inter / (area - inter)


def recolour(image: Image.Image, rng: np.random.Generator) -> Image.Image:
    """One colour change: hue rotation, saturation, gamma, or a tint (grey photos too)."""
    kind = int(rng.integers(4))
    if kind == 0:
        hsv = np.asarray(image.convert("HSV")).copy()
        hsv[..., 0] = (hsv[..., 0].astype(int) + int(rng.integers(30, 226))) % 256
        return Image.fromarray(hsv, "HSV").convert("RGB")
    if kind == 1:
        return ImageEnhance.Color(image).enhance(rng.uniform(0.3, 1.8))
    if kind == 2:
        gamma = rng.uniform(0.6, 1.6)
        return image.point(lambda v: round(255 * (v / 255) ** gamma))
    tint = tuple(int(c) for c in rng.integers(60, 256, size=3))
    return ImageOps.colorize(image.convert("L"), (0, 0, 0), tint)


def windows(rng: np.random.Generator, count: int) -> list[tuple[float, ...]]:
    """Up to `count` crop windows (fractions of the photo) overlapping at most MAX_IOU."""
    chosen: list[tuple[float, ...]] = []
    for _ in range(count * 40):
        if len(chosen) == count:
            break
        fw, fh = rng.uniform(0.45, 0.95, size=2)
        x, y = rng.uniform(0, 1 - fw), rng.uniform(0, 1 - fh)
        window = (x, y, x + fw, y + fh)
        if all(iou(window, other) <= MAX_IOU for other in chosen):
            chosen.append(window)
    return chosen


def views(count: int, seed: int = 0) -> Iterator[Image.Image]:
    """`count` distinct views (see the module doc), spread evenly over photos and orientations."""
    rng = np.random.default_rng(seed)
    slots = [(name, o) for name in SUBJECTS for o in range(len(ORIENTATIONS))]
    per_slot = -(-count // len(slots))
    made = 0
    for name, o in slots:
        photo = source_photo(name).convert("RGB")
        w, h = photo.size
        for x0, y0, x1, y1 in windows(rng, per_slot):
            if made == count:
                return
            view = photo.crop((round(x0 * w), round(y0 * h), round(x1 * w), round(y1 * h)))
            view = view.transpose(ORIENTATIONS[o]) if ORIENTATIONS[o] is not None else view
            view = recolour(view, rng) if rng.random() < 0.7 else view
            scale = rng.uniform(384, 900) / max(view.size)
            size = (max(8, round(view.width * scale)), max(8, round(view.height * scale)))
            yield view.resize(size, Image.Resampling.LANCZOS)
            made += 1


def crop_each_side(image: Image.Image, rng: np.random.Generator) -> bytes:
    """1-4% of every side's length cut (each side drawn on its own)."""
    w, h = image.size
    left, right = (int(round(w * f)) for f in rng.uniform(0.01, 0.04, size=2))
    top, bottom = (int(round(h * f)) for f in rng.uniform(0.01, 0.04, size=2))
    return jpeg(image.crop((left, top, w - right, h - bottom)), 90)


def make_views(
    count: int = 1500, duplicated: float = 0.3, copies: int = 100, seed: int = 0
) -> list[Item]:
    """`count` distinct views; a `duplicated` fraction of them get one near-duplicate each
    (transforms in turn, so each is equally represented), and `copies` get an exact copy."""
    rng = np.random.default_rng(seed + 1)
    items: list[Item] = []
    injected = 0
    for group, view in enumerate(views(count, seed)):
        kind = None
        if rng.random() < duplicated:
            kind, injected = TRANSFORMS[injected % len(TRANSFORMS)], injected + 1
        original = png(view) if kind == "png2jpeg" else jpeg(view, 95)
        items.append(Item(f"v{group:05d}-0", group, "original", original))
        if kind is not None:
            data = crop_each_side(view, rng) if kind == "cropped" else variant(view, kind, rng)
            items.append(Item(f"v{group:05d}-1", group, kind, data))
        if rng.random() < copies / count:
            items.append(Item(f"v{group:05d}-2", group, "exact", original))
    return items

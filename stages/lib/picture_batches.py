"""Pictures of samples as model input, for the stages that encode images with a CLIP model
(clip_score, aesthetic_score): an image sample's picture or a video sample's sampled frames,
prepared by the encoder, grouped into batches of about `batch_size` pictures, and a video's
embedding as the normalized mean of its frames'."""

from __future__ import annotations

from typing import Protocol

import numpy as np
from mmcurate.core.formats import FRAME_COLUMN
from mmcurate.core.spill import media_bytes
from mmcurate.stages.base import Columns, media_column
from mmcurate.stages.lib.pixels import READ_IMAGE_MAX, too_big


class Encoder(Protocol):
    """What scores: a local ClipModel, or the build's handle on a model actor."""

    def prepare(self, images: list[bytes]) -> tuple[list[np.ndarray | None], list[str | None]]: ...

    def encode(self, pixels: np.ndarray, texts: list[str]) -> tuple[np.ndarray, np.ndarray]: ...


def pictures_of(batch: Columns, row: int) -> list[bytes]:
    """The image of an image sample, or the sampled frames of a video sample."""
    col = media_column(batch, row)
    if col is not None:
        return [batch[col][row]]
    frames = sorted(c for c in batch if FRAME_COLUMN.match(c))
    return [batch[c][row] for c in frames if batch[c][row] is not None]


def picture_bytes(batch: Columns, row: int) -> list[bytes] | str:
    """A row's pictures as bytes (they may travel to a model actor), or why it has none to
    give: `no_image`, or `too_big` for a spilled picture too big to read whole."""
    pictures = pictures_of(batch, row)
    if not pictures:
        return "no_image"
    if any(too_big(p, READ_IMAGE_MAX) for p in pictures):
        return "too_big"
    return [media_bytes(p) for p in pictures]


def prepared(
    encoder: Encoder, media: dict[int, list[bytes]], reasons: list[str | None]
) -> list[tuple[int, list[np.ndarray]]]:
    """(row, its pictures as model input) for the rows with a decodable picture; a row with
    none gets the first picture's reason (`too_many_pixels` read from the header, before any
    decoding, or `decode_error`)."""
    pixels, why = encoder.prepare([data for pictures in media.values() for data in pictures])
    good, at = [], 0
    for i, pictures in media.items():
        span = slice(at, at + len(pictures))
        at += len(pictures)
        mine = [p for p in pixels[span] if p is not None]
        if mine:
            good.append((i, mine))
        else:
            reasons[i] = next((r for r in why[span] if r), "decode_error")
    return good


def picture_batches(good: list, size: int) -> list[list]:
    """Group samples so each group holds about `size` pictures (at least one sample)."""
    groups, current, count = [], [], 0
    for item in good:
        if current and count + len(item[1]) > size:
            groups.append(current)
            current, count = [], 0
        current.append(item)
        count += len(item[1])
    return groups + ([current] if current else [])


def mean_per_sample(embeddings: np.ndarray, counts: list[int]) -> np.ndarray:
    """Rows grouped by `counts` -> one normalized mean row per group."""
    bounds = np.cumsum([0, *counts])
    spans = zip(bounds[:-1], bounds[1:], strict=True)
    means = np.stack([embeddings[a:b].mean(axis=0) for a, b in spans])
    return means / np.maximum(np.linalg.norm(means, axis=1, keepdims=True), 1e-12)


def box_pixels(box: list[float], width: int, height: int) -> tuple[int, int, int, int]:
    """A normalised [x0, y0, x1, y1] box (text_area's `text_boxes`) as pixel bounds that
    cover it (outward rounding, clipped to the picture)."""
    x0, y0 = max(0, int(np.floor(box[0] * width))), max(0, int(np.floor(box[1] * height)))
    x1, y1 = min(width, int(np.ceil(box[2] * width))), min(height, int(np.ceil(box[3] * height)))
    return x0, y0, x1, y1


def mask_boxes(data: bytes, boxes: list[list[float]], fill: str) -> bytes:
    """The picture with each box filled with the picture's mean colour (`mean`) or blurred
    (`blur`), as lossless PNG (T-MARS: CLIP then cannot read text rendered in the picture);
    the bytes unchanged when there is no box."""
    import io

    from PIL import Image, ImageFilter

    if not boxes:
        return data
    image = Image.open(io.BytesIO(data)).convert("RGB")
    pixels = np.asarray(image).copy()
    blurred = None
    if fill == "blur":  # strong enough that glyphs no longer read at the model's input size
        radius = max(2.0, min(image.size) / 16)
        blurred = np.asarray(image.filter(ImageFilter.GaussianBlur(radius)))
    mean = pixels.reshape(-1, 3).mean(axis=0).round().astype(np.uint8)
    for box in boxes:
        x0, y0, x1, y1 = box_pixels(box, image.width, image.height)
        pixels[y0:y1, x0:x1] = mean if blurred is None else blurred[y0:y1, x0:x1]
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()

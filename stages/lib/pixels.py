"""Decoded images as a viewer sees them, for every stage that looks at pixels (decode_image,
exact_dedupe of pixels, the perceptual hashes, the CLIP model's input).

- `upright`: the EXIF orientation applied. Only the orientation tag is read: Pillow's
  `ImageOps.exif_transpose` also rewrites the rest of the EXIF block, and one odd tag there
  (text in a number field) raised `struct.error`, which stopped the whole build.
- `open_image`: the one place a stage turns bytes into an image. It reads the header only and
  refuses an image over `MAX_PIXELS` (`TooManyPixels`, dropped as `too_many_pixels`, the
  reason decode_image gives) before any pixel is decoded: a 12,000 x 12,000 PNG reaching a
  model stage first took a 1.9 GiB worker. `failure_reason` names any decoding error.
- `encode`: an image back to jpg/webp/png bytes; `allow_pixels` raises PIL's own limit.
- `to_rgb` / `to_grey`: any mode to 8 bits. 16-bit, 32-bit and float grey are scaled by their
  range; Pillow's own `convert` clips them (every 16-bit value over 255 became white, so
  distinct 16-bit images all hashed alike), and float images came out black.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from mmcurate.core.image_errors import PIL_DECODE_ERRORS
from mmcurate.core.spill import Spilled
from PIL import Image

PIL_FORMATS = {"jpg": "JPEG", "webp": "WEBP", "png": "PNG"}
FILTERS = {
    "area": Image.Resampling.BOX,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
}
DECODE_ERRORS = PIL_DECODE_ERRORS  # a per-sample `decode_error`, never a failed task
# A spilled image (a file above source.spill_bytes, core/spill.py) is decoded from disk, never
# read whole; above this size it is dropped as `too_big` unopened (no real photo is that big).
SPILLED_IMAGE_MAX = 1 << 30
# A stage that must hold the encoded bytes (clip_score: they may go to an actor) reads a
# spilled image whole only up to this size; larger ones are `too_big`.
READ_IMAGE_MAX = 256 << 20
# decode_image's default `max_pixels`: every other stage that decodes refuses larger images
# from their header (a decoded 100-megapixel RGB image is already 300 MB).
MAX_PIXELS = 100_000_000
TOO_MANY_PIXELS = "too_many_pixels"


class TooManyPixels(Image.DecompressionBombError):
    """An image whose header claims more pixels than a stage decodes (a DecompressionBombError,
    like Pillow's own, so every handler of one handles both)."""


def open_image(value: bytes | Spilled, max_pixels: int | None = MAX_PIXELS) -> Image.Image:
    """A PIL image over bytes or a spilled file (by path: Pillow reads what it decodes), its
    header read and nothing decoded; TooManyPixels over `max_pixels` (None: the caller
    checks the size itself, as decode_image does with its own option)."""
    image = Image.open(value.path if isinstance(value, Spilled) else io.BytesIO(value))
    if max_pixels is not None and image.width * image.height > max_pixels:
        image.close()
        raise TooManyPixels(f"{image.width} x {image.height} is over {max_pixels:,} pixels")
    return image


def failure_reason(err: BaseException) -> str:
    """The drop reason for an error out of decoding (one of DECODE_ERRORS)."""
    return TOO_MANY_PIXELS if isinstance(err, Image.DecompressionBombError) else "decode_error"


def too_big(value: Any, limit: int = SPILLED_IMAGE_MAX) -> bool:
    """Whether a media value is a spilled file larger than `limit` bytes."""
    return isinstance(value, Spilled) and value.size > limit


EXIF_ORIENTATION = 0x0112
TRANSPOSE = {  # EXIF orientation -> the transpose that makes the image upright
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}


def orientation(image: Image.Image) -> int:
    """The EXIF orientation (1, upright, when there is none or it cannot be read)."""
    try:
        value = image.getexif().get(EXIF_ORIENTATION, 1)
    # Why broad: EXIF is a free-form block inside the file; a damaged one is not a damaged image.
    except Exception:  # noqa: BLE001
        return 1
    return value if isinstance(value, int) and value in TRANSPOSE else 1


def upright(image: Image.Image) -> Image.Image:
    """The image turned as its EXIF orientation says (a copy only when it must turn). Loaded
    first: Pillow turns a TIFF upright as it loads it (and drops its tag), so reading the tag
    of an unloaded TIFF turned it twice."""
    image.load()
    method = TRANSPOSE.get(orientation(image))
    return image if method is None else image.transpose(method)


def is_deep_grey(image: Image.Image) -> bool:
    return image.mode in ("I", "F") or image.mode.startswith("I;16")


def to_grey(image: Image.Image) -> Image.Image:
    """Any mode to 8-bit grey; deep grey scaled by its range, not clipped."""
    if not is_deep_grey(image):
        return image.convert("L")
    # float32, scaled in place: 4 bytes a pixel beside the source (float64 temporaries took
    # about 25 and a 10,000 x 10,000 16-bit PNG 2.5 GB)
    pixels = np.asarray(image, dtype=np.float32)
    if not pixels.flags.writeable:
        pixels = pixels.copy()
    np.nan_to_num(pixels, copy=False, nan=0.0, posinf=0.0, neginf=0.0)
    white = grey_white(image.mode, float(pixels.max(initial=0)))
    pixels *= np.float32(255.0 / white)
    np.clip(pixels, 0, 255, out=pixels)
    np.rint(pixels, out=pixels)
    return Image.fromarray(pixels.astype(np.uint8))


def to_rgb(image: Image.Image) -> Image.Image:
    """Any mode to 8-bit RGB: 16/32-bit and float grey is scaled (not clipped); alpha is
    dropped."""
    if image.mode == "RGB":
        return image
    if is_deep_grey(image):
        return to_grey(image).convert("RGB")
    if "A" in image.getbands() or image.mode == "P":
        image = image.convert("RGBA")
    return image.convert("RGB")


def grey_white(mode: str, top: float) -> float:
    """The value shown as white: a 16-bit mode's own 65,535; for 32-bit integer and float
    grey, whose mode has no range, the smallest usual one holding the data (float: 1.0, then
    255, then 65,535), never a range picked below the values (that turned them white)."""
    if mode.startswith("I;16"):
        return 65535.0
    for white in ((1.0,) if mode == "F" else ()) + (255.0, 65535.0):
        if top <= white:
            return white
    return top


def allow_pixels(limit: int) -> None:
    """Raise PIL's process-wide decompression-bomb limit to `limit` where it is lower, so
    images up to `max_pixels` open without PIL's warning or error and larger ones get this
    stage's own drop reason. Never lifted altogether: a loader in the same process (the demo,
    a notebook that builds and trains) keeps a bound."""
    if Image.MAX_IMAGE_PIXELS is not None and Image.MAX_IMAGE_PIXELS < limit:
        Image.MAX_IMAGE_PIXELS = limit


def encode(image: Image.Image, fmt: str, quality: int) -> bytes:
    out = io.BytesIO()
    if fmt == "png":
        image.save(out, "PNG")
    else:
        image.save(out, PIL_FORMATS[fmt], quality=quality)
    return out.getvalue()

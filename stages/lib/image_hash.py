"""64-bit perceptual hashes of images: pHash (default) and dHash.

pHash: grey 32x32 (box filter), 2-D DCT-II, the 8x8 lowest frequencies, one bit per
coefficient: above the median of the 63 non-DC ones (the DC term only measures brightness).
dHash: grey 9x8, one bit per horizontal neighbour pair: left brighter than right.
Bit i of the hash is coefficient i in row-major order, so hashes compare by popcount of xor.

`image_signals` adds what near_dedupe checks candidates with: the same hash of two inset
windows (1.5% and 3% cut from every side: a crop of 1-4% a side lines up with one of them far
better than with the whole frame) and the 32x32 grey thumbnail the hash was computed from.
"""

from __future__ import annotations

import numpy as np
from mmcurate.core.spill import Spilled
from mmcurate.stages.lib.pixels import open_image, to_grey, upright
from PIL import Image

PHASH_SIDE = 32
LOW = 8
INSETS = (0.015, 0.03)  # fractions cut from every side for the crop hashes
THUMB_SIDE = 32  # the stored thumbnail: 32 x 32 grey, 1,024 bytes


def dct_matrix(n: int, rows: int) -> np.ndarray:
    """The first `rows` rows of the orthonormal DCT-II matrix of size n."""
    k = np.arange(rows)[:, None]
    x = np.arange(n)[None, :]
    matrix = np.cos(np.pi * (2 * x + 1) * k / (2 * n)) * np.sqrt(2.0 / n)
    matrix[0] /= np.sqrt(2.0)
    return matrix


_DCT = dct_matrix(PHASH_SIDE, LOW)
_WEIGHTS = (np.uint64(1) << np.arange(64, dtype=np.uint64)).astype(np.uint64)


def bits_to_int(bits: np.ndarray) -> int:
    """64 booleans (row-major) -> an unsigned 64-bit integer, bit i = bits[i]."""
    return int(np.bitwise_or.reduce(_WEIGHTS[bits.reshape(-1)], initial=np.uint64(0)))


def grey(data: bytes | Spilled, side: tuple[int, int]) -> tuple[np.ndarray, tuple[int, int]]:
    """Decode (JPEG in draft mode: DCT scaling makes this several times faster for big photos)
    straight to grey, box-filtered to `side`; returns pixels and the full image size."""
    image, size = grey_image(data, side)
    return np.asarray(image.resize(side, Image.Resampling.BOX), dtype=np.float64), size


def grey_image(data: bytes | Spilled, side: tuple[int, int]) -> tuple[Image.Image, tuple[int, int]]:
    """The decoded grey image, at least 4 x `side` where the file is that big."""
    image = open_image(data)
    size = image.size
    image.draft("L", (side[0] * 4, side[1] * 4))
    image = upright(image)
    image = grey_on_white(image) if image.mode in ("RGBA", "LA", "P", "PA") else to_grey(image)
    return image, size


def grey_on_white(image: Image.Image) -> Image.Image:
    """Palette and alpha images composited on white, then grey: the hash sees the picture as
    a viewer does (decode_image, by contrast, drops alpha and keeps the colours under it)."""
    image = image.convert("RGBA")
    background = Image.new("RGBA", image.size, (255, 255, 255, 255))
    return Image.alpha_composite(background, image).convert("L")


def phash_pixels(pixels: np.ndarray) -> int:
    low = _DCT @ pixels @ _DCT.T
    flat = low.reshape(-1)
    return bits_to_int(flat > np.median(flat[1:]))


def dhash_pixels(pixels: np.ndarray) -> int:
    return bits_to_int(pixels[:, :-1] > pixels[:, 1:])


def image_hash(data: bytes | Spilled, kind: str = "phash") -> tuple[int, tuple[int, int]]:
    """(hash, (width, height)) of encoded image bytes; raises on undecodable data."""
    if kind == "phash":
        pixels, size = grey(data, (PHASH_SIDE, PHASH_SIDE))
        return phash_pixels(pixels), size
    if kind == "dhash":
        pixels, size = grey(data, (9, 8))
        return dhash_pixels(pixels), size
    raise ValueError(f"unknown hash {kind!r}")


def image_signals(
    data: bytes | Spilled, kind: str = "phash"
) -> tuple[int, list[int], bytes, tuple[int, int]]:
    """(hash, [hash of each inset window], 32x32 grey thumbnail bytes, (width, height)).
    The hash is exactly `image_hash`'s; raises on undecodable data."""
    hasher = {"phash": phash_pixels, "dhash": dhash_pixels}.get(kind)
    if hasher is None:
        raise ValueError(f"unknown hash {kind!r}")
    side = (PHASH_SIDE, PHASH_SIDE) if kind == "phash" else (9, 8)
    image, size = grey_image(data, (PHASH_SIDE, PHASH_SIDE))
    w, h = image.size
    thumb = image.resize((THUMB_SIDE, THUMB_SIDE), Image.Resampling.BOX)
    # dhash decodes its own, smaller draft (so the hash stays exactly image_hash's)
    full = np.asarray(thumb, dtype=np.float64) if side == thumb.size else grey(data, side)[0]
    crops = []
    for cut in INSETS:
        box = (w * cut, h * cut, w * (1 - cut), h * (1 - cut))
        inset = image.resize(side, Image.Resampling.BOX, box=box)
        crops.append(hasher(np.asarray(inset, dtype=np.float64)))
    return hasher(full), crops, thumb.tobytes(), size


def hamming(a: int, b: int) -> int:
    return (a ^ b).bit_count()

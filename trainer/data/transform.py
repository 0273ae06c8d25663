"""open_clip's train transform, split for the loader: the geometric part on uint8 tensors in
the loader workers (or on the training device with device decode), the float conversion and
normalization on the training device (trainer/data/dataset.py says who calls what)."""

from __future__ import annotations

import contextlib
import io
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from mmcurate.core.formats import FRAME_COLUMN
from mmcurate.core.image_errors import PIL_DECODE_ERRORS
from PIL import Image
from torch.nn.functional import interpolate
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms import (
    Compose,
    InterpolationMode,
    Normalize,
    RandomResizedCrop,
    ToTensor,
)
from torchvision.transforms.functional import pil_to_tensor
from torchvision.transforms.v2.functional import resized_crop

RGB = ImageReadMode.RGB
# What decoding a damaged or hostile image raises: Pillow's (core.image_errors, as the build's
# stages) and torchvision's decoders' RuntimeError. One such image is a skipped sample.
DECODE_ERRORS = (*PIL_DECODE_ERRORS, RuntimeError)


class ImageTransform:
    """open_clip's train transform, split at ToTensor. In the workers: decode to a uint8
    tensor (libjpeg-turbo through torchvision for JPEG, PIL otherwise), then the transform's
    steps before ToTensor (RandomResizedCrop, ...) on that tensor, with torch's uint8 kernels:
    about 3x faster than PIL's resize here, same crop distribution, bicubic antialiased.
    `finish` (x / 255, Normalize) runs on the training device. A transform that does not end
    in ToTensor + Normalize runs whole, on PIL images, in the workers."""

    def __init__(self, preprocess: Callable[[Image.Image], torch.Tensor]) -> None:
        steps = list(preprocess.transforms) if isinstance(preprocess, Compose) else []
        split = (
            len(steps) >= 2 and isinstance(steps[-2], ToTensor) and isinstance(steps[-1], Normalize)
        )
        self.full = preprocess
        self.pil = Compose([fast_step(step) for step in steps[:-2]]) if split else None
        self.mean = torch.tensor(steps[-1].mean).view(3, 1, 1) if split else None
        self.std = torch.tensor(steps[-1].std).view(3, 1, 1) if split else None
        # (x / 255 - mean) / std as one multiply and one add: x * scale + shift
        self.scale = 1 / (255 * self.std) if split else None
        self.shift = -self.mean / self.std if split else None

    def __call__(self, data: bytes) -> torch.Tensor:
        """Encoded image bytes -> uint8 [3, H, W] (float when the transform does not split)."""
        if self.pil is None:
            return self.full(open_image(data).convert("RGB"))
        return self.pil(decode_rgb(data))

    def decode_on(self, images: list[torch.Tensor], device: torch.device) -> torch.Tensor:
        """Device decode: the batch's JPEG bytes (1-D) decoded together on `device` (nvJPEG
        on CUDA), then the geometric steps there; other items arrive transformed. A file
        the decoder rejects is replaced by another image of the batch, as in `collate`."""
        encoded = [i for i, image in enumerate(images) if image.dim() == 1]
        out: list[torch.Tensor | None] = [
            None if image.dim() == 1 else image.to(device, non_blocking=True) for image in images
        ]
        try:
            decoded = decode_jpeg([images[i] for i in encoded], mode=RGB, device=device)
        except RuntimeError:  # one bad file fails the batch call: decode one by one on the CPU
            decoded = [decode_or_none(images[i].numpy().tobytes(), device) for i in encoded]
        for i, image in zip(encoded, decoded, strict=True):
            out[i] = None if image is None else self.pil(image)
        good = [image for image in out if image is not None]
        if not good:
            raise RuntimeError("a whole batch of JPEGs failed to decode")
        return torch.stack([image if image is not None else good[0] for image in out])

    def finish_on(
        self, images: torch.Tensor | list[torch.Tensor], device: torch.device
    ) -> torch.Tensor:
        """A batch as the loader yields it -> normalized float on `device`."""
        if isinstance(images, list):  # data.gpu_decode: JPEGs decode here
            return self.finish(self.decode_on(images, device))
        return self.finish(images.to(device, non_blocking=True))

    def finish(self, images: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """uint8 -> normalized float on the images' device (float input passes through),
        written into `out` when it is a float tensor of the same shape."""
        if images.dtype != torch.uint8 or self.mean is None:
            return images.float()
        scale, shift = self.scale.to(images.device), self.shift.to(images.device)
        if out is not None and out.shape == images.shape and out.dtype == torch.float32:
            # Why copy, then in place: a mixed-dtype op into `out` takes a slow path on the
            # CPU; copy_, mul_, add_ is 0.06 ms an image here against 0.14 for the four passes
            # of div 255, sub mean, div std (values within 1e-6 of them)
            return out.copy_(images).mul_(scale).add_(shift)
        return images.float().mul_(scale).add_(shift)

    def place(self, image: torch.Tensor, row: torch.Tensor, finish: bool) -> torch.Tensor:
        """`image` written into `row` (its place in a batch, e.g. a ring slot's), normalized
        on the way when `finish` and `row` is float; `row` then, else `image` as it was (it
        does not fit)."""
        if image.data_ptr() == row.data_ptr():
            return row
        if image.shape != row.shape:
            return image
        if image.dtype == row.dtype:
            return row.copy_(image)
        normalizes = self.mean is not None and image.dtype == torch.uint8
        if finish and normalizes and row.dtype == torch.float32:
            return self.finish(image, row)
        return image


class ResizedCropU8:
    """A RandomResizedCrop drawing crops as its `get_params` does (`crop_box`) and resizing
    with torchvision v2's uint8 kernel: v1 on a tensor resizes in float, about 3x slower."""

    def __init__(self, crop: RandomResizedCrop) -> None:
        self.crop = crop

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        c = self.crop
        top, left, height, width = crop_box(*image.shape[-2:], c.scale, c.ratio)
        size = list(c.size) if len(c.size) == 2 else None
        if size and image.dtype == torch.uint8 and image.dim() == 3 and not image.is_cuda:
            if c.interpolation == InterpolationMode.BICUBIC and c.antialias:
                # What torchvision's resized_crop runs for this case (its uint8 bicubic CPU
                # kernel, no cast), without its dispatch: about 0.05 ms an image here
                window = image[:, top : top + height, left : left + width].unsqueeze(0)
                return interpolate(
                    window, size, mode="bicubic", align_corners=False, antialias=True
                )[0]
        return resized_crop(
            image, top, left, height, width, c.size, c.interpolation, antialias=c.antialias
        )


CROP_ATTEMPTS = 10  # as torchvision's RandomResizedCrop.get_params


def crop_box(
    height: int, width: int, scale: Sequence[float], ratio: Sequence[float]
) -> tuple[int, int, int, int]:
    """(top, left, height, width) of a random crop, by torchvision's RandomResizedCrop
    algorithm (area share uniform in `scale`, log aspect ratio uniform in log `ratio`, up to
    10 tries, then the central crop of the nearest allowed ratio; offsets uniform), with one
    draw from torch's generator for all of it instead of up to 42 one-element tensor ops:
    with scale 0.9-1 most tries miss on 3:2 photos, and those ops took 0.16-0.4 ms an image
    here, a sixth of its decode and crop. Same distribution, other numbers."""
    area = height * width
    low, high = math.log(ratio[0]), math.log(ratio[1])
    draws = torch.rand(2 * CROP_ATTEMPTS + 2, dtype=torch.float64).tolist()
    for attempt in range(CROP_ATTEMPTS):
        target = area * (scale[0] + (scale[1] - scale[0]) * draws[2 * attempt])
        aspect = math.exp(low + (high - low) * draws[2 * attempt + 1])
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = min(int(draws[-2] * (height - h + 1)), height - h)
            return top, min(int(draws[-1] * (width - w + 1)), width - w), h, w
    w, h = width, height  # the fallback: a central crop
    if width / height < min(ratio):
        h = int(round(w / min(ratio)))
    elif width / height > max(ratio):
        w = int(round(h * max(ratio)))
    return (height - h) // 2, (width - w) // 2, h, w


def fast_step(step: Callable) -> Callable:
    return ResizedCropU8(step) if type(step) is RandomResizedCrop else step


def decode_or_none(data: bytes, device: torch.device) -> torch.Tensor | None:
    try:
        return decode_rgb(data).to(device)
    except DECODE_ERRORS:
        return None


def decode_rgb(data: bytes) -> torch.Tensor:
    """uint8 [3, H, W] RGB. A JPEG's size is read from its frame header and held to PIL's
    decompression-bomb limit before libjpeg-turbo decodes it; other formats, and a JPEG it
    refuses (e.g. CMYK), go through PIL, which checks the same on open."""
    size = jpeg_size(data)
    if size is not None:
        check_pixels(size)
        with contextlib.suppress(RuntimeError):
            return decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=RGB)
    image = Image.open(io.BytesIO(data))
    image.load()
    return pil_to_tensor(image if image.mode == "RGB" else image.convert("RGB"))


def check_image_header(data: bytes) -> None:
    """The header and decompression-bomb checks of PIL's `Image.open`, which raises on a bad
    one. Of a JPEG only the frame header is read: PIL's parse of every segment before it cost
    ~0.04 ms an image, 2% of a loader worker's work."""
    size = jpeg_size(data)
    if size is None:
        Image.open(io.BytesIO(data))
    else:
        check_pixels(size)


def check_pixels(size: tuple[int, int]) -> None:
    """PIL's decompression-bomb rule: an error over twice `Image.MAX_IMAGE_PIXELS`, a warning
    over it (None: no limit)."""
    pixels, limit = max(1, size[0]) * max(1, size[1]), Image.MAX_IMAGE_PIXELS
    if limit is None:
        return
    if pixels > 2 * limit:
        raise Image.DecompressionBombError(
            f"Image size ({pixels} pixels) exceeds limit of {2 * limit} pixels"
        )
    if pixels > limit:
        warnings.warn(
            f"Image size ({pixels} pixels) exceeds limit of {limit} pixels",
            Image.DecompressionBombWarning,
            stacklevel=3,
        )


JPEG_START = b"\xff\xd8\xff"
FRAME_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # SOFn: not DHT, JPG, DAC
# DHT, DAC, DQT, DRI, COM and APPn: the segments a decoder reads or skips before a scan
TABLE_MARKERS = frozenset({0xC4, 0xCC, 0xDB, 0xDD, 0xFE, *range(0xE0, 0xF0)})
SCAN_MARKER = 0xDA


def jpeg_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) of a JPEG whose segments up to its first scan are plain: tables,
    restart interval, comments, application data and exactly one frame header. None for
    anything else (a stuffed 0xFF00 or a second frame header could make the size read here
    differ from the decoder's): PIL reads those headers instead."""
    if not data.startswith(JPEG_START):
        return None
    at, end, size = 2, len(data), None
    while at + 4 <= end and data[at] == 0xFF:
        marker = data[at + 1]
        if marker == 0xFF:  # a fill byte before the marker
            at += 1
            continue
        length = int.from_bytes(data[at + 2 : at + 4], "big")
        if marker == SCAN_MARKER:
            return size
        if length < 2 or (marker not in TABLE_MARKERS and marker not in FRAME_MARKERS):
            return None
        if marker in FRAME_MARKERS:
            if size is not None or length < 8 or at + 9 > end:
                return None
            height = int.from_bytes(data[at + 5 : at + 7], "big")
            width = int.from_bytes(data[at + 7 : at + 9], "big")
            if not (width and height):
                return None
            size = (width, height)
        at += 2 + length
    return None


def frame_columns(sample: dict[str, Any]) -> list[str]:
    """A video sample's sampled frames (`000.jpg`, `001.jpg`, ...) in order."""
    return sorted(c for c in sample if FRAME_COLUMN.match(c))


def open_image(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    image.load()
    return image

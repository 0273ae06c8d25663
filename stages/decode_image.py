"""decode_image: validate, EXIF-transpose, convert to RGB, resize, re-encode."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Literal

from mmcurate.core.formats import IMAGE_COLUMNS, meta_json, sample_meta
from mmcurate.core.spill import Spilled
from mmcurate.stages.base import Columns, Stage, StageOptions, media_column, register
from mmcurate.stages.lib.fast_resize import shrink
from mmcurate.stages.lib.pixels import (
    DECODE_ERRORS,
    FILTERS,
    allow_pixels,
    encode,
    open_image,
    to_rgb,
    too_big,
    upright,
)
from PIL import Image
from pydantic import Field

MAX_SIDE = {"webp": 16383, "jpg": 65500}  # what the format can hold (PNG: no practical limit)


class ResizeOptions(StageOptions):
    size: int = Field(256, gt=0, description="Target length of the shorter side, in pixels.")
    mode: Literal["keep_ratio", "center_crop", "none"] = "keep_ratio"
    upscale: bool = Field(False, description="Also enlarge images smaller than `size`.")
    filter: Literal["area", "bilinear", "bicubic", "lanczos"] = Field(
        "area",
        description="Downscaling filter; `area` averages pixel areas like OpenCV's INTER_AREA "
        "(img2dataset's choice) and is the fastest. Enlarging always uses bicubic.",
    )


class DecodeImageOptions(StageOptions):
    resize: ResizeOptions = ResizeOptions()
    format: Literal["jpg", "webp", "png"] = "jpg"
    quality: int = Field(95, ge=1, le=100, description="JPEG/WebP quality.")
    max_pixels: int = Field(
        100_000_000, gt=0, description="Drop larger images (decompression-bomb guard)."
    )
    min_side: int | None = Field(None, gt=0, description="Shorter side below this: too_small.")
    max_side: int | None = Field(None, gt=0, description="Longer side above this: too_big.")
    max_aspect_ratio: float | None = Field(
        None, ge=1, description="Longer / shorter side above this: bad_aspect_ratio."
    )
    threads: int | None = Field(
        None,
        ge=1,
        le=64,
        description="Images decoded at once in each task; default 2 after `download`, else "
        "1. Pillow lets go of the GIL while it works, so a second thread fills the CPU time "
        "the task's downloads leave; with nothing to fill, it only competes for the cores.",
    )


def size_problem(width: int, height: int, opts: DecodeImageOptions) -> str | None:
    """The drop reason for an image of this (original) size, if any. `max_pixels` bounds the
    size produced too: enlarging a 1 x 4,000 strip to a 256 px short side is a billion pixels."""
    if max(width * height, output_pixels(width, height, opts.resize)) > opts.max_pixels:
        return "too_many_pixels"
    if opts.min_side is not None and min(width, height) < opts.min_side:
        return "too_small"
    if opts.max_side is not None and max(width, height) > opts.max_side:
        return "too_big"
    if max(target_size(width, height, opts.resize)) > MAX_SIDE.get(opts.format, 1 << 31):
        return "too_big"  # longer than the output format can hold
    if opts.max_aspect_ratio is not None and max(width, height) > opts.max_aspect_ratio * max(
        min(width, height), 1
    ):
        return "bad_aspect_ratio"
    return None


def output_pixels(width: int, height: int, resize: ResizeOptions) -> int:
    new_width, new_height = target_size(width, height, resize)
    side = min(new_width, new_height)
    return side * side if resize.mode == "center_crop" else new_width * new_height


def target_size(width: int, height: int, resize: ResizeOptions) -> tuple[int, int]:
    """Size after scaling the shorter side to `resize.size` (before any crop)."""
    short = min(width, height)
    if resize.mode == "none" or (short <= resize.size and not resize.upscale):
        return width, height
    scale = resize.size / short
    return max(1, round(width * scale)), max(1, round(height * scale))


def center_crop_box(width: int, height: int, side: int) -> tuple[int, int, int, int]:
    left = (width - side) // 2
    top = (height - side) // 2
    return left, top, left + side, top + side


def transform(image: Image.Image, resize: ResizeOptions) -> Image.Image:
    """EXIF transpose, RGB, resize and optional centre crop."""
    image = to_rgb(upright(image))
    if resize.mode == "center_crop" and min(image.size) < resize.size:
        # Enlarging: crop first, so only the square is enlarged (a 1 x N strip whole would
        # become 256 x 256N pixels before the crop threw nearly all of them away)
        image = image.crop(center_crop_box(image.width, image.height, min(image.size)))
    new_size = target_size(image.width, image.height, resize)
    if new_size != image.size:
        if new_size[0] < image.width:
            image = shrink(image, new_size, FILTERS[resize.filter])
        else:
            image = image.resize(new_size, Image.Resampling.BICUBIC)
    if resize.mode == "center_crop":
        side = min(image.size)
        image = image.crop(center_crop_box(image.width, image.height, side))
    return image


@register
class DecodeImage(Stage):
    """Decodes every image; undecodable ones are dropped as `decode_error`."""

    name = "decode_image"
    Options = DecodeImageOptions

    def setup(self) -> None:
        allow_pixels(self.options.max_pixels)
        threads = self.options.threads or (2 if self.after_io else 1)
        self.executor = ThreadPoolExecutor(threads, "decode") if threads > 1 else None

    def decode_one(self, data: bytes | Spilled) -> tuple[bytes | None, dict, str | None]:
        opts: DecodeImageOptions = self.options
        if too_big(data):
            return None, {}, "too_big"
        try:
            # a spilled file by path; max_pixels checked below, with this stage's own option
            image = open_image(data, max_pixels=None)
            meta = {"original_width": image.width, "original_height": image.height}
            problem = size_problem(image.width, image.height, opts)
            if problem:
                return None, meta, problem
            if image.format == "JPEG" and opts.resize.mode != "none":
                # Let libjpeg scale by 1/2..1/8 while decoding; stays >= the target size.
                image.draft("RGB", target_size(image.width, image.height, opts.resize))
            image = transform(image, opts.resize)
            meta.update(width=image.width, height=image.height)
            return encode(image, opts.format, opts.quality), meta, None
        except Image.DecompressionBombError:  # over twice PIL's limit, which a user lowered
            return None, {}, "too_many_pixels"
        except DECODE_ERRORS:
            return None, {}, "decode_error"

    def process(self, batch: Columns) -> tuple[Columns, list[str | None]]:
        fmt = self.options.format
        size = len(batch["__key__"])
        out = {col: [None] * size for col in IMAGE_COLUMNS}
        metas = list(batch.get("json") or [None] * size)
        columns = [media_column(batch, row) for row in range(size)]
        blobs = [batch[col][row] for row, col in enumerate(columns) if col is not None]
        mapper = self.executor.map if self.executor is not None else map
        decoded = iter(mapper(self.decode_one, blobs))
        reasons: list[str | None] = []
        for row, col in enumerate(columns):
            if col is None:
                reasons.append("no_image")
                continue
            data, meta, reason = next(decoded)
            reasons.append(reason)
            out[fmt][row] = data
            metas[row] = merge_json(metas[row], meta)
        batch.update(out)
        batch["json"] = metas
        return batch, reasons


def merge_json(text: str | None, extra: dict) -> str:
    """Add `extra` fields to a sample's JSON metadata string. An `original_*` size already
    there (img2dataset output) is the web original's and is kept; width/height are updated."""
    meta = sample_meta(text)
    for name, value in extra.items():
        if not (name.startswith("original_") and name in meta):
            meta[name] = value
    return meta_json(meta, sort_keys=True, ensure_ascii=False)

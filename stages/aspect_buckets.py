"""aspect_buckets: resolution rules, then each image resized to cover its aspect-ratio bucket
and cropped to it (Stable Diffusion style multi-aspect training data).

Everything is measured on the image as a viewer sees it (EXIF orientation applied: kohya's and
img2dataset's cv2 paths ignore it, so a portrait phone photo went to a landscape bucket). Per
image, in order: `too_many_pixels` (decompression-bomb guard), `too_small` (shorter side below
`min_side`), `too_few_pixels` (below `min_pixels`), `bad_aspect_ratio` (longer / shorter above
`max_aspect_ratio`), then the nearest bucket by log aspect ratio (stages/lib/buckets.py) and
`below_bucket` when covering it would enlarge the image (allowed up to `upscale.max_factor`).
The output image is exactly the bucket's size; the json gets `original_width`/`original_height`
(after EXIF, of the image this stage received), `bucket` ("WxH"), `crop_left`/`crop_top` (in
resized pixels: SDXL's crop conditioning) and `aspect_error`. `bucket`, `aspect_error` and
`crop_share` are also signature columns: the build's `buckets.json` is counted from them.
"""

from __future__ import annotations

from typing import Any, Literal

from mmcurate.core.formats import IMAGE_COLUMNS, with_fields
from mmcurate.core.spill import open_media
from mmcurate.stages.base import Columns, Stage, StageOptions, media_column, register
from mmcurate.stages.lib import buckets as plan
from mmcurate.stages.lib.fast_resize import shrink
from mmcurate.stages.lib.pixels import (
    DECODE_ERRORS,
    FILTERS,
    allow_pixels,
    encode,
    orientation,
    to_rgb,
    upright,
)
from PIL import Image
from pydantic import Field, StrictInt, field_validator, model_validator

SWAPS_SIDES = (5, 6, 7, 8)  # EXIF orientations that turn the image a quarter
WEBP_MAX_SIDE = 16383  # libwebp's limit


class UpscaleOptions(StageOptions):
    max_factor: float = Field(gt=1, description="enlarge at most this much to cover a bucket")


class AspectBucketsOptions(StageOptions):
    preset: Literal["kohya", "sdxl", "novelai"] | None = None
    # StrictInt: a bool or a float is not a side (`[true, 768]` was a 1x768 bucket). The
    # checks and their one-line messages are parse_buckets' (run before these types).
    buckets: list[str | list[StrictInt]] | None = Field(
        None, description='explicit buckets: ["1024x768", ...] or [[1024, 768], ...]'
    )
    base: Literal[512, 1024] = Field(512, description="kohya: max area is base x base")
    step: int = Field(64, ge=8, multiple_of=8, description="kohya and novelai: sides' multiple")
    bucket_min_side: int = Field(
        256, ge=8, multiple_of=8, description="kohya and novelai: shortest side"
    )
    bucket_max_side: int = Field(
        1024, ge=8, le=plan.MAX_SIDE, multiple_of=8, description="kohya and novelai: longest side"
    )
    min_side: int | None = Field(None, gt=0, description="shorter side below: too_small")
    min_pixels: int | None = Field(None, gt=0, description="width x height below: too_few_pixels")
    max_aspect_ratio: float | None = Field(
        None, ge=1, description="longer / shorter side above: bad_aspect_ratio"
    )
    max_pixels: int = Field(100_000_000, gt=0, description="larger: too_many_pixels")
    upscale: UpscaleOptions | None = Field(
        None, description="None: an image smaller than its bucket is dropped (below_bucket)"
    )
    crop: Literal["center", "random"] = "center"
    seed: int = Field(0, description="random crop: offsets drawn from (seed, key)")
    format: Literal["jpg", "webp", "png"] = "jpg"
    quality: int = Field(95, ge=1, le=100)
    filter: Literal["area", "bilinear", "bicubic", "lanczos"] = "area"

    @field_validator("buckets", mode="before")
    @classmethod
    def _buckets(cls, value: object) -> object:
        if value is not None:
            plan.parse_buckets(value)  # one line naming the bad bucket
        return value

    @model_validator(mode="after")
    def _one_list(self) -> AspectBucketsOptions:
        if self.preset is not None and self.buckets is not None:
            raise ValueError("give either preset or buckets, not both")
        if self.bucket_min_side > self.bucket_max_side:
            raise ValueError("bucket_min_side is above bucket_max_side")
        self._fillable(self.bucket_list())
        return self

    def _fillable(self, buckets: list[plan.Bucket]) -> None:
        """Refuse a bucket no image could fill: above max_pixels every image that covers it is
        too_many_pixels (a 100000x100000 bucket dropped the whole build); WebP stores at most
        16383 pixels a side."""
        source = "buckets" if self.buckets is not None else f"preset {self.preset or 'sdxl'}"
        largest = max(buckets, key=lambda b: b[0] * b[1])
        if largest[0] * largest[1] > self.max_pixels:
            raise ValueError(
                f"{source}: bucket {plan.bucket_name(largest)} has {largest[0] * largest[1]:,} "
                f"pixels, above max_pixels ({self.max_pixels:,}): no image could fill it"
            )
        widest = max(buckets, key=max)
        if self.format == "webp" and max(widest) > WEBP_MAX_SIDE:
            raise ValueError(
                f"{source}: bucket {plan.bucket_name(widest)} is over WebP's {WEBP_MAX_SIDE} "
                "pixels a side; use format jpg or png"
            )

    def bucket_list(self) -> list[plan.Bucket]:
        if self.buckets is not None:
            return plan.parse_buckets(self.buckets)
        sides = {"step": self.step, "min_side": self.bucket_min_side}
        sides["max_side"] = self.bucket_max_side
        if self.preset == "kohya":
            return plan.kohya_buckets(self.base, **sides)
        if self.preset == "novelai":
            return plan.novelai_buckets(**sides)
        return plan.sdxl_buckets()  # the default

    def describe(self) -> dict[str, Any]:
        """What buckets.json records: the algorithm and the parameters that shaped the list."""
        algorithm = "explicit" if self.buckets is not None else (self.preset or "sdxl")
        parameters: dict[str, Any] = {"assign": "nearest log aspect ratio", "crop": self.crop}
        if algorithm in ("kohya", "novelai"):
            parameters |= {"step": self.step, "min_side": self.bucket_min_side}
            parameters["max_side"] = self.bucket_max_side
        if algorithm == "kohya":
            parameters["max_area"] = self.base * self.base
        if algorithm == "novelai":
            parameters["max_area"] = 512 * 768
        if self.crop == "random":
            parameters["seed"] = self.seed
        parameters["upscale_max_factor"] = self.upscale.max_factor if self.upscale else None
        return {"algorithm": algorithm, "parameters": parameters}


@register
class AspectBuckets(Stage):
    name = "aspect_buckets"
    Options = AspectBucketsOptions
    produces = frozenset({"bucket", "aspect_error", "crop_share"})
    # Listed after a model stage (clip_score, aesthetic_score: global, so they run after the
    # per-sample stages), it waits for it: the model scores the whole picture, as written.
    consumes = frozenset({"clip_score", "embedding", "aesthetic_score"})

    def setup(self) -> None:
        allow_pixels(self.options.max_pixels)
        self.buckets = self.options.bucket_list()

    def rule_problem(self, width: int, height: int) -> str | None:
        """The drop reason of an upright image of this size, before any bucket."""
        opts: AspectBucketsOptions = self.options
        if width * height > opts.max_pixels:
            return "too_many_pixels"
        if opts.min_side is not None and min(width, height) < opts.min_side:
            return "too_small"
        if opts.min_pixels is not None and width * height < opts.min_pixels:
            return "too_few_pixels"
        ratio = max(width, height) / max(min(width, height), 1)
        if opts.max_aspect_ratio is not None and ratio > opts.max_aspect_ratio:
            return "bad_aspect_ratio"
        return None

    def place(self, width: int, height: int, key: str) -> tuple[plan.Placement | None, str | None]:
        opts: AspectBucketsOptions = self.options
        problem = self.rule_problem(width, height)
        if problem:
            return None, problem
        bucket = plan.nearest_bucket(width, height, self.buckets)
        where = plan.placement(width, height, bucket, opts.crop, key, opts.seed)
        limit = opts.upscale.max_factor if opts.upscale else 1.0
        if where.scale > limit:
            return None, "below_bucket"
        if where.resized[0] * where.resized[1] > opts.max_pixels:
            return None, "too_many_pixels"
        return where, None

    def one(self, value: Any, key: str) -> tuple[bytes | None, dict, str | None]:
        """One image -> (bucket-sized image bytes, json fields, drop reason)."""
        try:
            with open_media(value) as f, Image.open(f) as image:
                width, height = image.size
                if orientation(image) in SWAPS_SIDES:
                    width, height = height, width
                where, problem = self.place(width, height, key)
                if where is None:
                    return None, {}, problem
                picture = self.fitted(image, where)
        except Image.DecompressionBombError:
            return None, {}, "too_many_pixels"
        except DECODE_ERRORS:
            return None, {}, "decode_error"
        return (
            encode(picture, self.options.format, self.options.quality),
            fields(width, height, where),
            None,
        )

    def fitted(self, image: Image.Image, where: plan.Placement) -> Image.Image:
        """Decode (JPEG: at a reduced scale still covering the target), turn upright, resize to
        cover, crop to the bucket."""
        if image.format == "JPEG" and where.scale < 1:
            target = where.resized  # draft works on the stored (unturned) sides
            image.draft("RGB", target[::-1] if orientation(image) in SWAPS_SIDES else target)
        picture = to_rgb(upright(image))
        if picture.size != where.resized:
            if where.scale < 1:
                picture = shrink(picture, where.resized, FILTERS[self.options.filter])
            else:
                picture = picture.resize(where.resized, Image.Resampling.BICUBIC)
        (bw, bh), left, top = where.bucket, where.left, where.top
        return picture.crop((left, top, left + bw, top + bh))

    def process(self, batch: Columns) -> tuple[Columns, list[str | None]]:
        size = len(batch["__key__"])
        fmt = self.options.format
        out: dict[str, list] = {col: [None] * size for col in IMAGE_COLUMNS}
        added: dict[str, list] = {c: [None] * size for c in sorted(self.produces)}
        metas = list(batch.get("json") or [None] * size)
        reasons: list[str | None] = []
        for row in range(size):
            col = media_column(batch, row)
            if col is None:
                reasons.append("no_image")
                continue
            data, extra, reason = self.one(batch[col][row], batch["__key__"][row])
            reasons.append(reason)
            if reason is None:
                out[fmt][row] = data
                for name in added:
                    added[name][row] = extra[name]
                metas[row] = with_fields(metas[row], extra)
        batch.update(out)
        batch.update(added)
        batch["json"] = metas
        return batch, reasons


def fields(width: int, height: int, where: plan.Placement) -> dict[str, Any]:
    return {
        "original_width": width,
        "original_height": height,
        "bucket": plan.bucket_name(where.bucket),
        "crop_left": where.left,
        "crop_top": where.top,
        "aspect_error": round(plan.aspect_error(width, height, where.bucket), 6),
        "crop_share": round(where.crop_share, 6),
        "width": where.bucket[0],
        "height": where.bucket[1],
    }

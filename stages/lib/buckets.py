"""Aspect-ratio buckets, planned as pure functions (the `aspect_buckets` stage applies them).

- Bucket lists: `kohya_buckets` (kohya-ss sd-scripts' `make_bucket_resolutions`: every width
  from `min_side` to `max_side` in `step`s, paired with the tallest multiple of `step` that keeps
  the area within base x base, both orientations, plus the square), `sdxl_buckets` (the 40
  resolutions of the SDXL paper's multi-aspect training table, about 1 MP, multiples of 64) and
  `novelai_buckets` (NovelAI's published procedure: widths 256..1024 in 64s with the tallest
  height in 64s such that width x height <= 512 x 768, the same with the sides exchanged, plus
  512 x 512).
- `nearest_bucket`: the bucket whose aspect ratio is nearest in log ratio, |ln(w/h) -
  ln(bw/bh)|. Log, not linear: a linear difference of ratios treats portrait and landscape
  unequally (1:2 and 2:1 are 0.5 and 2.0, so a linear error around a tall image is up to 4x
  smaller than the same shape turned sideways); the log error of an image and its transpose
  against a bucket and its transpose is the same. Compared exactly (fractions), so ties are
  ties on every machine; a tie goes to the smaller bucket (area, then width).
- `parse_buckets`: an explicit list, strictly: `"WxH"` or `[W, H]`, integer sides (a YAML
  `true` or `1024.0` is refused, not read as 1 or 1024), multiples of 8 up to 16384; one bucket
  written twice (in two spellings) is refused, never merged silently.
- `placement`: resize to cover the bucket (one scale for both sides, the larger needed), then
  crop the overhang: centred, or at an offset drawn from a hash of the sample key and a seed
  (the same on every rerun and machine).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from fractions import Fraction

Bucket = tuple[int, int]  # (width, height)

# SDXL paper (Podell et al. 2023), appendix, multi-aspect training: (height, width) as printed.
SDXL_HEIGHT_WIDTH: tuple[Bucket, ...] = (
    (512, 2048), (512, 1984), (512, 1920), (512, 1856), (576, 1792), (576, 1728), (576, 1664),
    (640, 1600), (640, 1536), (704, 1472), (704, 1408), (704, 1344), (768, 1344), (768, 1280),
    (832, 1216), (832, 1152), (896, 1152), (896, 1088), (960, 1088), (960, 1024), (1024, 1024),
    (1024, 960), (1088, 960), (1088, 896), (1152, 896), (1152, 832), (1216, 832), (1280, 768),
    (1344, 768), (1408, 704), (1472, 704), (1536, 640), (1600, 640), (1664, 576), (1728, 576),
    (1792, 576), (1856, 512), (1920, 512), (1984, 512), (2048, 512),
)  # fmt: skip


def sdxl_buckets() -> list[Bucket]:
    return sorted((w, h) for h, w in SDXL_HEIGHT_WIDTH)


def kohya_buckets(
    base: int = 512, step: int = 64, min_side: int = 256, max_side: int = 1024
) -> list[Bucket]:
    """kohya-ss `make_bucket_resolutions((base, base), min_side, max_side, step)`."""
    max_area = base * base
    side = int(math.sqrt(max_area) // step) * step
    found = {(side, side)}
    width = min_side
    while width <= max_side:
        height = min(max_side, int((max_area // width) // step) * step)
        if height >= min_side:
            found |= {(width, height), (height, width)}
        width += step
    return sorted(found)


def novelai_buckets(
    max_area: int = 512 * 768, step: int = 64, min_side: int = 256, max_side: int = 1024
) -> list[Bucket]:
    """NovelAI's aspect-ratio bucketing (their 2022 write-up)."""
    found = {(512, 512)}
    width = min_side
    while width <= max_side:
        height = min(max_side, (max_area // width) // step * step)
        if height >= min_side:
            found |= {(width, height), (height, width)}
        width += step
    return sorted(found)


# A bucket's sides: multiples of SIDE_MULTIPLE (SD's VAE maps each 8x8 pixel block to one
# latent; the presets and kohya's default step use 64, which also divides evenly through SD's
# UNet's three downsamplings), from SIDE_MULTIPLE to MAX_SIDE (eight times SDXL's longest side;
# WebP's 16383 a side is checked with the stage's format).
SIDE_MULTIPLE = 8
MAX_SIDE = 16384
FORMS = 'write each bucket as "WIDTHxHEIGHT" or [WIDTH, HEIGHT], e.g. "1024x768" or [1024, 768]'
SIZE_TEXT = re.compile(r"\s*([0-9]+)\s*[xX]\s*([0-9]+)\s*", re.ASCII)  # ASCII: no '１０２４'
SIDE_RULE = f"sides are multiples of {SIDE_MULTIPLE} from {SIDE_MULTIPLE} to {MAX_SIDE}"


def shown(value: object) -> str:
    """A config value as the user wrote it in YAML (`[true, 768]`, not Python's `[True, 768]`)."""
    return json.dumps(value, default=str)


def parse_bucket(value: object) -> Bucket:
    """`"1024x768"` or `[1024, 768]` -> (1024, 768); ValueError (one line naming the bucket,
    what is wrong and the accepted forms) for anything else, `[true, 768]` and `[1024.0, 768]`
    included: a bool or a float is not a pixel count."""
    where = f"bucket {shown(value)}"
    if isinstance(value, str):
        match = SIZE_TEXT.fullmatch(value)
        if match is None:
            raise ValueError(f"{where}: not a size; {FORMS}")
        for digits in match.groups():  # too long for any allowed side (or for int())
            if len(digits.lstrip("0")) > len(str(MAX_SIDE)):
                raise ValueError(f"{where}: side {digits} is not allowed ({SIDE_RULE})")
        sides = [int(d) for d in match.groups()]
    elif isinstance(value, list | tuple) and len(value) == 2:
        for side in value:
            if type(side) is not int:  # bool is an int subclass: [true, 768] was 1x768
                raise ValueError(f"{where}: side {shown(side)} is not an integer; {FORMS}")
        sides = list(value)
    else:
        raise ValueError(f"{where}: {FORMS}")
    for side in sides:
        if not SIDE_MULTIPLE <= side <= MAX_SIDE or side % SIDE_MULTIPLE:
            raise ValueError(f"{where}: side {side} is not allowed ({SIDE_RULE})")
    return sides[0], sides[1]


def parse_buckets(values: object) -> list[Bucket]:
    """An explicit bucket list -> its buckets, sorted; ValueError for an empty list or one
    bucket written twice (`"1024x768"` and `[1024, 768]` would otherwise merge silently)."""
    if not isinstance(values, list) or not values:
        raise ValueError(f"give a list of at least one bucket; {FORMS}")
    first: dict[Bucket, object] = {}
    for value in values:
        bucket = parse_bucket(value)
        if bucket in first:
            raise ValueError(
                f"bucket {shown(first[bucket])} and {shown(value)} are the same bucket "
                f"{bucket_name(bucket)}: list it once"
            )
        first[bucket] = value
    return sorted(first)


def bucket_name(bucket: Bucket) -> str:
    return f"{bucket[0]}x{bucket[1]}"


def _log_distance(width: int, height: int, bucket: Bucket) -> Fraction:
    """exp(|ln(w/h) - ln(bw/bh)|) as an exact fraction (monotone in the log distance)."""
    ratio = Fraction(width * bucket[1], height * bucket[0])
    return ratio if ratio >= 1 else 1 / ratio


def nearest_bucket(width: int, height: int, buckets: list[Bucket]) -> Bucket:
    """The bucket nearest in log aspect ratio; a tie goes to the smaller one."""
    return min(buckets, key=lambda b: (_log_distance(width, height, b), b[0] * b[1], b[0]))


def aspect_error(width: int, height: int, bucket: Bucket) -> float:
    """|ln(w/h) - ln(bw/bh)|: 0 for the exact shape; 0.1 is about a 10% stretch of one side."""
    return abs(math.log(width / height) - math.log(bucket[0] / bucket[1]))


@dataclass(frozen=True)
class Placement:
    """How an image of `width` x `height` fills `bucket`: resized to `resized`, then the
    bucket-sized window at (`left`, `top`) of it kept."""

    bucket: Bucket
    resized: Bucket
    left: int
    top: int
    scale: float  # resized / original (> 1: enlarged)

    @property
    def crop_share(self) -> float:
        """Share of the resized image's pixels the crop throws away."""
        kept = self.bucket[0] * self.bucket[1]
        return 1 - kept / (self.resized[0] * self.resized[1])


def cover_size(width: int, height: int, bucket: Bucket) -> tuple[Bucket, float]:
    """The smallest size of the image's own shape covering `bucket` (each side rounded, never
    below the bucket's), and the scale."""
    scale = max(bucket[0] / width, bucket[1] / height)
    resized = (max(bucket[0], round(width * scale)), max(bucket[1], round(height * scale)))
    return resized, scale


def crop_offset(overhang: int, key: str, seed: int, axis: str) -> int:
    """A uniform offset in [0, overhang] drawn from the key (the same on every run)."""
    if overhang <= 0:
        return 0
    digest = hashlib.sha256(f"{seed}:{axis}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % (overhang + 1)


def placement(
    width: int, height: int, bucket: Bucket, crop: str = "center", key: str = "", seed: int = 0
) -> Placement:
    """Resize-to-cover and the crop window, for `crop` 'center' or 'random' (keyed)."""
    resized, scale = cover_size(width, height, bucket)
    dx, dy = resized[0] - bucket[0], resized[1] - bucket[1]
    if crop == "random":
        left, top = crop_offset(dx, key, seed, "x"), crop_offset(dy, key, seed, "y")
    else:
        left, top = dx // 2, dy // 2
    return Placement(bucket, resized, left, top, scale)

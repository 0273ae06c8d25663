"""Video buckets (resolution x aspect ratio x fewest frames), planned as pure functions; the
`video_buckets` stage applies them.

- The `opensora` preset follows the idea of Open-Sora's bucket tables: each resolution class
  (144p ... 1080p) is one pixel budget, the area of its 16:9 frame (`(p * 16 / 9) * p`: 360p is
  640 x 360 = 230,400 px), and each aspect ratio of the class gets the frame of that area and
  shape, sides rounded to multiples of 8 (a video VAE works on 8x8 blocks; H.264's yuv420p
  needs even sides). So 1:1 at 360p is 480x480, 9:16 is 360x640, 4:3 is 552x416.
  Each class has a `min_frames` (DEFAULT_MIN_FRAMES, or the config's): the fewest frames a clip
  needs to enter it. Higher classes ask for more, so a short clip settles in a smaller class
  rather than being dropped.
- Explicit buckets: `WxH` sizes (stages/lib/buckets.parse_bucket: multiples of 8, each listed
  once), each with its own `min_frames`; their class is `custom`.
- A bucket's nominal aspect (`aspect`): the preset's ratio name; for an explicit bucket the
  standard ratio (ASPECTS) within ASPECT_SNAP in log ratio of its own, else its reduced `W:H`.
  Buckets of one nominal aspect are one group: 424x240 and 640x360 are both 16:9 though their
  exact ratios differ by rounding, so a clip is never sent to the smaller one for a 0.4% ratio.

The choice (`choose_bucket`), for a clip of `width` x `height` (upright) and `frames` frames:
1. the buckets it can fill: both sides <= the clip's (never upscaled) and min_frames <= frames;
2. among those, the nominal aspect nearest the clip's in log ratio, |ln(w/h) - ln(a)|
   (symmetric for portrait and landscape, compared exactly as fractions);
3. within that aspect, the bucket of the most pixels (ties: the wider).
None when no bucket can be filled (`below_bucket`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from mmcurate.stages.lib.buckets import SIDE_MULTIPLE, parse_bucket
from mmcurate.stages.lib.video_decode import fps_plan

# p -> the class's short side at 16:9
RESOLUTIONS: dict[str, int] = {
    "144p": 144,
    "240p": 240,
    "360p": 360,
    "480p": 480,
    "720p": 720,
    "1080p": 1080,
}
DEFAULT_MIN_FRAMES: dict[str, int] = {
    "144p": 8,
    "240p": 8,
    "360p": 16,
    "480p": 16,
    "720p": 24,
    "1080p": 32,
}
# width:height, tall to wide
ASPECTS: dict[str, tuple[int, int]] = {
    "9:21": (9, 21),
    "1:2": (1, 2),
    "9:16": (9, 16),
    "2:3": (2, 3),
    "3:4": (3, 4),
    "1:1": (1, 1),
    "4:3": (4, 3),
    "3:2": (3, 2),
    "16:9": (16, 9),
    "2:1": (2, 1),
    "21:9": (21, 9),
}
# Half the smallest log gap between two standard ratios (0.118, 4:3 to 3:2) is 0.059: within
# 0.05 an explicit bucket is never near two standard ratios at once.
ASPECT_SNAP = 0.05
CUSTOM = "custom"


@dataclass(frozen=True)
class VideoBucket:
    width: int
    height: int
    min_frames: int
    resolution: str  # "360p", or "custom" for an explicit bucket
    aspect: str  # nominal ratio name, "16:9"

    @property
    def name(self) -> str:
        return f"{self.width}x{self.height}"

    @property
    def size(self) -> tuple[int, int]:
        return self.width, self.height

    @property
    def pixels(self) -> int:
        return self.width * self.height


def round_side(value: float) -> int:
    return max(SIDE_MULTIPLE, int(round(value / SIDE_MULTIPLE)) * SIDE_MULTIPLE)


def preset_size(short: int, aspect: tuple[int, int]) -> tuple[int, int]:
    """The frame of the class's area (its 16:9 frame's) in the shape `aspect` (w, h)."""
    area = short * 16 / 9 * short
    height = math.sqrt(area * aspect[1] / aspect[0])
    return round_side(height * aspect[0] / aspect[1]), round_side(height)


def preset_table(
    resolutions: list[str] | None = None,
    aspects: list[str] | None = None,
    min_frames: dict[str, int] | None = None,
) -> list[VideoBucket]:
    """The opensora preset (every class and ratio unless narrowed); ValueError naming an
    unknown class or ratio."""
    chosen = resolutions or list(RESOLUTIONS)
    ratios = aspects or list(ASPECTS)
    for name in chosen:
        if name not in RESOLUTIONS:
            raise ValueError(f"resolution {name!r} is not one of {', '.join(RESOLUTIONS)}")
    for name in ratios:
        if name not in ASPECTS:
            raise ValueError(f"aspect {name!r} is not one of {', '.join(ASPECTS)}")
    frames = DEFAULT_MIN_FRAMES | (min_frames or {})
    table = []
    for res in chosen:
        for ratio in ratios:
            width, height = preset_size(RESOLUTIONS[res], ASPECTS[ratio])
            table.append(VideoBucket(width, height, frames[res], res, ratio))
    return unique(table)


def unique(table: list[VideoBucket]) -> list[VideoBucket]:
    """Refuse two buckets of one size (a class listed twice, or two explicit spellings)."""
    seen: dict[tuple[int, int], VideoBucket] = {}
    for bucket in table:
        if bucket.size in seen:
            first = seen[bucket.size]
            raise ValueError(
                f"bucket {bucket.name} is listed twice ({first.resolution} {first.aspect} and "
                f"{bucket.resolution} {bucket.aspect}): list it once"
            )
        seen[bucket.size] = bucket
    return sorted(table, key=lambda b: (b.pixels, b.width))


def nominal_aspect(width: int, height: int) -> str:
    """The standard ratio within ASPECT_SNAP of width:height, else the reduced 'W:H'."""
    ratio = math.log(width / height)
    name, (a, b) = min(ASPECTS.items(), key=lambda kv: abs(ratio - math.log(kv[1][0] / kv[1][1])))
    if abs(ratio - math.log(a / b)) <= ASPECT_SNAP:
        return name
    divisor = math.gcd(width, height)
    return f"{width // divisor}:{height // divisor}"


def explicit_table(specs: list[tuple[object, int]]) -> list[VideoBucket]:
    """[(size as "WxH" or [W, H], min_frames)] -> buckets; ValueError (one line) for a bad
    size or one listed twice."""
    if not specs:
        raise ValueError('give a list of at least one bucket, e.g. [{size: "640x360"}]')
    table = []
    for size, frames in specs:
        width, height = parse_bucket(size)
        table.append(VideoBucket(width, height, frames, CUSTOM, nominal_aspect(width, height)))
    return unique(table)


def aspect_value(name: str) -> Fraction:
    width, _, height = name.partition(":")
    return Fraction(int(width), int(height))


def aspect_distance(width: int, height: int, aspect: str) -> Fraction:
    """exp(|ln(w/h) - ln(aspect)|) as an exact fraction (monotone in the log distance)."""
    ratio = Fraction(width, height) / aspect_value(aspect)
    return ratio if ratio >= 1 else 1 / ratio


def fits(bucket: VideoBucket, width: int, height: int, frames: int) -> bool:
    return bucket.width <= width and bucket.height <= height and bucket.min_frames <= frames


def choose_bucket(
    table: list[VideoBucket], width: int, height: int, frames: int
) -> VideoBucket | None:
    """The module's rule: nearest nominal aspect among the buckets the clip can fill, then
    the most pixels of that aspect; None: below every bucket."""
    candidates = [b for b in table if fits(b, width, height, frames)]
    if not candidates:
        return None
    return min(
        candidates,
        key=lambda b: (aspect_distance(width, height, b.aspect), -b.pixels, -b.width),
    )


def choose_image_bucket(table: list[VideoBucket], width: int, height: int) -> VideoBucket | None:
    """choose_bucket's rule for an image (a one-frame clip): min_frames does not apply."""
    return choose_bucket(table, width, height, max(b.min_frames for b in table))


def resample_plan(times: list[float], fps: float, target_fps: float | None) -> list[int]:
    """Frame numbers kept at `target_fps`: the frame nearest each 1/target_fps step from the
    first frame, by the frames' own times (video_decode.fps_plan: variable frame rates too).
    A clip at or below the target keeps every frame: frames are never repeated to raise a
    rate, and its json's `fps` says its own."""
    if not times:
        return []
    if target_fps is None or fps <= target_fps * (1 + 1e-6):
        return list(range(len(times)))
    return fps_plan(np.maximum.accumulate(np.asarray(times, dtype=np.float64)), target_fps)

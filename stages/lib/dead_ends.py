"""Stage chains that can never keep a sample, refused at config time.

A build whose stages contradict each other ran to the end, exit 0, and dropped everything: a
`decode_image` resize to 256 px followed by `aspect_buckets` with SDXL's buckets (all above
512 px) dropped every sample as `below_bucket`. Each check here reads the options of two stages
in run order and says, in one line, why no image could pass both. Duck-typed on the stages'
option objects, so this module imports no stage.

The chains refused (a sizing stage, then one that needs more pixels than it leaves):
- a resize, then buckets that no resized image can cover (`below_bucket`);
- a resize, then `aspect_buckets` `min_side` or `min_pixels` above what the resize leaves.
"""

from __future__ import annotations

from typing import Any


def dead_end(stages: list[Any]) -> str | None:
    """Why the stages (in run order) can never keep a sample, or None."""
    resize = None  # (stage, its resize options) of the last decode_image that resizes
    for stage in stages:
        if stage.name == "face_blur" and (why := unblurred_video(stages, stage)) is not None:
            return why
        if stage.name == "decode_image" and stage.options.resize.mode != "none":
            resize = stage
        if stage.name == "aspect_buckets" and resize is not None:
            why = after_resize(resize, stage)
            if why is not None:
                return why
    return None


def after_resize(decode: Any, buckets: Any) -> str | None:
    """Why no image resized by `decode` passes `buckets`, or None. A keep_ratio resize leaves
    the shorter side at most `size` (the longer one unbounded); center_crop a square of `size`."""
    resize, opts = decode.options.resize, buckets.options
    size, square = resize.size, resize.mode == "center_crop"
    where = f"stages.{buckets.index} (aspect_buckets) after stages.{decode.index} (decode_image)"
    factor = opts.upscale.max_factor if opts.upscale is not None else 1.0
    reach = size * factor  # the largest side a bucket may have and still be covered
    fits = [b for b in opts.bucket_list() if (max(b) if square else min(b)) <= reach]
    if not fits:
        smallest = min(opts.bucket_list(), key=lambda b: (min(b), max(b)))
        kind = "a square of" if square else "a shorter side of at most"
        return (
            f"{where}: the resize leaves {kind} {size} px, smaller than every bucket "
            f"(the smallest is {smallest[0]}x{smallest[1]}), so every sample would be dropped "
            f"as below_bucket; raise resize.size to at least {min(smallest)}, set resize.mode: "
            "none, or allow aspect_buckets upscale"
        )
    if opts.min_side is not None and opts.min_side > size:
        return (
            f"{where}: min_side {opts.min_side} is above the {size} px the resize leaves, so "
            "every sample would be dropped as too_small"
        )
    if opts.min_pixels is not None and square and opts.min_pixels > size * size:
        return (
            f"{where}: min_pixels {opts.min_pixels} is above the {size}x{size} the resize "
            "leaves, so every sample would be dropped as too_few_pixels"
        )
    return None


def unblurred_video(stages: list[Any], blur: Any) -> str | None:
    """face_blur blurs frames, never a video file: a video_frames that keeps the video before
    it, or any video_frames after it, would store faces unblurred (every video sample dropped
    as video_not_blurred, or frames written after the blur)."""
    for stage in stages:
        if stage.name != "video_frames":
            continue
        where = f"stages.{blur.index} (face_blur) and stages.{stage.index} (video_frames)"
        if stage.index > blur.index:
            return (
                f"{where}: frames taken after face_blur would be stored unblurred; "
                "list face_blur after video_frames"
            )
        if stage.options.keep_video:
            return (
                f"{where}: face_blur cannot blur a kept video file, so every video sample "
                "would be dropped as video_not_blurred; set keep_video: false on video_frames"
            )
    return None

"""video_buckets: each video clip re-encoded at the size of its (resolution, aspect, frames)
bucket, for video-generation training that batches clips of one shape and draws windows.

The table and the choice are stages/lib/video_bucket_table.py's (the `opensora` preset, or an
explicit `buckets` list; nearest nominal aspect among the buckets the clip can fill without
upscaling and whose `min_frames` it has, then the most pixels). Per clip, in the isolated
decoder process (stages/lib/isolation.py, like clip_split): pass 1 counts frames and their
times (video_split.scan); the frames kept are every frame, or at `target_fps` the frame
nearest each step (never repeated to raise a rate), then the first `max_frames`; pass 2 scales
each kept frame to cover the bucket (one scale, area filter, after the display rotation) and
crops the centre, into an H.264 mp4 at the bucket's size, written straight to a file in the
task's spill folder (never a whole clip in memory). The clip goes to the `mp4` column (other
video columns and frames sampled before are cleared: they show the uncropped clip); put the
stage before `video_frames`. The first `inline_clip_bytes` of a batch's clips come back as
bytes, the rest as Spilled files.

json: `bucket` ("WxH"), `num_frames` (frames in the stored clip), `fps` (its rate),
`original_width`/`original_height` (upright), `original_fps`, `original_frames`, `resolution`
(the bucket's class: `360p`, or `custom`), `aspect` (its nominal ratio), `aspect_error`
(|ln(w/h) - ln(bw/bh)|), `crop_share`, `width`/`height` (the bucket's), `source_container`;
with frames cut by `max_frames`, `clip_end` moves to the stored clip's end. `bucket`,
`aspect_error` and `crop_share` are signature columns: the build's buckets.json counts them.
Drops: `below_bucket`, `no_video`, and the decoder's `decode_timeout`, `decode_error`,
`no_video_stream`, `no_frames`, `too_many_pixels`.

Images (`images`, on by default): a sample with an image and no video joins as a one-frame
clip: upright (EXIF), bucketed by its size with the same rule (min_frames does not apply: an
image is one frame by nature), cover-scaled and centre-cropped, stored as a one-frame H.264
mp4 in the `mp4` column (the image column cleared); json `num_frames` 1, `fps` null,
`source_container` the image's column. The video loader repeats its frame over the window.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from fractions import Fraction
from typing import Any, ClassVar, Literal

import numpy as np
from mmcurate.core.formats import FRAME_COLUMN, IMAGE_COLUMNS, VIDEO_COLUMNS, meta_json, sample_meta
from mmcurate.core.spill import Media, Spilled, media_bytes, release, task_folder
from mmcurate.stages.base import Columns, Stage, StageOptions, media_column, register
from mmcurate.stages.lib import video_bucket_table as table
from mmcurate.stages.lib.buckets import aspect_error, placement
from mmcurate.stages.lib.isolation import Isolated
from mmcurate.stages.lib.video_child import clear_columns, decoder_input, isolated_decode
from PIL import Image
from pydantic import Field, StrictInt, field_validator, model_validator

CLIP_COLUMN = "mp4"  # what the encoder writes: H.264 in mp4
X264_SPEEDS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow")


class BucketSpec(StageOptions):
    size: str | list[StrictInt] = Field(description='"WxH" or [W, H], sides multiples of 8')
    min_frames: int = Field(1, ge=1, description="fewest frames a clip needs to enter it")


class VideoBucketsOptions(StageOptions):
    preset: Literal["opensora"] | None = None
    resolutions: list[str] | None = Field(None, description="preset classes; None: all")
    aspects: list[str] | None = Field(None, description="preset ratios; None: all")
    min_frames: dict[str, int] | None = Field(None, description="per class, over the defaults")
    buckets: list[BucketSpec | str] | None = Field(None, description="explicit, not with preset")
    target_fps: float | None = Field(None, gt=0, description="resample faster clips down")
    max_frames: int | None = Field(None, ge=1, description="frames kept, from the first")
    crf: int = Field(18, ge=0, le=51, description="x264 quality (lower: better, bigger)")
    speed: Literal[X264_SPEEDS] = Field("veryfast", description="x264 preset")  # type: ignore[valid-type]
    timeout_s: float = Field(300.0, gt=0, description="per clip, then the decoder is killed")
    inline_clip_bytes: int = Field(16 << 20, ge=0, description="a batch's clips kept as bytes")
    images: bool = Field(True, description="images join as one-frame clips (else no_video)")

    @field_validator("min_frames")
    @classmethod
    def _positive(cls, value: dict[str, int] | None) -> dict[str, int] | None:
        for name, frames in (value or {}).items():
            if frames < 1:
                raise ValueError(f"min_frames of {name} is {frames}: at least 1")
        return value

    @model_validator(mode="after")
    def _table(self) -> VideoBucketsOptions:
        preset_only = self.preset or self.resolutions or self.aspects or self.min_frames
        if self.buckets is not None and preset_only:
            raise ValueError(
                "give either buckets or the preset (preset, resolutions, aspects, min_frames)"
            )
        unknown = set(self.min_frames or {}) - set(self.resolutions or table.RESOLUTIONS)
        if unknown:
            raise ValueError(f"min_frames names {sorted(unknown)[0]!r}, not a chosen resolution")
        buckets = self.table()
        hardest = max(buckets, key=lambda b: b.min_frames)
        if self.max_frames is not None and self.max_frames < hardest.min_frames:
            raise ValueError(
                f"max_frames {self.max_frames} is below bucket {hardest.name}'s min_frames "
                f"{hardest.min_frames}"
            )
        return self

    def table(self) -> list[table.VideoBucket]:
        if self.buckets is None:
            return table.preset_table(self.resolutions, self.aspects, self.min_frames)
        specs = [(b, 1) if isinstance(b, str) else (b.size, b.min_frames) for b in self.buckets]
        return table.explicit_table(specs)

    def bucket_list(self) -> list[tuple[int, int]]:
        """The buckets' sizes, as buckets.json lists them."""
        return [b.size for b in self.table()]

    def describe(self) -> dict[str, Any]:
        """What buckets.json records about the table and the rule."""
        algorithm = "explicit" if self.buckets is not None else "opensora"
        parameters = {
            "assign": "nearest nominal log aspect among fillable buckets, then most pixels",
            "crop": "center",
            "upscale": False,
            "min_frames": {b.name: b.min_frames for b in self.table()},
            "target_fps": self.target_fps,
            "max_frames": self.max_frames,
        }
        return {"algorithm": algorithm, "parameters": parameters}


@register
class VideoBuckets(Stage):
    name = "video_buckets"
    Options = VideoBucketsOptions
    produces: ClassVar[frozenset[str]] = frozenset({"bucket", "aspect_error", "crop_share"})

    def setup(self) -> None:
        preload = ("mmcurate.stages.video_buckets", "mmcurate.stages.lib.video_split", "av")
        self.decoder = Isolated(preload=preload)
        self.table = self.options.table()

    def process(self, batch: Columns) -> tuple[Columns, list[str | None]]:
        size = len(batch["__key__"])
        reasons: list[str | None] = [None] * size
        metas = list(batch.get("json") or [None] * size)
        added: dict[str, list] = {c: [None] * size for c in sorted(self.produces)}
        inline_left = self.options.inline_clip_bytes
        for row in range(size):
            col = media_column(batch, row, VIDEO_COLUMNS)
            image = media_column(batch, row, IMAGE_COLUMNS) if self.options.images else None
            if col is None and image is None:
                reasons[row] = "no_video"
                continue
            if col is None:
                col = image
                result, reasons[row] = self.encode(batch[col][row], bucket_image)
                clear_columns(batch, row, [col])  # the uncropped image: the clip replaces it
            else:
                result, reasons[row] = self.encode(batch[col][row])
            if result is None:
                continue
            data = result.pop("data")
            if data.size <= inline_left:  # small clips travel as plain bytes
                inline_left -= data.size
                data = inlined(data)
            others = [c for c in batch if c in VIDEO_COLUMNS or FRAME_COLUMN.match(c)]
            clear_columns(batch, row, others)
            batch.setdefault(CLIP_COLUMN, [None] * size)[row] = data
            for name in added:
                added[name][row] = result[name]
            metas[row] = with_fields(metas[row], result, col)
        batch.update(added)
        batch["json"] = metas
        return batch, reasons

    def encode(self, value: Media, fn: Any = None) -> tuple[dict | None, str | None]:
        """The clip in its bucket (a dict with `data`, a Spilled file), or a drop reason;
        `fn` (in the decoder process): bucket_clip, or bucket_image for an image."""
        sent, temporary = decoder_input(value)
        path = os.path.join(task_folder(), f"bucket-{uuid.uuid4().hex}.{CLIP_COLUMN}")
        args = (sent, self.table, self.options.model_dump(), path)
        try:
            result, reason = isolated_decode(
                self.decoder, fn or bucket_clip, args, self.options.timeout_s
            )
        finally:
            release(temporary)
        if result is not None and result.get("reason"):
            result, reason = None, result["reason"]
        if result is None:  # a killed, failed or dropped call may have left a partial file
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        return result, reason


def inlined(clip: Spilled) -> bytes:
    """The clip's bytes, its file removed."""
    data = media_bytes(clip)
    release([clip])
    return data


def with_fields(text: str | None, result: dict[str, Any], column: str) -> str:
    meta = sample_meta(text)
    start, end = meta.get("clip_start"), meta.get("clip_end")
    if result.pop("cut") and isinstance(start, int | float) and isinstance(end, int | float):
        meta["clip_end"] = round(start + result["num_frames"] / result["fps"], 4)
    meta.setdefault("source_container", column)
    meta.update(result)
    return meta_json(meta, sort_keys=True, ensure_ascii=False)


# --- in the decoder process ---


def bucket_clip(
    value: Media, buckets: list[table.VideoBucket], opts: dict[str, Any], path: str
) -> dict[str, Any]:
    """Choose the clip's bucket and encode it into `path`: the json fields plus `data` (a
    Spilled file) and `cut` (frames left out by max_frames); or {"reason": "below_bucket"}."""
    from mmcurate.stages.lib.video_split import scan

    found = scan(value, None)
    width, height = found.size[::-1] if found.rotation % 180 == 90 else found.size
    plan = table.resample_plan(found.times.tolist(), found.fps, opts["target_fps"])
    bucket = table.choose_bucket(buckets, width, height, len(plan))
    if bucket is None:
        return {"reason": "below_bucket"}
    resampled = len(plan) < found.count
    kept = plan[: opts["max_frames"]] if opts["max_frames"] else plan
    rate = Fraction(opts["target_fps"] if resampled else found.fps).limit_denominator(1001)
    upright_size = (width, height)
    written = encode_bucket(
        value, found.rotation, upright_size, bucket.size, kept, rate, opts, path
    )
    if not written:
        return {"reason": "no_frames"}
    where = placement(width, height, bucket.size)
    return {
        "data": Spilled(path, os.path.getsize(path)),
        "cut": len(kept) < len(plan),
        "bucket": bucket.name,
        "num_frames": written,
        "fps": round(float(rate), 4),
        "original_width": width,
        "original_height": height,
        "original_fps": round(found.fps, 4),
        "original_frames": found.count,
        "resolution": bucket.resolution,
        "aspect": bucket.aspect,
        "aspect_error": round(aspect_error(width, height, bucket.size), 6),
        "crop_share": round(where.crop_share, 6),
        "width": bucket.width,
        "height": bucket.height,
    }


def bucket_image(
    value: Media, buckets: list[table.VideoBucket], opts: dict[str, Any], path: str
) -> dict[str, Any]:
    """An image as a one-frame clip in `path`, in the bucket its upright size fills (module
    docstring); the same fields as bucket_clip's, or {"reason": ...}."""
    import av
    from mmcurate.stages.lib.pixels import failure_reason, open_image, to_rgb, upright

    try:
        with open_image(value) as opened:
            image = to_rgb(upright(opened))
    except Exception as err:  # noqa: BLE001 - Pillow raises many kinds for a bad file
        return {"reason": failure_reason(err)}
    width, height = image.size
    bucket = table.choose_image_bucket(buckets, width, height)
    if bucket is None:
        return {"reason": "below_bucket"}
    where = placement(width, height, bucket.size)
    scaled = image.resize(where.resized, Image.Resampling.BOX)
    box = (where.left, where.top, where.left + bucket.width, where.top + bucket.height)
    pixels = np.asarray(scaled.crop(box))
    with av.open(path, "w", format=CLIP_COLUMN) as out:
        encoder = out.add_stream("libx264", rate=1)
        encoder.width, encoder.height, encoder.pix_fmt = *bucket.size, "yuv420p"
        encoder.options = {"preset": opts["speed"], "crf": str(opts["crf"])}
        out.mux(encoder.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
        out.mux(encoder.encode())
    return {
        "data": Spilled(path, os.path.getsize(path)),
        **{"cut": False, "bucket": bucket.name, "num_frames": 1, "fps": None},
        **{"original_width": width, "original_height": height},
        **{"original_fps": None, "original_frames": 1},
        **{"resolution": bucket.resolution, "aspect": bucket.aspect},
        "aspect_error": round(aspect_error(width, height, bucket.size), 6),
        "crop_share": round(where.crop_share, 6),
        **{"width": bucket.width, "height": bucket.height},
    }


def encode_bucket(
    value: Media,
    rotation: int,
    upright_size: tuple[int, int],
    bucket: tuple[int, int],
    kept: list[int],
    rate: Fraction,
    opts: dict[str, Any],
    path: str,
) -> int:
    """Decode once, keep the frames numbered in `kept`, cover-scale and centre-crop them to
    `bucket`, encode into the mp4 file `path`; the frames written."""
    import av
    from mmcurate.stages.lib.video_decode import upright
    from mmcurate.stages.lib.video_probe import media_source

    where = placement(*upright_size, bucket)
    turned = rotation % 180 == 90  # scale the stored frame to the turned target's sides
    stored = where.resized[::-1] if turned else where.resized
    wanted, last, written = set(kept), kept[-1], 0
    with av.open(media_source(value)) as box, av.open(path, "w", format=CLIP_COLUMN) as out:
        stream = box.streams.video[0]
        stream.codec_context.thread_count = 1
        encoder = out.add_stream("libx264", rate=rate)
        encoder.width, encoder.height, encoder.pix_fmt = *bucket, "yuv420p"
        encoder.options = {"preset": opts["speed"], "crf": str(opts["crf"])}
        for number, frame in enumerate(box.decode(stream)):
            if number in wanted:
                scaled = frame.reformat(stored[0], stored[1], "rgb24", interpolation="AREA")
                pixels = upright(scaled.to_ndarray(), rotation)
                (left, top), (bw, bh) = (where.left, where.top), bucket
                image = av.VideoFrame.from_ndarray(
                    pixels[top : top + bh, left : left + bw].copy(), format="rgb24"
                )
                image.pts, image.time_base = written, 1 / rate
                out.mux(encoder.encode(image))
                written += 1
            if number >= last:
                break
        out.mux(encoder.encode())
    return written

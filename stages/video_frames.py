"""video_frames: sample frames from each video (decord, PyAV fallback), in an isolated process.

Adds frames as `000.jpg`, `001.jpg`, ... (members `<key>.000.jpg`, ...), and to `<key>.json`:
`clip_start`/`clip_end` seconds, `frame_indices`, `frame_timestamps` (seconds), `fps`,
`frame_count`, `width`, `height` (upright, as displayed) and the `decoder` used. Frames of an
earlier pass are replaced, not mixed in. Decoding runs in a child process per
worker with a time limit per video, so a file that hangs or crashes the decoder costs only
itself: `decode_timeout` / `decode_error`.

Videos travel to the child by path (stages/lib/video_child.py).
"""

from __future__ import annotations

import math
from typing import Literal

from mmcurate.core.formats import FRAME_COLUMN, VIDEO_COLUMNS, frame_column, meta_json, sample_meta
from mmcurate.core.spill import Media, release
from mmcurate.stages.base import Columns, Stage, StageOptions, media_column, register
from mmcurate.stages.lib.isolation import Isolated
from mmcurate.stages.lib.video_child import PARENT, clear_columns, decoder_input, isolated_decode
from mmcurate.stages.lib.video_decode import sample_video
from pydantic import Field


class VideoFramesOptions(StageOptions):
    mode: Literal["uniform", "fps", "keyframes"] = "uniform"
    num_frames: int = Field(8, ge=1, le=999, description="uniform: frames per video")
    fps: float = Field(1.0, gt=0, description="fps mode: frames per second")
    size: int = Field(224, ge=8, description="short side of the stored frames (never enlarged)")
    crop: bool = Field(True, description="centre-crop frames to a square")
    quality: int = Field(90, ge=1, le=100)
    timeout_s: float = Field(30.0, gt=0, description="per video, then the decoder is killed")
    keep_video: bool = Field(True, description="keep the video bytes in the sample")


@register
class VideoFrames(Stage):
    name = "video_frames"
    Options = VideoFramesOptions

    def setup(self) -> None:
        self.decoder = Isolated(preload=("mmcurate.stages.lib.video_decode", "decord", "av"))

    def process(self, batch: Columns) -> tuple[Columns, list[str | None]]:
        size = len(batch["__key__"])
        reasons: list[str | None] = [None] * size
        metas = list(batch.get("json") or [None] * size)
        opts = self.options.model_dump()
        for row in range(size):
            col = media_column(batch, row, VIDEO_COLUMNS)
            if col is None:
                reasons[row] = "no_video"
                continue
            result, reasons[row] = self.decode(batch[col][row], opts)
            if result is None:
                continue
            put_frames(batch, row, result.pop("frames"))
            metas[row] = merge_meta(metas[row], result, clip_offset(batch, row, metas[row]))
            if not self.options.keep_video:
                clear_columns(batch, row, VIDEO_COLUMNS)
        batch["json"] = metas
        return batch, reasons

    def decode(self, value: Media, opts: dict) -> tuple[dict | None, str | None]:
        sent, temporary = decoder_input(value)
        try:
            return isolated_decode(self.decoder, sample_video, (sent, opts), self.options.timeout_s)
        finally:
            release(temporary)


def put_frames(batch: Columns, row: int, frames: list[bytes]) -> None:
    """The row's frames, replacing all of an earlier pass (which may have had more)."""
    clear_columns(batch, row, [c for c in batch if FRAME_COLUMN.match(c)])
    for i, frame in enumerate(frames):
        batch.setdefault(frame_column(i), [None] * len(batch["__key__"]))[row] = frame


def clip_offset(batch: Columns, row: int, text: str | None) -> float:
    """Seconds to add to frame times: `clip_start` of a clip that clip_split cut (its rows have
    a parent), which is always a number it wrote. A user's own `clip_start` (a string such as
    "00:00:05.000", null, or a number about a video that was never cut here) is not used."""
    parents = batch.get(PARENT)
    if parents is None or parents[row] is None:
        return 0.0
    start = sample_meta(text).get("clip_start")
    real = isinstance(start, (int, float)) and not isinstance(start, bool)
    return float(start) if real and math.isfinite(start) else 0.0


def merge_meta(text: str | None, result: dict, offset: float = 0.0) -> str:
    """Frame facts into the JSON. For a clip cut by clip_split, `clip_start`/`clip_end` are
    already there and `offset` (its `clip_start`) turns `frame_timestamps` into seconds of the
    source video. A `clip_start` already in the JSON is left as it is."""
    meta = sample_meta(text)
    fps, count = result["fps"], result["frame_count"]
    meta.setdefault("clip_start", 0.0)
    meta.setdefault("clip_end", round(count / fps, 4) if fps else None)
    meta.update(
        {
            "frame_indices": result["indices"],
            "frame_timestamps": [round(offset + t, 4) for t in result["timestamps"]],
            "fps": round(fps, 4),
            "frame_count": count,
            "width": result["width"],
            "height": result["height"],
            "decoder": result["decoder"],
        }
    )
    return meta_json(meta, sort_keys=True)

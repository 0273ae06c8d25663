"""face_blur: find faces (OpenCV Haar cascades shipped in the wheel, stages/lib/faces.py) and blur
them in the stored image, and in a video sample's stored frames, before anything is written.

A picture with no face keeps its bytes exactly; one with faces is re-encoded in its own format
(`quality` for JPEG/WebP; frames are JPEG). Writes into `<key>.json`: `face_count`,
`face_boxes` (normalised [x0, y0, x1, y1], as found, before `margin`; for a video sample one
list per frame), `face_area` (the share of the picture the boxes cover; a video: its largest
over frames) and `face_detector` (`{"name", "version"}`).

A kept video file cannot be blurred here: a video sample that still holds its video bytes is
dropped as `video_not_blurred`, and a config that would always do that (video_frames with
`keep_video: true` before face_blur, or face_blur before video_frames) is refused at config
time (stages/lib/dead_ends.py).

Drops: `too_many_faces` (over `max_faces`), `face_area` (over `max_face_area`), `no_image`,
`video_not_blurred`, `too_many_pixels`, `decode_error`.
"""

from __future__ import annotations

import io
from typing import Any

import cv2
import numpy as np
from mmcurate.core.formats import (
    FRAME_COLUMN,
    IMAGE_COLUMNS,
    VIDEO_COLUMNS,
    meta_json,
    sample_meta,
)
from mmcurate.stages.base import Columns, Stage, StageOptions, media_column, register
from mmcurate.stages.lib.faces import (
    DETECTOR_NAME,
    DetectSettings,
    FaceDetector,
    blur_regions,
    covered_share,
    detector_version,
)
from mmcurate.stages.lib.pixels import DECODE_ERRORS, failure_reason, open_image, to_rgb, upright
from PIL import Image
from pydantic import Field

PIL_FORMATS = {"jpg": "JPEG", "png": "PNG", "webp": "WEBP", "gif": "GIF", "bmp": "BMP"}
PIL_FORMATS |= {"tiff": "TIFF"}
LOSSY = {"JPEG", "WEBP"}


class FaceBlurOptions(StageOptions):
    max_faces: int | None = Field(None, ge=0, description="drop above (too_many_faces)")
    max_face_area: float | None = Field(None, ge=0, le=1, description="drop above (face_area)")
    margin: float = Field(0.3, ge=0, le=2, description="blurred area beyond each box, per side")
    strength: float = Field(0.12, gt=0, le=1, description="finest detail kept, share of a face")
    min_face: float = Field(0.04, gt=0, le=1, description="smallest face, share of short side")
    work_side: int = Field(400, ge=40, le=4096, description="short side searched (downscaled)")
    min_neighbors: int = Field(2, ge=1, description="cascade hits a candidate needs")
    strong_neighbors: int = Field(6, ge=1, description="hits that skip the confirmation")
    confirm: bool = Field(True, description="weaker candidates need a second cascade")
    quality: int = Field(95, ge=1, le=100, description="JPEG/WebP quality of re-encoded media")


@register
class FaceBlur(Stage):
    name = "face_blur"
    Options = FaceBlurOptions
    produces = frozenset({"face_count"})

    def models(self) -> list[dict[str, str]]:
        return [self.model_record(DETECTOR_NAME, "opencv-python-headless")]

    def setup(self) -> None:
        opts = self.options
        cv2.setNumThreads(1)  # Ray runs a task per core
        settings = DetectSettings(
            work_side=opts.work_side,
            min_face=opts.min_face,
            min_neighbors=opts.min_neighbors,
            strong_neighbors=opts.strong_neighbors,
            confirm=opts.confirm,
        )
        self.detector = FaceDetector(settings)
        self.identity = {"name": DETECTOR_NAME, "version": detector_version()}

    def process(self, batch: Columns) -> tuple[Columns, list[str | None]]:
        size = len(batch["__key__"])
        reasons: list[str | None] = [None] * size
        metas = list(batch.get("json") or [None] * size)
        for row in range(size):
            if media_column(batch, row, VIDEO_COLUMNS) is not None:
                reasons[row] = "video_not_blurred"  # its frames could be blurred, not the file
                continue
            found, reasons[row] = self.blur_row(batch, row)
            if found is None:
                continue
            metas[row] = with_fields(metas[row], {**found, "face_detector": self.identity})
            reasons[row] = self.verdict(found["face_count"], found["face_area"])
        batch["json"] = metas
        return batch, reasons

    def blur_row(self, batch: Columns, row: int) -> tuple[dict | None, str | None]:
        """Blur the row's image or frames in place; (json fields, None) or (None, reason)."""
        col = media_column(batch, row, IMAGE_COLUMNS)
        columns = [col] if col is not None else sorted(c for c in batch if FRAME_COLUMN.match(c))
        columns = [c for c in columns if batch[c][row] is not None]
        if not columns:
            return None, "no_image"
        boxes, counts, areas = [], [], []
        for column in columns:
            value, found, area, why = self.blur_one(batch[column][row], column)
            if why is not None:
                return None, why
            batch[column][row] = value
            boxes.append(found)
            counts.append(len(found))
            areas.append(area)
        fields = {"face_count": max(counts), "face_area": round(max(areas), 6)}
        fields["face_boxes"] = boxes[0] if col is not None else boxes
        return fields, None

    def blur_one(self, value: Any, column: str) -> tuple[Any, list, float, str | None]:
        """(value, boxes, covered share, None): the value unchanged when it has no face."""
        try:
            with open_image(value) as image:
                rgb = np.asarray(to_rgb(upright(image)))
        except DECODE_ERRORS as err:
            return value, [], 0.0, failure_reason(err)
        height, width = rgb.shape[:2]
        boxes = self.detector.detect(cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY))
        if len(boxes) == 0:
            return value, [], 0.0, None
        blurred = blur_regions(rgb, boxes, self.options.margin, self.options.strength)
        value = self.encode(blurred, "jpg" if FRAME_COLUMN.match(column) else column)
        scale = np.array([width, height, width, height], np.float64)
        stored = [[round(float(v), 4) for v in box] for box in boxes / scale]
        return value, stored, covered_share(boxes, width, height), None

    def encode(self, rgb: np.ndarray, column: str) -> bytes:
        fmt = PIL_FORMATS.get(column, "PNG")
        out = io.BytesIO()
        extra = {"quality": self.options.quality} if fmt in LOSSY else {}
        Image.fromarray(rgb).save(out, fmt, **extra)
        return out.getvalue()

    def verdict(self, count: int, area: float) -> str | None:
        opts = self.options
        if opts.max_faces is not None and count > opts.max_faces:
            return "too_many_faces"
        if opts.max_face_area is not None and area > opts.max_face_area:
            return "face_area"
        return None


def with_fields(text: str | None, fields: dict) -> str:
    """The sample's json with `fields` set."""
    meta = sample_meta(text)
    meta.update(fields)
    return meta_json(meta, sort_keys=True, ensure_ascii=False)

"""text_area: how much of a picture is text (PP-OCRv4 detector, ONNX, stages/lib/text_detect.py).

Writes into `<key>.json`: `text_area`, the share of the picture covered by the union of the
detected text lines (0..1; boxes grown by `area_unclip_ratio` to fit the ink, words on one
line joined: stages/lib/text_detect.py), and `text_boxes`, the boxes as normalised
[x0, y0, x1, y1] (the largest `max_boxes`). An image sample is its image; a video sample is
its sampled frames (`000.jpg`, ... written by video_frames), or, when it has none yet,
`num_frames` frames this stage decodes itself in an isolated child (as video_frames does,
never stored): its `text_area` is the largest over its frames and `text_boxes` are that frame's.

`recognize: true` also reads the text in the stored boxes (PP-OCRv4 recogniser, same wheel,
stages/lib/text_recognize.py) into `text_lines`: [{"box": [x0, y0, x1, y1], "text": str,
"score": 0..1}, ...] in reading order (top to bottom, left to right), for a video from the same
frame as `text_boxes`; a box read with a score under `text_score` (or as nothing) is left out.

Drops: `text_area` (over `max_area`), `text_area_low` (under `min_area`), `no_image` (no
picture and no video), `too_many_pixels` (from the header, before decoding), `decode_error`,
and for a video decoded here the decoder's reasons (`decode_timeout`, `no_video_stream`, ...).
onnxruntime runs on the CPU with `threads` threads per task (1 by default: Ray runs a task per
core); the model is loaded once per worker, in setup(). Or the detector runs in an actor pool
chosen as for clip_score (`num_gpus`, `concurrency`, `resources`; onnxruntime's CUDA provider
where installed, else its CPU one): the task decodes the pictures and sends them to an actor,
which runs the same `TextDetector.detect`; recognition stays in the task.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
from mmcurate.core.config_io import ConfigError
from mmcurate.core.formats import FRAME_COLUMN, IMAGE_COLUMNS, VIDEO_COLUMNS, meta_json, sample_meta
from mmcurate.core.spill import Media
from mmcurate.stages.base import Columns, ModelStage, PoolOptions, media_column, register
from mmcurate.stages.lib.pixels import DECODE_ERRORS, failure_reason, open_image, to_rgb, upright
from mmcurate.stages.lib.text_detect import (
    DETECTOR_FILE,
    DetectSettings,
    TextDetector,
    model_file,
    union_area,
)
from mmcurate.stages.lib.text_recognize import (
    RECOGNIZER_FILE,
    TextRecognizer,
    crop,
    reading_order,
)
from PIL import Image
from pydantic import Field, model_validator

HIGH_REASON = "text_area"
LOW_REASON = "text_area_low"


class TextAreaOptions(PoolOptions):  # the detector's actor pool
    max_area: float | None = Field(None, ge=0, le=1, description="drop above (text_area)")
    min_area: float | None = Field(None, ge=0, le=1, description="drop below (text_area_low)")
    batch_size: int = Field(1, ge=1, description="pictures per network run (CPU: 1 is best)")
    threads: int = Field(1, ge=0, description="onnxruntime threads per task (0: all cores)")
    short_side: int = Field(736, ge=32, le=4096, description="network input short side")
    max_side: int = Field(2000, ge=32, le=8192, description="network input long side cap")
    thresh: float = Field(0.3, gt=0, lt=1, description="text probability threshold")
    box_thresh: float = Field(0.5, ge=0, le=1, description="a box's mean probability")
    unclip_ratio: float = Field(1.6, ge=0, le=5, description="box growth (DB unclip)")
    area_unclip_ratio: float = Field(
        1.4, ge=0, le=5, description="box growth for the area (ink-tight lines)"
    )
    max_boxes: int = Field(50, ge=0, description="boxes stored in the json (largest first)")
    num_frames: int = Field(4, ge=1, le=64, description="video without frames: frames decoded")
    timeout_s: float = Field(30.0, gt=0, description="per video decoded here")
    recognize: bool = Field(False, description="also recognise the text: text_lines")
    text_score: float = Field(0.5, ge=0, le=1, description="recognize: lines scored under it")

    @property
    def model(self) -> str:  # what the pool's actors are started with (start_pool)
        return "PP-OCRv4 det"

    @property
    def precision(self) -> str:
        return "fp32"

    @model_validator(mode="after")
    def _consistent(self) -> TextAreaOptions:
        if self.min_area is not None and self.max_area is not None:
            if self.min_area > self.max_area:
                raise ValueError(f"min_area {self.min_area} is above max_area {self.max_area}")
        return self


@register
class TextArea(ModelStage):
    name = "text_area"
    Options = TextAreaOptions
    produces = frozenset({"text_area"})

    def models(self) -> list[dict[str, str]]:
        found = [self.model_record("PP-OCRv4 det", "rapidocr-onnxruntime", DETECTOR_FILE)]
        if self.options.recognize:
            found.append(self.model_record("PP-OCRv4 rec", "rapidocr-onnxruntime", RECOGNIZER_FILE))
        return found

    def check(self) -> None:
        try:
            model_file()
            if self.options.recognize:
                model_file(RECOGNIZER_FILE)
        except FileNotFoundError as err:
            raise ConfigError(f"stages.{self.index}: {err}") from None

    def pool_loader(self) -> partial:
        """How an actor of the pool loads the detector (pipeline/runtime/actors.py)."""
        opts = self.options
        return partial(
            TextDetector.on,
            settings=self.settings(),
            threads=opts.threads,
            batch_size=opts.batch_size,
        )

    def settings(self) -> DetectSettings:
        opts = self.options
        return DetectSettings(
            short_side=opts.short_side,
            max_side=opts.max_side,
            thresh=opts.thresh,
            box_thresh=opts.box_thresh,
            unclip_ratio=opts.unclip_ratio,
            area_unclip_ratio=opts.area_unclip_ratio,
        )

    def setup(self) -> None:
        opts = self.options
        # with a pool (a task's copy, given its encoder), the detector is the actors'
        pooled = self.encoder is not None
        self.detector = (
            None if pooled else TextDetector(self.settings(), opts.threads, opts.batch_size)
        )
        self.decoder: Any = None  # started on the first video without frames
        self.recognizer = TextRecognizer(opts.threads) if opts.recognize else None

    def process(self, batch: Columns) -> tuple[Columns, list[str | None]]:
        size = len(batch["__key__"])
        reasons: list[str | None] = [None] * size
        metas = list(batch.get("json") or [None] * size)
        for start in range(0, size, self.options.batch_size):
            rows = range(start, min(size, start + self.options.batch_size))
            flat = [(i, p) for i in rows for p in self.pictures(batch, i, reasons)]
            found = self.detect([p for _, p in flat]) if flat else []
            best: dict[int, tuple[float, np.ndarray, Image.Image]] = {}
            for (i, picture), text in zip(flat, found, strict=True):
                area = round(union_area(text.lines), 6)
                if i not in best or area > best[i][0]:
                    best[i] = (area, self.largest(text.boxes), picture)  # a video: most text
            lines = self.read(best) if self.recognizer is not None else {}
            for i, (area, boxes, _) in best.items():
                fields = {"text_area": area, "text_boxes": rounded(boxes)}
                if self.recognizer is not None:
                    fields["text_lines"] = lines[i]
                metas[i] = with_fields(metas[i], fields)
                reasons[i] = self.verdict(area)
        batch["json"] = metas
        return batch, reasons

    def detect(self, pictures: list[Image.Image]) -> list:
        """The detector's `Found` per picture, in the pool's actors or in this task."""
        if self.encoder is not None:
            return self.encoder.call("detect", pictures)
        return self.detector.detect(pictures)

    def largest(self, boxes: np.ndarray) -> np.ndarray:
        """The largest `max_boxes` boxes (those stored and read)."""
        sizes = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
        return boxes[np.argsort(-sizes, kind="stable")[: self.options.max_boxes]]

    def read(self, best: dict[int, tuple[float, np.ndarray, Image.Image]]) -> dict[int, list]:
        """Each row's recognised lines in reading order: {box, text, score}; lines scored
        under `text_score` (or empty) are left out. All crops of the batch in one call."""
        wanted = [(i, box) for i, (_, boxes, _) in best.items() for box in ordered(boxes)]
        crops = [crop(best[i][2], box) for i, box in wanted]
        lines: dict[int, list] = {i: [] for i in best}
        for (i, box), line in zip(wanted, self.recognizer.recognize(crops), strict=True):
            if line.text.strip() and line.score >= self.options.text_score:
                entry = {"box": rounded(box[None])[0], "text": line.text}
                lines[i].append(entry | {"score": round(line.score, 4)})
        return lines

    def verdict(self, area: float) -> str | None:
        high, low = self.options.max_area, self.options.min_area
        if high is not None and area > high:
            return HIGH_REASON
        if low is not None and area < low:
            return LOW_REASON
        return None

    def pictures(self, batch: Columns, row: int, reasons: list[str | None]) -> list[Image.Image]:
        """The row's decoded RGB pictures (its image, its frames, or frames decoded here);
        [] with `reasons[row]` set when there is none."""
        col = media_column(batch, row, IMAGE_COLUMNS)
        if col is not None:
            values = [batch[col][row]]
        else:
            frames = sorted(c for c in batch if FRAME_COLUMN.match(c))
            values = [batch[c][row] for c in frames if batch[c][row] is not None]
        if not values:
            values, reasons[row] = self.video_frames(batch, row)
            if reasons[row] is not None:
                return []
        pictures = []
        for value in values:
            picture, why = decoded(value)
            if picture is None:
                reasons[row] = why
                return []
            pictures.append(picture)
        return pictures

    def video_frames(self, batch: Columns, row: int) -> tuple[list[bytes], str | None]:
        """Frames of a video sample with none sampled yet, decoded in the isolated child."""
        col = media_column(batch, row, VIDEO_COLUMNS)
        if col is None:
            return [], "no_image"
        from mmcurate.core.spill import release
        from mmcurate.stages.lib.isolation import Isolated
        from mmcurate.stages.lib.video_child import decoder_input, isolated_decode
        from mmcurate.stages.lib.video_decode import sample_video

        if self.decoder is None:
            self.decoder = Isolated(preload=("mmcurate.stages.lib.video_decode", "decord", "av"))
        opts = {"mode": "uniform", "num_frames": self.options.num_frames, "fps": 1.0}
        opts |= {"size": self.options.short_side, "crop": False, "quality": 95}
        sent, temporary = decoder_input(batch[col][row])
        try:
            result, why = isolated_decode(
                self.decoder, sample_video, (sent, opts), self.options.timeout_s
            )
        finally:
            release(temporary)
        return ([], why) if result is None else (result["frames"], None)


def decoded(value: Media) -> tuple[Image.Image | None, str | None]:
    """(upright RGB picture, None), or (None, drop reason): pixels refused from the header."""
    try:
        with open_image(value) as image:
            return to_rgb(upright(image)), None
    except DECODE_ERRORS as err:
        return None, failure_reason(err)


def rounded(boxes: np.ndarray) -> list[list[float]]:
    return [[round(float(v), 4) for v in box] for box in boxes]


def ordered(boxes: np.ndarray) -> np.ndarray:
    return boxes[reading_order(boxes)] if len(boxes) else boxes


def with_fields(text: str | None, fields: dict) -> str:
    """The sample's json with `fields` set (clip_score's helper; not imported: it loads torch)."""
    meta = sample_meta(text)
    meta.update(fields)
    return meta_json(meta, sort_keys=True, ensure_ascii=False)

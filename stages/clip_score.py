"""clip_score: cosine similarity of each image and its caption under an open_clip model.

Per sample (in the partition's Ray task): the image is decoded and transformed on CPU, then
encoded with its caption by the model, either in the task itself (CPU) or in a GPU actor of
the pool the build starts (`num_gpus` per actor, `concurrency` actors). Adds `clip_score`
(also written into `<key>.json`), `embedding` and `text_embedding` (float16; a later
`semantic_dedupe` reuses `embedding`). Filters: `min_score`, `max_score` per sample, and
`keep_top_fraction` as a global decision: exactly ceil(f x N) of the N scored samples that
reach it survive, by score, ties broken by key.

`concepts` (stages/lib/text_prompts.py) score the same image embeddings zero-shot against
prompt sets (watermark, nsfw, text, or your own): each adds `concept_<name>` (0-1, also in
`<key>.json`), and `max`/`min` drop as `concept_<name>`. Prompts are encoded once per task;
no image goes through the model twice.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from mmcurate.core.formats import meta_json
from mmcurate.core.mapreduce import Runner
from mmcurate.core.spill import media_bytes
from mmcurate.stages.base import (
    FRAME_COLUMN,
    Columns,
    ModelOptions,
    ModelStage,
    media_column,
    register,
    sample_meta,
)
from mmcurate.stages.lib.clip_model import ClipModel, cached_model, check_model
from mmcurate.stages.lib.decisions import TopFraction, top_count
from mmcurate.stages.lib.dedupe_common import Decisions, live_rows
from mmcurate.stages.lib.pixels import READ_IMAGE_MAX, too_big
from mmcurate.stages.lib.text_prompts import ConceptOptions, concept_probability, prompt_sets
from pydantic import Field, field_validator, model_validator

TOP_REASON = "below_top_fraction"


class Encoder(Protocol):
    """What scores: a local ClipModel, or the build's handle on a model actor."""

    def prepare(self, images: list[bytes]) -> tuple[list[np.ndarray | None], list[str | None]]: ...

    def encode(self, pixels: np.ndarray, texts: list[str]) -> tuple[np.ndarray, np.ndarray]: ...


class ClipScoreOptions(ModelOptions):
    min_score: float | None = Field(None, description="drop below (LAION: 0.28 with ViT-B/32)")
    max_score: float | None = None
    keep_top_fraction: float | None = Field(None, gt=0, le=1, description="DataComp: 0.3")
    batch_size: int = Field(64, ge=1)
    concepts: dict[str, ConceptOptions] = Field(
        default_factory=dict, description="zero-shot scores: {name: {prompts, against, max, min}}"
    )

    @field_validator("concepts")
    @classmethod
    def _concepts(cls, concepts: dict[str, ConceptOptions]) -> dict[str, ConceptOptions]:
        for name, concept in concepts.items():
            if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
                raise ValueError(f"concept name {name!r}: use lowercase letters, digits, _")
            prompt_sets(name, concept)
        return concepts

    @model_validator(mode="after")
    def _range(self) -> ClipScoreOptions:
        low, high = self.min_score, self.max_score
        if low is not None and high is not None and low > high:
            raise ValueError(f"min_score {low:g} is above max_score {high:g}: nothing would pass")
        return self


class KeepsTopFraction:
    """`keep_top_fraction` for a stage that writes a score column: the global decision keeping
    exactly the top share of the live rows by `top_column`, the rest dropped as `top_reason`
    (listed before the stage's base class, so these override Stage's defaults)."""

    top_column = "clip_score"
    top_reason = TOP_REASON
    options: Any

    def decides(self) -> bool:
        return self.options.keep_top_fraction is not None

    def decide_plan(self) -> TopFraction | None:
        fraction = self.options.keep_top_fraction
        if fraction is None:
            return None
        return TopFraction(self.top_column, fraction, self.top_reason)

    def decide(self, signatures: pa.Table, runner: Runner | None = None) -> Decisions:
        """The whole-table form of the top fraction (the build runs `decide_plan`'s)."""
        fraction = self.options.keep_top_fraction
        live = live_rows(signatures, self.top_column)
        if fraction is None or not live.num_rows:
            return {}
        return top_fraction_decisions(live, fraction, self.top_column, self.top_reason)


@register
class ClipScore(KeepsTopFraction, ModelStage):
    name = "clip_score"
    produces = frozenset({"clip_score", "embedding", "text_embedding"})
    Options = ClipScoreOptions
    is_global = True  # keep_top_fraction decides over the whole dataset
    keeps_blank_captions = False  # a later recaption captions them (set by its bind_clip)

    def check(self) -> None:
        check_model(self.options.model, self.options.pretrained, f"stages.{self.index}")

    def provides(self, column: str) -> bool:
        concepts = {f"concept_{name}" for name in self.options.concepts}
        return column in self.produces or column in concepts

    def local_model(self) -> ClipModel:
        opts = self.options
        return cached_model(opts.model, opts.pretrained, opts.device, opts.precision)

    def process(self, batch: Columns) -> tuple[Columns, list[str | None]]:
        size = len(batch["__key__"])
        reasons: list[str | None] = [None] * size
        media: dict[int, list[bytes]] = {}
        if self.keeps_blank_captions:
            batch.setdefault("txt", [None] * size)  # a source without captions: all blank
        for i in range(size):
            caption = (batch.get("txt") or [None] * size)[i]
            pictures = pictures_of(batch, i)
            if not pictures:
                reasons[i] = "no_image"
            elif (not caption or not caption.strip()) and not self.keeps_blank_captions:
                reasons[i] = "missing_caption"
            elif any(too_big(p, READ_IMAGE_MAX) for p in pictures):
                reasons[i] = "too_big"  # a spilled file: read whole below, so only when sane
            else:
                media[i] = [media_bytes(p) for p in pictures]  # bytes may go to an actor
        encoder = self.encoder or self.local_model()
        good = prepared(encoder, media, reasons)
        scores = self.score_rows(batch, good, encoder)
        blank = [i for i in scores if not (batch["txt"][i] or "").strip()]
        for i, score in scores.items():
            reasons[i] = None if i in blank else self.filter_reason(score)
        if self.options.concepts and scores:
            self.score_concepts(batch, list(scores), encoder, reasons)
        for i in blank:  # no caption, no score: the recaption after this stage writes both
            batch["clip_score"][i] = batch["text_embedding"][i] = None
            batch["json"][i] = with_fields(batch["json"][i], {"clip_score": None})
        return batch, reasons

    def score_concepts(
        self, batch: Columns, rows: list[int], encoder: Encoder, reasons: list[str | None]
    ) -> None:
        """`concept_<name>` for the scored rows, from their image embeddings; thresholds
        drop rows that the score filters kept."""
        size = len(batch["__key__"])
        images = np.stack([batch["embedding"][i] for i in rows]).astype(np.float32)
        metas = batch["json"]
        for name, concept in self.options.concepts.items():
            prompts, against = prompt_sets(name, concept)
            texts = self.prompt_embeddings(name, [*prompts, *against], encoder)
            probability = concept_probability(images, texts, len(prompts))
            column = batch.setdefault(f"concept_{name}", [None] * size)
            for i, value in zip(rows, probability, strict=True):
                column[i] = round(float(value), 6)
                metas[i] = with_fields(metas[i], {f"concept_{name}": column[i]})
                too_high = concept.max is not None and column[i] > concept.max
                too_low = concept.min is not None and column[i] < concept.min
                if reasons[i] is None and (too_high or too_low):
                    reasons[i] = f"concept_{name}"

    def score_rows(self, batch: Columns, good: list, encoder: Encoder) -> dict[int, float]:
        """Encode about `batch_size` pictures at a time; a video's image embedding is the
        normalized mean of its frames'. Writes clip_score, embeddings and the JSON field."""
        size = len(batch["__key__"])
        for column in ("clip_score", "embedding", "text_embedding"):
            batch.setdefault(column, [None] * size)
        metas = list(batch.get("json") or [None] * size)
        scores: dict[int, float] = {}
        for chunk in picture_batches(good, self.options.batch_size):
            pixels = np.stack([p for _, frames in chunk for p in frames])
            image, text = encoder.encode(pixels, [batch["txt"][i] or "" for i, _ in chunk])
            image = mean_per_sample(image, [len(frames) for _, frames in chunk])
            for (i, _), img, txt in zip(chunk, image, text, strict=True):
                score = round(float(np.dot(img, txt)), 6)
                scores[i] = score
                batch["clip_score"][i] = score
                batch["embedding"][i] = img.astype(np.float16)
                batch["text_embedding"][i] = txt.astype(np.float16)
                metas[i] = with_score(metas[i], score)
        batch["json"] = metas
        return scores

    def prompt_embeddings(self, name: str, prompts: list[str], encoder: Encoder) -> np.ndarray:
        """A concept's prompts encoded once per task (this stage object serves one task, or
        a worker's local model, whose embeddings are the same for every batch)."""
        cache = self.__dict__.setdefault("prompt_cache", {})
        if name not in cache:
            cache[name] = encode_texts(encoder, prompts)
        return cache[name]

    def filter_reason(self, score: float) -> str | None:
        opts = self.options
        if opts.min_score is not None and score < opts.min_score:
            return "low_clip_score"
        if opts.max_score is not None and score > opts.max_score:
            return "high_clip_score"
        return None


def pictures_of(batch: Columns, row: int) -> list[bytes]:
    """The image of an image sample, or the sampled frames of a video sample."""
    col = media_column(batch, row)
    if col is not None:
        return [batch[col][row]]
    frames = sorted(c for c in batch if FRAME_COLUMN.match(c))
    return [batch[c][row] for c in frames if batch[c][row] is not None]


def prepared(
    encoder: Encoder, media: dict[int, list[bytes]], reasons: list[str | None]
) -> list[tuple[int, list[np.ndarray]]]:
    """(row, its pictures as model input) for the rows with a decodable picture; a row with
    none gets the first picture's reason (`too_many_pixels` read from the header, before any
    decoding, or `decode_error`)."""
    pixels, why = encoder.prepare([data for pictures in media.values() for data in pictures])
    good, at = [], 0
    for i, pictures in media.items():
        span = slice(at, at + len(pictures))
        at += len(pictures)
        mine = [p for p in pixels[span] if p is not None]
        if mine:
            good.append((i, mine))
        else:
            reasons[i] = next((r for r in why[span] if r), "decode_error")
    return good


def picture_batches(good: list, size: int) -> list[list]:
    """Group samples so each group holds about `size` pictures (at least one sample)."""
    groups, current, count = [], [], 0
    for item in good:
        if current and count + len(item[1]) > size:
            groups.append(current)
            current, count = [], 0
        current.append(item)
        count += len(item[1])
    return groups + ([current] if current else [])


def mean_per_sample(embeddings: np.ndarray, counts: list[int]) -> np.ndarray:
    """Rows grouped by `counts` -> one normalized mean row per group."""
    bounds = np.cumsum([0, *counts])
    spans = zip(bounds[:-1], bounds[1:], strict=True)
    means = np.stack([embeddings[a:b].mean(axis=0) for a, b in spans])
    return means / np.maximum(np.linalg.norm(means, axis=1, keepdims=True), 1e-12)


def with_score(text: str | None, score: float) -> str:
    return with_fields(text, {"clip_score": score})


def with_fields(text: str | None, fields: dict) -> str:
    meta = sample_meta(text)
    meta.update(fields)
    return meta_json(meta, sort_keys=True, ensure_ascii=False)


def encode_texts(encoder: Encoder, texts: list[str]) -> np.ndarray:
    """Normalized text embeddings alone (an empty image batch goes along)."""
    _, embeddings = encoder.encode(np.zeros((0, 1, 1, 3), np.uint8), texts)
    return embeddings


def top_fraction_decisions(
    live: pa.Table, fraction: float, column: str = "clip_score", reason: str = TOP_REASON
) -> Decisions:
    """Keep exactly ceil(fraction x N) by `column`: highest score first, then smallest key
    (any score column: aesthetic_score uses it too)."""
    keep = top_count(fraction, live.num_rows)
    order = pc.sort_indices(
        live.select([column, "__key__"]),
        sort_keys=[(column, "descending"), ("__key__", "ascending")],
    )
    dropped = pc.take(live["__key__"], order[keep:]).to_pylist()
    return {key: (reason, None) for key in dropped}

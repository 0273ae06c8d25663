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

`mask_text: true` (T-MARS) scores each picture with the text boxes a `text_area` stage wrote
into the json masked (`mask_fill`: the picture's mean colour, or a blur), so a caption that only
matches text rendered in the picture no longer scores high.
"""

from __future__ import annotations

import re
from typing import Literal

import numpy as np
from mmcurate.core.formats import sample_meta, with_fields
from mmcurate.stages.base import (
    Columns,
    ModelOptions,
    ModelStage,
    register,
)
from mmcurate.stages.lib.clip_model import ClipModel, cached_model, check_model
from mmcurate.stages.lib.picture_batches import (
    Encoder,
    mask_boxes,
    mean_per_sample,
    picture_batches,
    picture_bytes,
    pictures_of,
    prepared,
)
from mmcurate.stages.lib.text_prompts import ConceptOptions, concept_probability, prompt_sets
from mmcurate.stages.lib.top_fraction import KeepsTopFraction
from pydantic import Field, field_validator, model_validator


class ClipScoreOptions(ModelOptions):
    min_score: float | None = Field(None, description="drop below (LAION: 0.28 with ViT-B/32)")
    max_score: float | None = None
    keep_top_fraction: float | None = Field(None, gt=0, le=1, description="DataComp: 0.3")
    batch_size: int = Field(64, ge=1)
    mask_text: bool = Field(False, description="T-MARS: score with text_area's boxes masked")
    mask_fill: Literal["mean", "blur"] = Field("mean", description="how mask_text masks")
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


@register
class ClipScore(KeepsTopFraction, ModelStage):
    name = "clip_score"
    produces = frozenset({"clip_score", "embedding", "text_embedding"})
    Options = ClipScoreOptions
    is_global = True  # keep_top_fraction decides over the whole dataset
    keeps_blank_captions = False  # a later recaption captions them (set by its bind_clip)

    def models(self) -> list[dict[str, str]]:
        opts = self.options
        return [self.model_record(opts.model, "open_clip_torch", str(opts.pretrained))]

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
            no_caption = not caption or not caption.strip()
            if no_caption and not self.keeps_blank_captions and pictures_of(batch, i):
                reasons[i] = "missing_caption"
                continue
            pictures = picture_bytes(batch, i)
            if isinstance(pictures, str):
                reasons[i] = pictures  # no_image, too_big
            elif self.options.mask_text:
                self.mask(batch, i, pictures, media, reasons)
            else:
                media[i] = pictures
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

    def mask(
        self,
        batch: Columns,
        i: int,
        pictures: list[bytes],
        media: dict[int, list[bytes]],
        reasons: list[str | None],
    ) -> None:
        """Row i's pictures with its text boxes (text_area's `text_boxes` in the json; a video's
        are its frame with most text, applied to every frame) masked; drops as `no_text_boxes`
        when text_area gave none, `decode_error` when a picture does not decode."""
        boxes = sample_meta((batch.get("json") or [None] * len(batch["__key__"]))[i])
        boxes = boxes.get("text_boxes")
        if not isinstance(boxes, list):
            reasons[i] = "no_text_boxes"
            return
        try:
            media[i] = [mask_boxes(p, boxes, self.options.mask_fill) for p in pictures]
        except (OSError, ValueError, TypeError, IndexError):  # PIL's errors for bad pictures
            reasons[i] = "decode_error"

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
                metas[i] = with_fields(metas[i], {"clip_score": score})
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


def encode_texts(encoder: Encoder, texts: list[str]) -> np.ndarray:
    """Normalized text embeddings alone (an empty image batch goes along)."""
    _, embeddings = encoder.encode(np.zeros((0, 1, 1, 3), np.uint8), texts)
    return embeddings

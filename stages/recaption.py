"""recaption: captions from an image-to-text model (BLIP-2 first), the original always kept.

The model is a local Hugging Face folder (stages/lib/captioner.py). Like clip_score it runs
in the partition tasks on CPU, or in an actor pool (`num_gpus`, `concurrency`); the task
decodes and resizes, only uint8 pixels go to an actor. Per sample the json gets
`caption_original`, `captions` (the candidates), `caption_scores` (their CLIP scores, when a
clip_score stage is listed before this one; its model scores them), `caption_source`
(`original` or `synthetic`: which one is now `txt`) and, where no candidate came,
`recaption_fallback` (`no_image`, `decode_error`, `generation_failed`, `too_short`). Both
`caption_source` and `recaption_fallback` are also signature columns (countable in
`signatures/`). Where `txt` changes and scores are known, `clip_score` (column and json) and
`text_embedding` follow the chosen caption; the original's score stays as
`caption_original_score`. Provenance survives repetition: `caption_original` is the caption
the sample came with before its first recaption (a second stage, or a build over recaptioned
shards, keeps it), `caption_source` stays `synthetic` while `txt` is not the original, and
`captions`/`caption_scores` are the newest stage's candidates (replaced ones are not kept).

Samples that came with an empty caption: `best_score` and `fill` caption them (the clip_score
they bind to keeps them, unscored, instead of dropping them as `missing_caption`); the new
caption is scored and must pass that clip_score's bounds, and one that gets no candidate is
dropped here as `missing_caption`.

`choose`: `best_score` (the higher scoring of the original and the candidates, ties to the
original), `fill` (Nguyen et al. 2023: only samples whose original scores below `min_score`
are captioned; the best candidate replaces it if it reaches `min_score`, else the sample is
dropped as `low_clip_score`: one threshold for both), `mix` (a seeded `mix` share of the
samples, by key, gets its best candidate), `synthetic` (every sample), `original` (candidates
stored, `txt` unchanged). Without a candidate a sample keeps its original (in `fill`, that
original then fails the threshold and is dropped as `low_clip_score`).
"""

from __future__ import annotations

import os
from functools import partial
from typing import Any, ClassVar, Literal

import numpy as np
from mmcurate.core.config_io import ConfigError
from mmcurate.core.formats import FRAME_COLUMN, meta_json, sample_meta, with_fields
from mmcurate.stages.base import Columns, ModelStage, TorchPoolOptions, media_column, register
from mmcurate.stages.lib.captioner import (
    Generation,
    RecaptionModel,
    cached_recaption_model,
    caption_seed,
    image_processor,
    prepare_pixels,
)
from mmcurate.stages.lib.captioner_check import check_captioner
from pydantic import Field, model_validator

CHOICES = ("best_score", "fill", "mix", "synthetic", "original")
FILLS_BLANKS = ("best_score", "fill")  # modes that caption a sample that came without one
GENERATION_ERRORS = (RuntimeError, ValueError)  # a batch the model could not caption


class RecaptionOptions(TorchPoolOptions):
    model: str = Field(description="a local Hugging Face folder (BLIP-2 or image-to-text)")
    choose: Literal["best_score", "fill", "mix", "synthetic", "original"] = "best_score"
    mix: float = Field(0.8, gt=0, le=1, description="choose: mix: the synthetic share")
    min_score: float | None = Field(None, description="choose: fill: the one threshold")
    prompt: str | None = None
    max_new_tokens: int = Field(30, ge=1, le=1024)
    num_captions: int = Field(1, ge=1, le=32)
    sample: bool = False
    temperature: float = Field(1.0, gt=0)
    top_k: int | None = Field(None, ge=1)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int = 0
    min_words: int = Field(0, ge=0)
    batch_size: int = Field(16, ge=1)

    @model_validator(mode="after")
    def _consistent(self) -> RecaptionOptions:
        if self.num_captions > 1 and not self.sample:
            raise ValueError("num_captions > 1 needs sample: true (greedy writes one caption)")
        if self.choose == "fill" and self.min_score is None:
            raise ValueError("choose: fill needs min_score (the threshold for both captions)")
        return self

    def generation(self) -> Generation:
        return Generation(
            self.max_new_tokens,
            self.num_captions,
            self.sample,
            self.temperature,
            self.top_k,
            self.top_p,
            self.prompt,
            self.seed,
        )


@register
class Recaption(ModelStage):
    name = "recaption"
    Options = RecaptionOptions
    produces: ClassVar[frozenset[str]] = frozenset({"caption_source", "recaption_fallback"})
    consumes = frozenset({"clip_score", "embedding", "text_embedding"})  # runs after clip_score
    clip: tuple | None = None  # (model, pretrained, precision) of the clip_score before it
    clip_filter: Any = None  # that clip_score's min/max_score test, when it keeps blanks

    def models(self) -> list[dict[str, str]]:
        name = os.path.basename(os.path.normpath(self.options.model))
        return [self.model_record(name, "transformers", self.options.model)]

    def check(self) -> None:
        try:
            check_captioner(self.options.model)
        except ConfigError as err:
            raise ConfigError(f"stages.{self.index}.model: {err}") from None

    def bind_clip(self, clip_stages: list[Any]) -> None:
        """Score with the last clip_score listed before this stage (registry.build_stages).
        best_score and fill caption the samples that came without a caption: that clip_score
        then keeps them (unscored) for this stage instead of dropping them."""
        opts, where = self.options, f"stages.{self.index}.choose"
        clip = clip_stages[-1] if clip_stages else None
        if clip is None and opts.choose in ("best_score", "fill"):
            raise ConfigError(f"{where}: {opts.choose} needs a clip_score stage listed before it")
        if clip is not None and opts.choose == "fill" and clip.options.min_score is not None:
            raise ConfigError(
                f"{where}: fill applies min_score itself; clip_score's min_score would drop "
                "the samples to recaption first (move it to this stage)"
            )
        self.clip = (
            None
            if clip is None
            else (clip.options.model, clip.options.pretrained, clip.options.precision)
        )
        if clip is not None and opts.choose in FILLS_BLANKS:
            clip.keeps_blank_captions = True
            self.clip_filter = clip.filter_reason  # its bounds, for the captions filled here

    def pool_loader(self) -> partial:
        """How an actor of the pool loads this stage's model (pipeline/runtime/actors.py)."""
        opts = self.options
        return partial(RecaptionModel, folder=opts.model, precision=opts.precision, clip=self.clip)

    def call(self, method: str, *args: Any) -> Any:
        """The model's `method`, in the pool's actors or in this task."""
        if self.encoder is not None:
            return self.encoder.call(method, *args)
        opts = self.options
        local = cached_recaption_model(opts.device, opts.model, opts.precision, self.clip)
        return getattr(local, method)(*args)

    def process(self, batch: Columns) -> tuple[Columns, list[str | None]]:
        size = len(batch["__key__"])
        rows = self.rows_to_caption(batch)
        candidates, fallback = self.candidates(batch, rows)
        scores = self.scores(batch, candidates)
        reasons: list[str | None] = [None] * size
        for column in ("caption_source", "recaption_fallback", "txt"):
            batch.setdefault(column, [None] * size)
        batch["json"] = list(batch.get("json") or [None] * size)
        for i in range(size):
            reasons[i] = self.settle(batch, i, candidates.get(i, []), scores.get(i))
            batch["recaption_fallback"][i] = fallback.get(i)
            if i in fallback:
                batch["json"][i] = with_fields(
                    batch["json"][i], {"recaption_fallback": fallback[i]}
                )
        return batch, reasons

    def rows_to_caption(self, batch: Columns) -> list[int]:
        """`fill` captions only what the threshold would drop, `mix` only its share."""
        opts, size = self.options, len(batch["__key__"])
        if opts.choose == "fill":
            scores = batch.get("clip_score") or [None] * size
            return [i for i in range(size) if is_low(scores[i], batch["txt"][i], opts.min_score)]
        if opts.choose == "mix":
            return [i for i in range(size) if mix_share(opts.seed, batch["__key__"][i]) < opts.mix]
        return list(range(size))

    def candidates(
        self, batch: Columns, rows: list[int]
    ) -> tuple[dict[int, list[str]], dict[int, str]]:
        """Captions per row (min_words applied), and why a row got none."""
        opts, gen = self.options, self.options.generation()
        fallback: dict[int, str] = {}
        pictures = {i: picture_of(batch, i) for i in rows}
        fallback.update({i: "no_image" for i, data in pictures.items() if data is None})
        wanted = [i for i in rows if pictures[i] is not None]
        pixels, bad = prepare_pixels([pictures[i] for i in wanted], image_processor(opts.model))
        fallback.update({i: reason for i, reason in zip(wanted, bad, strict=True) if reason})
        ready = [(i, p) for i, p in zip(wanted, pixels, strict=True) if p is not None]
        found: dict[int, list[str]] = {}
        for at in range(0, len(ready), opts.batch_size):
            chunk = ready[at : at + opts.batch_size]
            keys = [batch["__key__"][i] for i, _ in chunk]
            seeds = [caption_seed(gen.seed, k, j) for k in keys for j in range(gen.num_captions)]
            try:
                texts = self.call("caption", [p for _, p in chunk], gen, seeds)
            except GENERATION_ERRORS:
                fallback.update({i: "generation_failed" for i, _ in chunk})
                continue
            for (i, _), captions in zip(chunk, texts, strict=True):
                kept = [c for c in captions if c and len(c.split()) >= max(opts.min_words, 1)]
                if kept:
                    found[i] = kept
                else:
                    fallback[i] = "too_short"
        return found, fallback

    def scores(self, batch: Columns, candidates: dict[int, list[str]]) -> dict[int, tuple]:
        """Per row: (the original's score, the candidates' scores, their text embeddings),
        all from float16 embeddings like the ones clip_score stores; rows without: none."""
        if self.clip is None or not candidates or "embedding" not in batch:
            return {}
        rows = [i for i in candidates if batch["embedding"][i] is not None]
        flat = [c for i in rows for c in candidates[i]]
        texts = np.asarray(self.call("texts", flat), np.float32).astype(np.float16) if flat else []
        found, at = {}, 0
        for i in rows:
            image = np.asarray(batch["embedding"][i], np.float32)
            mine = texts[at : at + len(candidates[i])]
            at += len(candidates[i])
            values = [round(float(np.dot(image, t.astype(np.float32))), 6) for t in mine]
            own = batch["text_embedding"][i]  # None: the sample came without a caption
            own_score = None if own is None else np.dot(image, np.asarray(own, np.float32))
            found[i] = (None if own is None else round(float(own_score), 6), values, mine)
        return found

    def settle(self, batch: Columns, i: int, captions: list[str], scored: tuple | None) -> Any:
        """Choose row i's caption and write its fields; returns a drop reason or None."""
        opts = self.options
        pick = best_candidate(captions, scored)
        synthetic = pick is not None and opts.choose != "original"
        if opts.choose == "best_score":  # an uncaptioned original (score None) always loses
            synthetic = synthetic and scored is not None and beats(scored[1][pick], scored[0])
        if opts.choose == "fill":  # one threshold: the candidate must pass it too
            synthetic = synthetic and scored is not None and scored[1][pick] >= opts.min_score
        current = batch["clip_score"][i] if "clip_score" in batch else None
        low = is_low(current, batch["txt"][i], opts.min_score)
        blank = is_blank(batch["txt"][i])
        meta = sample_meta(batch["json"][i])
        replaced = meta.get("caption_source") or "original"  # what txt holds now
        if meta.get("caption_original") is None:  # null: a build's json fill of absent keys
            meta["caption_original"] = batch["txt"][i]  # the first original, kept after
        meta["captions"] = captions
        meta.pop("caption_scores", None)  # the candidates are this stage's; so their scores
        if scored is not None:
            meta["caption_scores"] = scored[1]
        if synthetic:
            batch["txt"][i] = captions[pick]
            if scored is not None:
                if replaced == "original":
                    meta["caption_original_score"] = batch["clip_score"][i]
                meta["clip_score"] = batch["clip_score"][i] = scored[1][pick]
                batch["text_embedding"][i] = scored[2][pick]
        source = "synthetic" if synthetic else replaced
        meta["caption_source"] = batch["caption_source"][i] = source
        batch["json"][i] = meta_json(meta, sort_keys=True, ensure_ascii=False)
        if opts.choose == "fill" and low and not synthetic:
            return "low_clip_score"
        if opts.choose in FILLS_BLANKS and blank:
            if not synthetic:
                return "missing_caption"  # what clip_score would have dropped it for
            if self.clip_filter is not None:
                return self.clip_filter(batch["clip_score"][i])
        return None


def best_candidate(captions: list[str], scored: tuple | None) -> int | None:
    """The candidate to use: the highest scoring (first of ties), or the first unscored."""
    if not captions:
        return None
    if scored is None:
        return 0
    return int(np.argmax(scored[1]))


def is_blank(caption: str | None) -> bool:
    return not caption or not caption.strip()


def is_low(score: float | None, caption: str | None, threshold: float | None) -> bool:
    """fill's test: below the threshold, or no caption at all (kept unscored by clip_score)."""
    if score is None:
        return is_blank(caption)
    return threshold is not None and score < threshold


def beats(candidate: float, original: float | None) -> bool:
    return original is None or candidate > original


def mix_share(seed: int, key: str) -> float:
    """A key's fixed place in [0, 1): `mix` of the keys fall below `mix`."""
    return caption_seed(seed, key, -1) / 2**63


def picture_of(batch: Columns, row: int) -> bytes | None:
    """The image of an image sample, or the first sampled frame of a video sample."""
    col = media_column(batch, row)
    if col is not None:
        return batch[col][row]
    frames = sorted(c for c in batch if FRAME_COLUMN.match(c) and batch[c][row] is not None)
    return batch[frames[0]][row] if frames else None

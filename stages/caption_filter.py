"""caption_filter: drop samples whose caption is missing, empty, too short or too long."""

from __future__ import annotations

from pydantic import Field, model_validator

from stages.base import Columns, Stage, StageOptions, register


class CaptionFilterOptions(StageOptions):
    min_words: int = Field(1, ge=0, description="Fewer words than this: `too_few_words`.")
    max_words: int | None = Field(None, gt=0, description="More words: `too_many_words`.")
    max_chars: int | None = Field(None, gt=0, description="Longer captions: `too_long`.")
    strip: bool = Field(True, description="Strip surrounding whitespace from kept captions.")

    @model_validator(mode="after")
    def _bounds(self) -> CaptionFilterOptions:
        if self.max_words is not None and self.max_words < self.min_words:
            raise ValueError("max_words must be >= min_words")
        return self


def caption_reason(caption: str | None, opts: CaptionFilterOptions) -> str | None:
    if caption is None:
        return "missing_caption"
    if opts.max_chars is not None and len(caption) > opts.max_chars:
        return "too_long"
    words = caption.split()
    if not words:
        return "empty_caption"
    if len(words) < opts.min_words:
        return "too_few_words"
    if opts.max_words is not None and len(words) > opts.max_words:
        return "too_many_words"
    return None


@register
class CaptionFilter(Stage):
    name = "caption_filter"
    Options = CaptionFilterOptions

    def process(self, batch: Columns) -> tuple[Columns, list[str | None]]:
        captions = batch.get("txt") or [None] * len(batch["__key__"])
        reasons = [caption_reason(c, self.options) for c in captions]
        if self.options.strip:
            batch["txt"] = [c.strip() if c is not None else None for c in captions]
        return batch, reasons

"""caption_filter: drop samples whose caption is missing, empty, too short or too long, or (when
turned on) alt-text boilerplate, mostly non-letters, repeated-token spam or blocklisted.

Words are counted for every script (stages/lib/text_count.py): space-separated words, and for
Chinese and Japanese characters turned into word-equivalents (1.5 Chinese, 2.0 Japanese
characters per word, measured on parallel captions), so `min_words: 3` means the same in
"an orange cat on a sofa", "一只橘猫在沙发上" and mixed captions; the other scripts written
without spaces (Thai, Lao, Khmer, Burmese, Tibetan, ...) by their base characters, 3.2 per word
(the Thai National Corpus's mean word length). Lengths in characters are those of the caption
as stored (stripped when `strip` is on). The hygiene rules live in stages/lib/text_rules.py;
each has its own drop reason.
"""

from __future__ import annotations

from mmcurate.stages.base import Columns, Stage, StageOptions, register
from mmcurate.stages.lib.text_count import (
    JA_CHARS_PER_WORD,
    UNSPACED_CHARS_PER_WORD,
    ZH_CHARS_PER_WORD,
    word_count,
)
from mmcurate.stages.lib.text_rules import (
    Blocklist,
    blocklist,
    letter_fraction,
    placeholder_reason,
    repeated_fraction,
    tokens,
)
from pydantic import Field, model_validator


class CaptionFilterOptions(StageOptions):
    min_words: int = Field(1, ge=0, description="Fewer words than this: `too_few_words`.")
    max_words: int | None = Field(None, gt=0, description="More words: `too_many_words`.")
    max_chars: int | None = Field(
        None, gt=0, description="Longer captions, as stored (stripped if `strip`): `too_long`."
    )
    strip: bool = Field(True, description="Strip surrounding whitespace from kept captions.")
    zh_chars_per_word: float = Field(ZH_CHARS_PER_WORD, gt=0, description="1: count characters")
    ja_chars_per_word: float = Field(JA_CHARS_PER_WORD, gt=0, description="captions with kana")
    unspaced_chars_per_word: float = Field(
        UNSPACED_CHARS_PER_WORD, gt=0, description="Thai, Lao, Khmer, Burmese, ... base characters"
    )
    placeholders: bool = Field(
        False, description="drop `placeholder_caption`, `filename_caption`, `url_caption`"
    )
    min_letter_fraction: float | None = Field(
        None, ge=0, le=1, description="letters (any script) / non-space chars: `mostly_non_letters`"
    )
    max_repeated_fraction: float | None = Field(
        None, ge=0, lt=1, description="tokens repeating an earlier one: `repeated_tokens`"
    )
    min_tokens_for_repeats: int = Field(4, ge=2, description="shorter captions are not checked")
    blocklist: tuple[str, ...] = Field((), description="words or phrases: `blocklisted`")

    @model_validator(mode="after")
    def _bounds(self) -> CaptionFilterOptions:
        if self.max_words is not None and self.max_words < self.min_words:
            raise ValueError("max_words must be >= min_words")
        return self


def caption_reason(
    caption: str | None, opts: CaptionFilterOptions, blocked: Blocklist | None = None
) -> str | None:
    """The first rule `caption` breaks, or None. `blocked` is the compiled blocklist."""
    if caption is None:
        return "missing_caption"
    stored = caption.strip() if opts.strip else caption
    if opts.max_chars is not None and len(stored) > opts.max_chars:
        return "too_long"
    if not caption.strip():
        return "empty_caption"
    reason = hygiene_reason(caption, opts, blocked)
    if reason is not None:
        return reason
    words = word_count(
        caption, opts.zh_chars_per_word, opts.ja_chars_per_word, opts.unspaced_chars_per_word
    )
    if words == 0:
        return "empty_caption"
    if words < opts.min_words:
        return "too_few_words"
    if opts.max_words is not None and words > opts.max_words:
        return "too_many_words"
    return None


def hygiene_reason(
    caption: str, opts: CaptionFilterOptions, blocked: Blocklist | None
) -> str | None:
    if opts.placeholders:
        reason = placeholder_reason(caption)
        if reason is not None:
            return reason
    if blocked is not None and blocked.matches(caption):
        return "blocklisted"
    if opts.min_letter_fraction is not None and letter_fraction(caption) < opts.min_letter_fraction:
        return "mostly_non_letters"
    limit = opts.max_repeated_fraction
    if limit is not None and len(tokens(caption)) >= opts.min_tokens_for_repeats:
        if repeated_fraction(caption) > limit:
            return "repeated_tokens"
    return None


@register
class CaptionFilter(Stage):
    name = "caption_filter"
    Options = CaptionFilterOptions

    def setup(self) -> None:
        self.blocked = blocklist(self.options.blocklist)

    def process(self, batch: Columns) -> tuple[Columns, list[str | None]]:
        captions = batch.get("txt") or [None] * len(batch["__key__"])
        blocked = getattr(self, "blocked", None)
        reasons = [caption_reason(c, self.options, blocked) for c in captions]
        if self.options.strip:
            batch["txt"] = [c.strip() if c is not None else None for c in captions]
        return batch, reasons

"""Caption hygiene rules: alt-text that says nothing (placeholders, file names, URLs), captions
that are mostly not letters, repeated-token spam, and a blocklist. Each rule returns its drop
reason or None; `caption_filter` applies the ones a config turns on."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

from mmcurate.stages.lib.text_count import NO_SPACES, tokens

# Whole captions that are a generic word (alt-text boilerplate), after casefolding and
# stripping surrounding punctuation and a trailing number ("image 3", "untitled-1").
PLACEHOLDER_PHRASES = frozenset(
    [
        "image",
        "images",
        "img",
        "photo",
        "photos",
        "picture",
        "pic",
        "pics",
        "untitled",
        "untitled image",
        "no title",
        "title",
        "default",
        "thumbnail",
        "thumb",
        "null",
        "none",
        "n/a",
        "na",
        "nan",
        "undefined",
        "placeholder",
        "screenshot",
        "unknown",
        "logo",
        "icon",
        "banner",
        "file",
        "attachment",
        "download",
        "click here",
        "alt",
        "alt text",
        "caption",
        "description",
        "no description",
        "image not found",
        "photo not available",
        "no image",
        "no photo",
        "image unavailable",
        "图片",
        "图像",
        "照片",
        "无标题",
        "暂无图片",
        "画像",
        "写真",
        "無題",
        "이미지",
        "사진",
        "bild",
        "foto",
        "imagen",
    ]
)
MAX_PLACEHOLDER_CHARS = 2048  # longer alt-text is no placeholder, file name or URL (and the
# patterns below would cost quadratic time on a long run of digits or dots)
# Camera and phone file stems: IMG_1234, DSC01234, DSCN0042, P1010023, PXL_20230101_120000,
# IMG-20190101-WA0001, VID_..., Screenshot_2020-...
CAMERA_STEM = re.compile(
    r"^(?:img|dsc[nf]?|dcim|p|pxl|mvimg|vid|screenshot|scan|photo|image|pic)"
    r"[_\-\s]?\d[\w\-]*$",
    re.IGNORECASE,
)
FILE_EXT = (
    "jpg|jpeg|png|gif|webp|bmp|tif|tiff|heic|heif|svg|avif|ico|raw|cr2|nef|psd|"
    "mp4|mov|avi|mkv|webm|pdf|html?|php|aspx?"
)
FILENAME = re.compile(rf"^\S+\.(?:{FILE_EXT})(?:\?\S*)?$", re.IGNORECASE)
URL = re.compile(
    r"^(?:(?:https?|ftp)://\S+|www\.\S+|[\w\-]+(?:\.[\w\-]+)*\.[a-z]{2,}/\S*|"
    r"[\w\-]+(?:\.[\w\-]+)*\.(?:com|net|org|io|co|de|cn|jp|uk|ru|info|biz)/?)$",
    re.IGNORECASE,
)
WORD_CHAR = re.compile(r"\w")
WORD_RUN = re.compile(r"\w+")
EDGE_PUNCT = " \t\n\"'`.,:;!?()[]{}<>«»“”‘’「」『』【】。，：；！？"


def normalized(caption: str) -> str:
    return " ".join(caption.casefold().strip(EDGE_PUNCT).split())


def without_trailing_number(text: str) -> str:
    """`text` without a trailing number and the separators before it ("image (3)" -> "image",
    "photo_0042" -> "photo"); unchanged when it does not end in digits. Linear time."""
    body = text[:-1] if text.endswith(")") else text
    end = len(body)
    while end and body[end - 1].isdecimal():
        end -= 1
    if end == len(body):
        return text
    while end and (body[end - 1].isspace() or body[end - 1] in "_#-("):
        end -= 1
    return body[:end]


def placeholder_reason(caption: str) -> str | None:
    """`url_caption`, `filename_caption` or `placeholder_caption` for alt-text that only
    names the file or says "image"; None otherwise."""
    text = caption.strip()
    if len(text) > MAX_PLACEHOLDER_CHARS:
        return None
    if URL.match(text):
        return "url_caption"
    if FILENAME.match(text):
        return "filename_caption"
    norm = normalized(text)
    if norm in PLACEHOLDER_PHRASES or CAMERA_STEM.match(norm):
        return "placeholder_caption"
    if without_trailing_number(norm).strip(EDGE_PUNCT) in PLACEHOLDER_PHRASES:
        return "placeholder_caption"
    return None


def letter_fraction(caption: str) -> float:
    """Letters (any script: Latin, Han, kana, Hangul, Cyrillic, ...) among the caption's
    non-space characters."""
    chars = [ch for ch in caption if not ch.isspace()]
    if not chars:
        return 0.0
    letters = sum(1 for ch in chars if unicodedata.category(ch).startswith(("L", "M")))
    return letters / len(chars)


def repeated_fraction(caption: str) -> float:
    """Share of tokens (words; single characters for Chinese and Japanese) that repeat an
    earlier one: "cat cat cat cat" 0.75, "the cat and the dog" 0.2."""
    units = tokens(caption)
    return 1.0 - len(set(units)) / len(units) if units else 0.0


class Blocklist:
    """Words and phrases to drop captions for, matched case-insensitively with any run of
    whitespace as one space (term and caption alike). A term in a script written without
    spaces (CJK, Thai, Khmer, ...: `NO_SPACES`) matches anywhere as a substring; any other term
    only as whole words: not preceded or followed by a word character (`\\w`), as the pattern
    `(?<!\\w)term(?!\\w)` would find it.

    A term that begins and ends with a word character can only match from the start of a run
    of word characters to the end of one, spanning as many runs as it holds itself; so those
    terms are looked up in a set, one slice of the caption per run and run count, in time
    linear in the caption whatever the number of terms. The few others (beginning or ending
    with punctuation, such as "c++" or "#ad") keep that pattern."""

    def __init__(self, terms: Iterable[str]) -> None:
        self.substrings: list[str] = []
        self.by_runs: dict[int, set[str]] = {}  # word-run count -> terms
        self.longest: dict[int, int] = {}  # word-run count -> longest term's length
        others = []
        for term in terms:
            norm = " ".join(term.casefold().split())
            if not norm:
                continue
            if NO_SPACES.search(term):
                self.substrings.append(norm)
            elif WORD_CHAR.match(norm[0]) and WORD_CHAR.match(norm[-1]):
                runs = len(WORD_RUN.findall(norm))
                self.by_runs.setdefault(runs, set()).add(norm)
                self.longest[runs] = max(self.longest.get(runs, 0), len(norm))
            else:
                others.append(rf"(?<!\w){re.escape(norm)}(?!\w)")
        self.others = re.compile("|".join(others)) if others else None

    def __bool__(self) -> bool:
        return bool(self.substrings or self.by_runs or self.others)

    def matches(self, caption: str) -> bool:
        text = " ".join(caption.casefold().split())
        if any(term in text for term in self.substrings):
            return True
        if self.others is not None and self.others.search(text):
            return True
        return self.matches_whole_words(text) if self.by_runs else False

    def matches_whole_words(self, text: str) -> bool:
        """Whether a slice of `text` from the start of a word run to the end of a later one
        (or the same) is a term with that many runs."""
        spans = [m.span() for m in WORD_RUN.finditer(text)]
        for runs, terms in self.by_runs.items():
            longest = self.longest[runs]
            for first in range(len(spans) - runs + 1):
                start, end = spans[first][0], spans[first + runs - 1][1]
                if end - start <= longest and text[start:end] in terms:
                    return True
        return False


def blocklist(terms: Iterable[str]) -> Blocklist | None:
    """The compiled blocklist, or None when it holds no term."""
    compiled = Blocklist(terms)
    return compiled if compiled else None

"""The sample batch every source produces: fixed columns, keys, captions."""

from __future__ import annotations

import re
from typing import Any

from stages.base import DROP, DROP_STAGE, IMAGE_COLUMNS, VIDEO_COLUMNS, Columns

BASE_COLUMNS = (
    "__key__",
    "__part__",
    "__index__",
    "__source__",
    "txt",
    "json",
    "cls",  # a class label member (ImageNet-style WebDatasets): carried as written
    "url",
    DROP,
    DROP_STAGE,
)
SOURCE = "source"  # the __drop_stage__ of samples rejected while reading


def empty_batch() -> Columns:
    return {col: [] for col in (*BASE_COLUMNS, *IMAGE_COLUMNS, *VIDEO_COLUMNS)}


def append_sample(batch: Columns, sample: dict[str, Any]) -> None:
    for col, values in batch.items():
        values.append(sample.get(col))


def sanitize_key(text: str) -> str:
    """Keys may not contain dots (WebDataset splits on them) or path separators."""
    return re.sub(r"[^A-Za-z0-9_\-]", "_", text)


def decode_caption(data: bytes | None) -> tuple[str | None, str | None]:
    """(caption, drop reason): captions must be UTF-8 (a leading byte-order mark, which some
    editors write, is not part of the caption)."""
    if data is None:
        return None, None
    try:
        return data.decode("utf-8-sig"), None
    except UnicodeDecodeError:
        return None, "caption_not_utf8"

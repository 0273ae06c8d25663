"""The sample batch every source produces: fixed columns, keys, captions."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from mmcurate.core.formats import IMAGE_COLUMNS, VIDEO_COLUMNS
from mmcurate.core.spill import Spilled
from mmcurate.stages.base import DROP, DROP_STAGE, Columns

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


@dataclass(frozen=True)
class Reading:
    """How a task reads its partition: chunks of at most `batch_size` samples and about
    `chunk_bytes` bytes held in memory (None: no bound); media files or members above
    `spill_bytes` kept on disk in `folder` (None: never; then everything is read whole)."""

    batch_size: int = 64
    chunk_bytes: int | None = None
    spill_bytes: int | None = None
    folder: str | None = None

    def spills(self, size: int | None) -> bool:
        return self.spill_bytes is not None and size is not None and size > self.spill_bytes


WHOLE = Reading(batch_size=1 << 62)  # one chunk, nothing spilled: a partition read whole


def held_bytes(sample: dict[str, Any]) -> int:
    """Bytes of a sample's values held in memory (a Spilled file counts nothing)."""
    return sum(
        len(value) for value in sample.values() if isinstance(value, bytes | bytearray | str)
    )


class Chunker:
    """Samples gathered into chunks (batches) of `reading.batch_size` samples or about
    `reading.chunk_bytes` bytes, whichever comes first; `count` samples so far in all."""

    def __init__(self, reading: Reading) -> None:
        self.reading, self.count = reading, 0
        self.batch, self.rows, self.bytes = empty_batch(), 0, 0

    def add(self, sample: dict[str, Any]) -> bool:
        """Append a sample; True when the chunk is full (`take` it)."""
        append_sample(self.batch, sample)
        self.count, self.rows = self.count + 1, self.rows + 1
        self.bytes += held_bytes(sample)
        limit = self.reading.chunk_bytes
        return self.rows >= self.reading.batch_size or (limit is not None and self.bytes >= limit)

    def take(self) -> Columns:
        batch, self.batch, self.rows, self.bytes = self.batch, empty_batch(), 0, 0
        return batch

    def feed(self, samples: Iterable[dict[str, Any]]) -> Iterator[Columns]:
        """Full chunks as `samples` fill them (the last, partial one stays: `rest`)."""
        for sample in samples:
            if self.add(sample):
                yield self.take()

    def rest(self) -> Iterator[Columns]:
        if self.rows:
            yield self.take()


def whole_batch(chunks: Iterable[Columns]) -> Columns:
    """Chunks joined into one batch (a partition read whole, as callers outside a build
    see it)."""
    batch = empty_batch()
    for chunk in chunks:
        for col, values in chunk.items():
            batch.setdefault(col, []).extend(values)
    return batch


def spilled_in(batch: Columns) -> list[Spilled]:
    """The Spilled values of a batch (to release once it is written)."""
    return [v for values in batch.values() for v in values if isinstance(v, Spilled)]

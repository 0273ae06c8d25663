"""Streamed uploads to object stores: the store's buffered multipart file, written through as
the data comes (core.atomic.open_atomic), never spooled whole to a local file first."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import IO, Any

MULTIPART_PROTOCOLS = {"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az"}
UPLOAD_PART_BYTES = 16 << 20  # first part size: the most a streamed upload buffers in memory
PARTS_PER_DOUBLING = 1_000  # then doubled every 1,000 parts (S3 allows 10,000: up to ~16 TB)


def streams_uploads(fs: Any) -> bool:
    """Whether `fs` writes through a buffered multipart file (an object only on completion)."""
    protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return bool(MULTIPART_PROTOCOLS & set(protocols))


@contextlib.contextmanager
def streamed_upload(fs: Any, path: str) -> Iterator[IO[bytes]]:
    """The store's buffered write file: each part is uploaded as it fills (a failed part is
    retried by the client), the object appears only when close completes the upload; if the
    block raises, the upload is discarded (S3: aborted) and nothing is published."""
    target = fs.open(path, "wb", block_size=UPLOAD_PART_BYTES)
    out = GrowingParts(target)
    try:
        yield out  # type: ignore[misc]
    except BaseException:
        with contextlib.suppress(Exception):  # the block's own error is the one to raise
            target.discard()
        target.closed = True  # never flushed or completed, not even by its finalizer
        raise
    try:
        target.close()  # the last part, then the completion: the object appears now
    except BaseException:
        with contextlib.suppress(Exception):
            target.discard()  # a completion that failed leaves no upload behind
        raise


class GrowingParts:
    """A writer over a multipart file that doubles its part size every `PARTS_PER_DOUBLING`
    parts, so an object of unknown size never runs out of parts (S3: 10,000 at most)."""

    def __init__(self, target: Any) -> None:
        self.target = target
        self.doubles_at = PARTS_PER_DOUBLING

    def write(self, data: Any) -> int:
        written = self.target.write(data)
        if len(getattr(self.target, "parts", None) or ()) >= self.doubles_at:
            self.target.blocksize *= 2
            self.doubles_at += PARTS_PER_DOUBLING
        return written

    def __getattr__(self, name: str) -> Any:
        return getattr(self.target, name)

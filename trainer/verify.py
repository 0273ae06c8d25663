"""A shard's bytes checked against its manifest entry (size and sha256) before any sample of
it is used: by the node's shard cache (trainer/cache.py) and when streaming without one.

Streaming verifies before it yields: a remote shard is copied, hashed as its bytes pass, into a
spool (memory up to SPOOL_BYTES, then a temporary file under TMPDIR) and read from there once
it matches; a local shard is hashed in place and then read again (from the page cache). Every
check covers the whole shard from its first byte, so a run that starts or stops mid-shard (a
resume, a weighted piece) is verified too, at the cost of reading the bytes it skips.
"""

from __future__ import annotations

import contextlib
import hashlib
import lzma
import tarfile
import tempfile
import zlib
from collections.abc import Iterator
from typing import IO, Any

import fsspec

from core.storage import protocol_of, storage_errors, with_retries

RETRIES = 2  # downloads again after a mismatch (the bytes may have been damaged in transit)
CHUNK = 8 << 20
SPOOL_BYTES = 256 << 20  # a streamed shard kept in memory up to this size; larger spill to disk


class ShardCorrupt(RuntimeError):
    """A shard whose bytes are not the ones its manifest names (size or sha256)."""


def mismatch(sha256: str | None, size: int | None, digest: str, length: int) -> str | None:
    """Why bytes of this sha256 and length are not the manifest's shard; None when they are."""
    if size is not None and length != size:
        return f"{length} bytes where the manifest says {size}"
    if sha256 and digest != sha256:
        return f"sha256 {digest[:16]}... differs from the manifest's {sha256[:16]}..."
    return None


def copy_hashed(src: IO[bytes], dst: IO[bytes] | None) -> tuple[str, int]:
    """(sha256, bytes) of the rest of `src`, written on to `dst` when given."""
    digest, length = hashlib.sha256(), 0
    while chunk := src.read(CHUNK):
        digest.update(chunk)
        length += len(chunk)
        if dst is not None:
            dst.write(chunk)
    return digest.hexdigest(), length


def download_hashed(url: str, dst: IO[bytes], storage_options: dict[str, Any]) -> tuple[str, int]:
    """Copy the object at `url` into `dst` (from its start, retrying transient errors)."""

    def attempt() -> tuple[str, int]:
        dst.seek(0)
        dst.truncate()
        with fsspec.open(url, "rb", **storage_options) as src:
            return copy_hashed(src, dst)

    return with_retries(attempt)


@contextlib.contextmanager
def open_verified(
    url: str, sha256: str | None, size: int | None, storage_options: dict[str, Any]
) -> Iterator[IO[bytes]]:
    """The shard opened for reading, once its bytes match the manifest; ShardCorrupt when
    they do not (a remote one after RETRIES more downloads, as the cache does)."""
    if protocol_of(url) == "file":
        with open(url.removeprefix("file://"), "rb") as f:
            problem = mismatch(sha256, size, *copy_hashed(f, None))
            if problem:
                raise ShardCorrupt(f"{url}: {problem}")
            f.seek(0)
            yield f
        return
    problem = None
    for _ in range(RETRIES + 1):
        with tempfile.SpooledTemporaryFile(SPOOL_BYTES, prefix="mmcurate-shard-") as spool:
            problem = mismatch(sha256, size, *download_hashed(url, spool, storage_options))
            if problem is None:
                spool.seek(0)
                yield spool
                return
    raise ShardCorrupt(f"{url}: {problem} (downloaded {RETRIES + 1} times)")


def read_errors() -> tuple[type[BaseException], ...]:
    """What reading a shard may raise when the shard, not the code, is at fault: a mismatch,
    storage errors (gone, denied, connection), and a damaged tar (or a compressed one)."""
    damaged = (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, UnicodeDecodeError)
    return (ShardCorrupt, *storage_errors(), *damaged)

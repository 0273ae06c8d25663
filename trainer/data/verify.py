"""A shard's bytes checked against its manifest entry (size and sha256) before any sample of
it is used: by the node's shard cache (trainer/data/cache.py) and when streaming without one.

Streaming verifies as the bytes pass: a remote shard is hashed while its tar is parsed
(`HashedStream`), its samples held by the reader (trainer/data/reader.py: in memory up to a byte
limit, then on local disk, only the members training uses) until the stream has ended and
matched; a local shard is hashed in place and then read again (from the page cache). Every
check covers the whole shard from its first byte, so a run that starts or stops mid-shard (a
resume, a weighted piece) is verified too, at the cost of reading the bytes it skips.
"""

from __future__ import annotations

import contextlib
import hashlib
import lzma
import tarfile
import zlib
from collections.abc import Iterator
from typing import IO, Any

import fsspec
from mmcurate.core.storage import protocol_of, storage_errors, with_retries

RETRIES = 2  # downloads again after a mismatch (the bytes may have been damaged in transit)
CHUNK = 8 << 20


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
    """A local shard opened for reading, once its bytes match the manifest (ShardCorrupt when
    they do not); a remote one opened as a `HashedStream` (call its `check` at the end)."""
    if protocol_of(url) != "file":
        with fsspec.open(url, "rb", **storage_options) as raw:
            yield HashedStream(raw, url, sha256, size)
        return
    with open(url.removeprefix("file://"), "rb") as f:
        problem = mismatch(sha256, size, *copy_hashed(f, None))
        if problem:
            raise ShardCorrupt(f"{url}: {problem}")
        f.seek(0)
        yield f


class HashedStream:
    """A shard's byte stream that hashes and counts what is read through it; `check` reads
    the rest and raises ShardCorrupt when the whole is not the manifest's shard. Reading past
    the manifest's size fails at once (no point parsing bytes that cannot match)."""

    def __init__(self, raw: IO[bytes], url: str, sha256: str | None, size: int | None) -> None:
        self.raw, self.url, self.sha256, self.size = raw, url, sha256, size
        self.digest, self.length = hashlib.sha256(), 0

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.digest.update(data)
        self.length += len(data)
        if self.size is not None and self.length > self.size:
            raise ShardCorrupt(f"{self.url}: over {self.size} bytes, the manifest's size")
        return data

    def check(self) -> None:
        while self.read(CHUNK):
            pass
        problem = mismatch(self.sha256, self.size, self.digest.hexdigest(), self.length)
        if problem:
            raise ShardCorrupt(f"{self.url}: {problem}")


def read_errors() -> tuple[type[BaseException], ...]:
    """What reading a shard may raise when the shard, not the code, is at fault: a mismatch,
    storage errors (gone, denied, connection), and a damaged tar (or a compressed one)."""
    return (ShardCorrupt, *storage_errors(), *DAMAGED_TAR)


# What parsing a damaged tar (or a compressed one) raises
DAMAGED_TAR = (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, UnicodeDecodeError)

"""A shard cache on local disk (NVMe), shared by every rank and loader worker on a node.

- One download per shard per node: a process takes the shard's lock file exclusively, checks
  again, downloads to a temporary file, checks its size and sha256 against the manifest
  (downloads again, at most `RETRIES` times, on a mismatch; then ShardCorrupt) and renames it
  into place. A cached copy whose size is not the manifest's is downloaded again.
- In use: readers hold a shared lock on the shard's lock file while they read it; eviction
  only takes shards whose lock it can get exclusively at once.
- Byte limit: under one cache-wide lock, least recently used shards not in use are removed
  until the new one fits; the cache exceeds its limit only while every older shard is in use.
- `prefetch(urls)` downloads the next shards in a background thread.
Counters (`hits`, `misses`, `evictions`) are per process.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from core.config_io import ConfigError
from trainer.verify import RETRIES, ShardCorrupt, download_hashed, mismatch

__all__ = ["RETRIES", "ShardCache", "ShardCorrupt", "check_cache_dir", "flocked"]


@contextlib.contextmanager
def flocked(path: Path, mode: int) -> Iterator[int]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, mode)
        yield fd
    finally:
        os.close(fd)  # closing releases the lock


def check_cache_dir(folder: str | None) -> None:
    """data.cache_dir made (or found) as a folder before training starts: a file there, or a
    folder that cannot be made, fails on one line instead of in every loader worker."""
    if folder is None:
        return
    try:
        Path(folder).expanduser().mkdir(parents=True, exist_ok=True)
    except OSError as err:  # FileExistsError (a file), NotADirectoryError, PermissionError
        raise ConfigError(f"data.cache_dir: cannot use {folder} as a folder: {err}") from None


class ShardCache:
    def __init__(
        self, folder: str | Path, limit_bytes: int, storage_options: dict[str, Any] | None = None
    ) -> None:
        self.folder = Path(folder).expanduser()
        self.folder.mkdir(parents=True, exist_ok=True)
        self.limit = limit_bytes
        self.storage_options = dict(storage_options or {})
        self.hits = self.misses = self.evictions = 0
        self._prefetcher: ThreadPoolExecutor | None = None
        self._counter_lock = threading.Lock()

    def name(self, url: str) -> str:
        return hashlib.sha256(url.encode()).hexdigest()[:32] + ".tar"

    def path(self, url: str) -> Path:
        return self.folder / self.name(url)

    @contextlib.contextmanager
    def open(self, url: str, sha256: str | None, size: int) -> Iterator[Any]:
        """The local copy of a shard, opened for reading, held in use while open."""
        for _ in range(RETRIES + 1):
            path = self.fetch(url, sha256, size)
            with flocked(self.lock_path(path), fcntl.LOCK_SH):
                if not path.exists():
                    continue  # evicted between the fetch and the lock: fetch again
                os.utime(path)  # most recently used
                with open(path, "rb") as f:
                    yield f
                return
        raise ShardCorrupt(f"{url}: evicted again and again before it could be read")

    def fetch(self, url: str, sha256: str | None, size: int) -> Path:
        path = self.path(url)
        if self.holds(path, size):
            self.count("hits")
            return path
        with flocked(self.lock_path(path), fcntl.LOCK_EX):
            if self.holds(path, size):  # another process finished it while we waited
                self.count("hits")
                return path
            tmp = self.download(url, sha256, size, path)
            with flocked(self.folder / ".cache.lock", fcntl.LOCK_EX):
                self.make_room(size, keep=path)
                os.replace(tmp, path)
            self.count("misses")
        return path

    def holds(self, path: Path, size: int | None) -> bool:
        """Whether the cache has this shard. Why the size: a copy damaged on this disk (or
        one an older version kept) is downloaded again rather than read."""
        with contextlib.suppress(FileNotFoundError):  # evicted by another process just now
            return size is None or path.stat().st_size == size
        return False

    def download(self, url: str, sha256: str | None, size: int | None, path: Path) -> Path:
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
        problem = None
        try:
            for _ in range(RETRIES + 1):
                problem = self.copy_checked(url, tmp, sha256, size)
                if problem is None:
                    return tmp
        except BaseException:
            tmp.unlink(missing_ok=True)  # a failed download leaves nothing behind
            raise
        tmp.unlink(missing_ok=True)
        raise ShardCorrupt(f"{url}: {problem} (downloaded {RETRIES + 1} times)")

    def copy_checked(self, url: str, tmp: Path, sha256: str | None, size: int | None) -> str | None:
        """Copy to `tmp`, synced to disk (a crash cannot leave a short shard under its final
        name); None when its size and sha256 match the manifest, else what differs."""
        with open(tmp, "wb") as dst:
            found = download_hashed(url, dst, self.storage_options)
            dst.flush()
            os.fsync(dst.fileno())
        return mismatch(sha256, size, *found)

    def make_room(self, incoming: int, keep: Path) -> None:
        """Evict least recently used shards that nobody holds until `incoming` fits."""
        shards = [p for p in self.folder.glob("*.tar") if p != keep]
        sizes = {p: p.stat().st_size for p in shards}
        used = sum(sizes.values())
        for shard in sorted(shards, key=lambda p: p.stat().st_mtime):
            if used + incoming <= self.limit:
                return
            if self.try_evict(shard):
                used -= sizes[shard]

    def try_evict(self, shard: Path) -> bool:
        fd = os.open(self.lock_path(shard), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False  # being read or downloaded
        try:
            shard.unlink(missing_ok=True)
            self.count("evictions")
            return True
        finally:
            os.close(fd)

    def lock_path(self, path: Path) -> Path:
        return path.with_name(f".{path.name}.lock")

    def used_bytes(self) -> int:
        total = 0
        for path in self.folder.glob("*.tar"):
            with contextlib.suppress(FileNotFoundError):  # evicted by another process just now
                total += path.stat().st_size
        return total

    def prefetch(self, shards: list[tuple[str, str | None, int]]) -> None:
        """Download these (url, sha256, size) in the background, in order."""
        if self._prefetcher is None:
            self._prefetcher = ThreadPoolExecutor(1, thread_name_prefix="shard-prefetch")
        for url, sha256, size in shards:
            self._prefetcher.submit(self.fetch, url, sha256, size)

    def count(self, name: str) -> None:
        with self._counter_lock:
            setattr(self, name, getattr(self, name) + 1)

    def counters(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "evictions": self.evictions}

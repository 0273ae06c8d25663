"""A shard cache on local disk (NVMe), shared by every rank and loader worker on a node.

- A copy is named by the shard's URL and its manifest sha256: a dataset rebuilt at the same URL
  (new bytes, often the same size) is a miss, never the old copy.
- One download per shard per node: a process takes the shard's lock file exclusively, checks
  again, downloads to a temporary file, checks its size and sha256 against the manifest
  (downloads again, at most `RETRIES` times, on a mismatch; then ShardCorrupt) and renames it
  into place. A cached copy whose size is not the manifest's is downloaded again, and so is
  one a reader found damaged (`discard_damaged`: its bytes hashed, removed when they differ).
- In use: readers hold a shared lock on the shard's lock file while they read it; eviction
  only takes shards whose lock it can get exclusively at once.
- Byte limit: under one cache-wide lock, least recently used shards not in use are removed
  until the new one fits; the cache exceeds its limit only while every older shard is in use.
  Downloads in progress count toward the limit; those a killed process left (`.<name>.tmp-
  <host>-<pid>-<thread>`: its pid gone from this host, or untouched for STALE_PARTIAL_S) are
  removed then.
- `prefetch(urls)` downloads the next shards in a background thread.
Counters (`hits`, `misses`, `evictions`, `damaged`, `abandoned`) are per process.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from mmcurate.core.atomic import pid_gone
from mmcurate.core.config_io import ConfigError
from mmcurate.trainer.data.verify import (
    RETRIES,
    ShardCorrupt,
    copy_hashed,
    download_hashed,
    mismatch,
)

__all__ = ["RETRIES", "ShardCache", "ShardCorrupt", "check_cache_dir", "flocked"]

# A partial download untouched this long is abandoned, whoever wrote it: on a cache folder
# shared between hosts another host's pid cannot be checked (a live download writes often).
STALE_PARTIAL_S = 6 * 3600
DEAD_PARTIAL_S = 300  # a dead writer's partial is removed once untouched this long
HOST = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "host"


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
        self.hits = self.misses = self.evictions = self.damaged = self.abandoned = 0
        self._prefetcher: ThreadPoolExecutor | None = None
        self._counter_lock = threading.Lock()

    def name(self, url: str, sha256: str | None = None) -> str:
        """The copy's file name: by URL and sha256, so a shard rebuilt at the same URL is
        another copy (a manifest without sha256 names it by URL alone)."""
        key = f"{url}\0{sha256}" if sha256 else url
        return hashlib.sha256(key.encode()).hexdigest()[:32] + ".tar"

    def path(self, url: str, sha256: str | None = None) -> Path:
        return self.folder / self.name(url, sha256)

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
        path = self.path(url, sha256)
        if self.holds(path, size):
            self.count("hits")
            return path
        with flocked(self.lock_path(path), fcntl.LOCK_EX):
            if self.holds(path, size):  # another process finished it while we waited
                self.count("hits")
                return path
            tmp = self.download(url, sha256, size, path)
            with flocked(self.folder / ".cache.lock", fcntl.LOCK_EX):
                self.make_room(size, keep=path, own=tmp)
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
        owner = f"{HOST}-{os.getpid()}-{threading.get_ident()}"
        tmp = path.with_name(f".{path.name}.tmp-{owner}")
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

    def make_room(self, incoming: int, keep: Path, own: Path | None = None) -> None:
        """Evict least recently used shards that nobody holds until `incoming` fits beside
        them and the other downloads in progress (abandoned ones are removed; `own` is the
        incoming shard's)."""
        used = self.partial_bytes(own)
        shards = [p for p in self.folder.glob("*.tar") if p != keep]
        sizes = {p: p.stat().st_size for p in shards}
        used += sum(sizes.values())
        for shard in sorted(shards, key=lambda p: p.stat().st_mtime):
            if used + incoming <= self.limit:
                return
            if self.try_evict(shard):
                used -= sizes[shard]

    def partial_bytes(self, own: Path | None) -> int:
        """Bytes of the downloads other threads and processes have in progress; those a
        stopped process left are deleted instead (under the cache lock)."""
        total, now = 0, time.time()
        for tmp in self.folder.glob(".*.tar.tmp-*"):
            if tmp == own:
                continue
            try:
                stat = tmp.stat()
            except FileNotFoundError:  # finished (renamed) or removed just now
                continue
            if abandoned(tmp.name, now - stat.st_mtime):
                tmp.unlink(missing_ok=True)
                self.count("abandoned")
            else:
                total += stat.st_size
        return total

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

    def discard_damaged(
        self, url: str, sha256: str | None, size: int, copy: os.stat_result
    ) -> bool:
        """A read of the cached copy `copy` (its fstat) failed. True when its bytes are not
        the manifest's (damaged on this disk): it is removed, the next open downloads the
        shard again; also True when another process already replaced or removed it. False
        when the copy is the manifest's shard (the shard itself is bad)."""
        path = self.path(url, sha256)
        try:
            with open(path, "rb") as f:
                if not same_file(os.fstat(f.fileno()), copy):
                    return True
                if mismatch(sha256, size, *copy_hashed(f, None)) is None:
                    return False
        except FileNotFoundError:
            return True
        with flocked(self.folder / ".cache.lock", fcntl.LOCK_EX):
            with contextlib.suppress(FileNotFoundError):
                if same_file(path.stat(), copy):
                    path.unlink()
                    self.count("damaged")
        return True

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
        names = ("hits", "misses", "evictions", "damaged", "abandoned")
        return {name: getattr(self, name) for name in names}


def same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def abandoned(name: str, age_s: float) -> bool:
    """Whether the partial download `name` (`.<shard>.tmp-<host>-<pid>-<thread>`, or
    `...tmp-<pid>-<thread>` as older versions wrote it, on this host) has no live writer:
    untouched for STALE_PARTIAL_S, or written on this host by a process that is gone and
    untouched for DEAD_PARTIAL_S (a live download in another pid namespace on the same host,
    a container's, shows a pid that looks gone; a live download writes all the time)."""
    if age_s > STALE_PARTIAL_S:
        return True
    if age_s < DEAD_PARTIAL_S:
        return False
    owner = name.rpartition(".tmp-")[2].rsplit("-", 2)
    host, pid = (owner[0], owner[1]) if len(owner) == 3 else (HOST, owner[0])
    return host == HOST and pid.isdigit() and pid_gone(int(pid))

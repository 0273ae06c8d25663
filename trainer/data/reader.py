"""One process's reads of a dataset's shards: through the node's shard cache, or streamed and
verified (trainer/data/verify.py), or streamed as they are (`verify=False`).

A shard that cannot be used (its bytes differ from the manifest's size or sha256, the object
is gone or unreadable, the tar is damaged) is skipped: named once in this process's log, its
unread samples come back as None (the loader replaces them, so every rank still yields its
full, equal batches), and it is reported through `take_skipped`. A shard whose bytes did not
match is not downloaded again by this process; other errors are tried again next time.

Streamed and verified, a remote shard's run is hashed as its bytes pass and its samples held
(trainer/data/hold.py: in memory up to `hold_bytes`, then on local disk) until the stream ended and
matched the manifest; only then do they come. A `used` filter (member extension -> bool) leaves
out members the caller has no use for: their bytes are read past, never kept.

A cached copy that cannot be read (a damaged tar) is hashed: when its bytes are not the
manifest's (damaged on the node's disk) it is removed and the shard downloaded again, once per
shard and process, and read on from the sample it stopped at (`refetches` counts these).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import IO, Any

import fsspec
from mmcurate.core.manifest import Shard
from mmcurate.core.storage import protocol_of, with_retries
from mmcurate.core.tario import (
    EXT_ALIASES,
    group_samples,
    iter_tar_samples,
    split_member_name,
    tar_files,
)
from mmcurate.trainer.data.cache import ShardCache
from mmcurate.trainer.data.hold import SampleStore
from mmcurate.trainer.data.plan import Segment
from mmcurate.trainer.data.verify import (
    DAMAGED_TAR,
    RETRIES,
    HashedStream,
    ShardCorrupt,
    open_verified,
    read_errors,
)

log = logging.getLogger(__name__)

PREFETCH_SHARDS = 2  # shard runs a worker asks the cache to fetch ahead of the one it reads


class ShardReader:
    # What a skipped shard's samples become, for the warning: training replaces them
    SKIPPED = "its samples are replaced by others"

    def __init__(
        self,
        shards: Sequence[Shard],
        storage_options: dict[str, Any] | None = None,
        cache: tuple[str, int] | None = None,
        verify: bool = True,
        used: Callable[[str], bool] | None = None,
        hold_bytes: int | None = None,
    ) -> None:
        self.shards = shards
        self.used = used  # which member extensions to read (None: all)
        self.hold_bytes = hold_bytes  # in memory per held run (None: hold.py's default)
        self.storage_options = dict(storage_options or {})
        self.cache = ShardCache(cache[0], cache[1], self.storage_options) if cache else None
        self.verify = verify
        self.corrupt: dict[int, str] = {}  # shard -> why its bytes are not the manifest's
        self.logged: set[int] = set()
        self.unreported: list[int] = []  # skipped shards not yet passed on by take_skipped
        self.skips = 0  # shard reads skipped in this process
        self.refetched: set[int] = set()  # shards whose cached copy was found damaged
        self.refetches = 0  # damaged cached copies downloaded again by this process

    def open(self, index: int) -> AbstractContextManager[IO[bytes]]:
        shard = self.shards[index]
        if self.cache is not None:
            return self.cache.open(shard.url, shard.sha256, shard.bytes)
        if self.verify:
            return open_verified(shard.url, shard.sha256, shard.bytes, self.storage_options)
        return fsspec.open(shard.url, "rb", **self.storage_options)

    def positions(self, runs: Sequence[Segment]) -> Iterator[tuple[int, dict[str, Any] | None]]:
        """(epoch position, raw sample) for every position of the runs, in order: None where
        the shard could not give it (skipped, or shorter than the manifest says)."""
        for index, run in enumerate(runs):
            if self.cache is not None:
                ahead = [r.shard for r in runs[index + 1 : index + 1 + PREFETCH_SHARDS]]
                self.cache.prefetch([self.entry(s) for s in ahead if s not in self.corrupt])
            delivered = 0
            for sample in self.samples(run.shard, run.start, run.stop):
                yield run.position + delivered, sample
                delivered += 1
            for offset in range(delivered, run.stop - run.start):
                yield run.position + offset, None

    def samples(self, index: int, start: int = 0, stop: int | None = None) -> Iterator[dict]:
        """Samples [start, stop) of one shard; fewer (none once found corrupt) when the
        shard cannot be used, which is then logged and counted."""
        if index in self.corrupt:
            self.skip(index, self.corrupt[index])
            return
        if self.cache is None and self.verify and protocol_of(self.shards[index].url) != "file":
            yield from self.verified(index, start, stop)
            return
        position = start
        while True:
            copy = None  # the cached copy being read (its fstat)
            try:
                with self.open(index) as f:
                    copy = os.fstat(f.fileno()) if self.cache is not None else None
                    for sample in self.parse(f, position, stop):
                        yield sample
                        position += 1
                return
            except ShardCorrupt as err:
                self.corrupt[index] = str(err)
                self.skip(index, str(err))
                return
            except read_errors() as err:  # the shard (or its storage) is at fault, not the code
                why = f"{type(err).__name__}: {err}"
                if copy is None or not self.refetch(index, copy, why):
                    self.skip(index, why)
                    return

    def parse(self, f: IO[bytes], start: int, stop: int | None) -> Iterator[dict]:
        """Samples [start, stop) of a tar, without the members `used` leaves out."""
        if self.used is None:
            return iter_tar_samples(f, start, stop)
        return used_samples(f, start, stop, self.used)

    def verified(self, index: int, start: int, stop: int | None) -> Iterator[dict]:
        """Samples [start, stop) of a remote shard, given once the whole shard matched."""
        try:
            store, failed = self.hold(index, start, stop)
        except ShardCorrupt as err:
            self.corrupt[index] = str(err)
            self.skip(index, str(err))
            return
        except read_errors() as err:
            self.skip(index, f"{type(err).__name__}: {err}")
            return
        try:
            for offset in range(len(store)):
                yield store.pop(offset)
        finally:
            store.close()
        if failed:  # the tar itself is damaged (its bytes are the manifest's)
            self.skip(index, failed)

    def hold(self, index: int, start: int, stop: int | None) -> tuple[SampleStore, str | None]:
        """The run's samples held, its shard streamed and checked (downloaded again up to
        RETRIES times on a mismatch, transient storage errors retried), and the tar's own
        damage, if any, past the samples before it."""
        problem: ShardCorrupt | None = None
        for _ in range(RETRIES + 1):
            store = SampleStore(self.hold_bytes)
            try:
                return store, with_retries(lambda s=store: self.hold_once(index, start, stop, s))
            except ShardCorrupt as err:
                store.close()
                problem = err
            except BaseException:
                store.close()
                raise
        raise ShardCorrupt(f"{problem} (downloaded {RETRIES + 1} times)")

    def hold_once(self, index: int, start: int, stop: int | None, store: SampleStore) -> str | None:
        store.close()  # a retry starts over
        url, sha256, size = self.entry(index)
        failed = None
        with open_verified(url, sha256, size, self.storage_options) as stream:
            assert isinstance(stream, HashedStream)
            try:
                for offset, sample in enumerate(self.parse(stream, start, stop)):
                    store.put(offset, sample)
            except DAMAGED_TAR as err:  # whose fault: the hash of the whole stream says
                failed = f"{type(err).__name__}: {err}"
            stream.check()
        return failed

    def refetch(self, index: int, copy: os.stat_result, why: str) -> bool:
        """Whether the cached copy that failed to read was damaged on this disk and is to be
        downloaded again (at most once per shard in this process)."""
        if self.cache is None or index in self.refetched:
            return False
        self.refetched.add(index)
        url, sha256, size = self.entry(index)
        try:
            damaged = self.cache.discard_damaged(url, sha256, size, copy)
        except OSError as err:
            log.warning("cannot check the cached copy of %s: %s", url, err)
            return False
        if damaged:
            self.refetches += 1
            log.warning(
                "cached copy of shard %s is damaged (%s); downloading it again",
                url,
                " ".join(why.split()),
            )
        return damaged

    def skip(self, index: int, why: str) -> None:
        self.skips += 1
        if index not in self.logged:
            self.logged.add(index)
            self.unreported.append(index)
            log.warning(
                "skipping shard %s: %s; %s",
                self.shards[index].url,
                " ".join(why.split()),
                self.SKIPPED,
            )

    def take_skipped(self) -> tuple[int, ...]:
        """Shards this process skipped for the first time since the last call."""
        taken, self.unreported = tuple(self.unreported), []
        return taken

    def entry(self, index: int) -> tuple[str, str | None, int]:
        shard = self.shards[index]
        return shard.url, shard.sha256, shard.bytes


UNREAD = object()  # what a member left out reads as (dropped from its sample)


def used_samples(
    f: IO[bytes], start: int, stop: int | None, used: Callable[[str], bool]
) -> Iterator[dict]:
    """`iter_tar_samples` without the members whose extension `used` rejects: grouped into
    samples exactly as before (same keys, same splits), their data read past, not kept."""

    def member(name: str, read: Callable[[], bytes]) -> tuple[str, Callable[[], object]]:
        ext = split_member_name(name)[1]
        return name, read if used(EXT_ALIASES.get(ext, ext)) else unread

    files = (member(name, read) for name, read in tar_files(f))
    for sample in group_samples(files, start, stop):  # type: ignore[arg-type]
        yield {name: value for name, value in sample.items() if value is not UNREAD}


def unread() -> object:
    return UNREAD

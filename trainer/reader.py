"""One process's reads of a dataset's shards: through the node's shard cache, or streamed and
verified (trainer/verify.py), or streamed as they are (`verify=False`).

A shard that cannot be used (its bytes differ from the manifest's size or sha256, the object
is gone or unreadable, the tar is damaged) is skipped: named once in this process's log, its
unread samples come back as None (the loader replaces them, so every rank still yields its
full, equal batches), and it is reported through `take_skipped`. A shard whose bytes did not
match is not downloaded again by this process; other errors are tried again next time.

A cached copy that cannot be read (a damaged tar) is hashed: when its bytes are not the
manifest's (damaged on the node's disk) it is removed and the shard downloaded again, once per
shard and process, and read on from the sample it stopped at (`refetches` counts these).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import IO, Any

import fsspec

from core.tario import iter_tar_samples
from trainer.cache import ShardCache
from trainer.manifest import Shard
from trainer.plan import Segment
from trainer.verify import ShardCorrupt, open_verified, read_errors

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
    ) -> None:
        self.shards = shards
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
        position = start
        while True:
            copy = None  # the cached copy being read (its fstat)
            try:
                with self.open(index) as f:
                    copy = os.fstat(f.fileno()) if self.cache is not None else None
                    for sample in iter_tar_samples(f, position, stop):
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

"""Candidate tars retired during phase C, so the store never holds every candidate and every
shard at once (issue 37).

A candidate tar is read only by the shard tasks whose spans come from it. Kept rows are in
output order, sorted by partition, so each partition's kept rows are one contiguous range of
positions and the shards that need its tar are one contiguous run. Once every shard of that run
is written and its done marker recorded, the tar is deleted. The candidate metadata parquet
stays until the commit drops `_work/` (the schema plan and each shard's metadata read it).

A sample whose media payload is a reference (pipeline/output/media_index.py) makes its shard read
the candidate holding that payload too: such a candidate waits for those shards as well
(`refs`, from `pipeline.output.shard_refs.referred_shards`), so it is never deleted while a later
shard still needs it.

Resume is unchanged: a rerun skips every shard whose marker it trusts, and only those shards'
candidates can be gone. Crash windows: killed after a marker and before the deletion, the rerun
finds the shard done and deletes the tar at the start of its phase C; killed mid-deletion, the
tar is gone or whole (one delete call). A task that wrote its marker but whose result never came
back (its worker died) is run again: the driver retires only on results it received.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
from collections.abc import Callable, Iterable

from mmcurate.core.mapreduce import LocalRunner, Runner
from mmcurate.core.storage import filesystem, join, with_retries
from mmcurate.pipeline.output.groups import Groups
from mmcurate.pipeline.output.shard_format import ShardSpec
from mmcurate.pipeline.output.shard_refs import referred_shards
from mmcurate.pipeline.output.shards import candidate_name

log = logging.getLogger("mmcurate.build")


def shard_runs(
    kept_per_part: list[tuple[int, int]], shard_starts: list[int]
) -> dict[int, tuple[int, int]]:
    """(partition, kept rows), in output order, and each shard's first global kept position ->
    per partition with kept rows, the [first, last] shard indexes holding them."""
    runs: dict[int, tuple[int, int]] = {}
    position = 0
    for part, kept in kept_per_part:
        if kept:
            first = bisect.bisect_right(shard_starts, position) - 1
            last = bisect.bisect_right(shard_starts, position + kept - 1) - 1
            runs[part] = (first, last)
        position += kept
    return runs


class Retirer:
    """Counts, per partition, the shards still to write that need its candidate tar (its
    own run, and those reading payloads from it: `refs`, partition -> shard indexes), and
    deletes the tar (through `delete`) when the count reaches zero."""

    def __init__(
        self,
        parts: Iterable[int],
        runs: dict[int, tuple[int, int]],
        delete: Callable[[int], None],
        refs: dict[int, list[int]] | None = None,
    ) -> None:
        self.delete = delete
        self.reading: set[int] = set()  # partitions whose kept samples have references
        self.waiting: dict[int, int] = {}  # partition -> shards not yet done
        self.needs: dict[int, list[int]] = {}  # shard index -> partitions it reads
        for part in parts:
            first, last = runs.get(part, (0, -1))
            shards = set(range(first, last + 1)) | set((refs or {}).get(part, ()))
            self.waiting[part] = len(shards)
            for shard in sorted(shards):
                self.needs.setdefault(shard, []).append(part)

    def start(self, done: Iterable[int]) -> None:
        """Shards already done (an earlier run's markers): retire what they free, and every
        partition no shard needs (nothing of it was kept)."""
        for shard in done:
            self.shard_done(shard, retire=False)
        for part, count in list(self.waiting.items()):
            if count == 0:
                self.retire(part)

    def shard_done(self, shard: int, retire: bool = True) -> None:
        for part in self.needs.pop(shard, []):
            self.waiting[part] -= 1
            if retire and self.waiting[part] == 0:
                self.retire(part)

    def retire(self, part: int) -> None:
        del self.waiting[part]
        self.delete(part)


def candidate_deleter(work_url: str, storage_options: dict) -> Callable[[int], None]:
    """Deletes one partition's candidate tar; a failure is logged, never fails the build
    (the commit drops `_work/` anyway)."""
    fs, folder = filesystem(join(work_url, "candidates"), storage_options)

    def delete(part: int) -> None:
        path = join(folder, candidate_name(part))
        try:
            with contextlib.suppress(FileNotFoundError):
                with_retries(lambda: fs.rm_file(path))
        except Exception as err:  # noqa: BLE001  (any store error: the commit cleans up)
            log.warning("candidate %s not retired: %s: %s", path, type(err).__name__, err)

    return delete


def start_retiring(
    groups: Groups,
    found: list[dict],
    specs: list[ShardSpec],
    done: dict[str, dict],
    referring: dict[int, list[int]] | None = None,
    runner: Runner | None = None,
) -> Retirer:
    """Candidate tars deleted as soon as every shard that reads them is written (issue 37):
    those the shards already done free, and those nothing was kept from, go now.
    `referring`: partitions whose samples refer to payloads in others (their done markers)."""
    kept_per_part = []
    for group, share in enumerate(found):
        kept = dict(share["part_kept"])
        kept_per_part += [(part, kept.get(part, 0)) for part in groups.parts[group]]
    starts = [spec.start for spec in specs]
    runs = shard_runs(kept_per_part, starts)
    delete = candidate_deleter(groups.work_url, groups.storage_options)
    refs, reading = referred(groups, found, referring or {}, starts, runner or LocalRunner())
    retirer = Retirer([part for part, _ in kept_per_part], runs, delete, refs)
    retirer.reading = reading
    retirer.start(i for i, spec in enumerate(specs) if spec.name in done)
    return retirer


def referred(
    groups: Groups,
    found: list[dict],
    referring: dict[int, list[int]],
    shard_starts: list[int],
    runner: Runner,
) -> tuple[dict[int, list[int]], set[int]]:
    """Partition -> the shards that read payloads from its candidate through references, and
    the partitions whose kept samples have references; in tasks over the groups holding
    referring partitions."""
    calls, first = [], 0
    for group, share in enumerate(found):
        parts = [p for p in groups.parts[group] if p in referring]
        if parts and share["kept"]:
            calls.append((groups, group, parts, first, shard_starts))
        first += share["kept"]
    merged: dict[int, set[int]] = {}
    reading: set[int] = set()
    for result, parts_read in runner.run(referred_shards, calls) if calls else []:
        reading.update(parts_read)
        for part, shards in result.items():
            merged.setdefault(part, set()).update(shards)
    return {part: sorted(shards) for part, shards in merged.items()}, reading


def shard_written(index: int, entry: dict | None, retirer: Retirer, todo: list[int]) -> None:
    """A shard task's result came back: with its marker recorded, its candidates may go."""
    if entry is not None:
        retirer.shard_done(todo[index])

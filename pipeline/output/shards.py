"""Final shard layout (pure planning) and writing one planned shard (runs in a Ray task); the
done markers of a build's tasks live in pipeline/output/markers.py.

Samples keep the source order: sorted by (partition, index). Shards are filled greedily up
to `shard_max_samples` samples and `shard_max_bytes` bytes (a single larger sample gets a shard
of its own). Names are `shard-000000.tar`, ..., so the same input gives the same layout.

Every shard's metadata parquet has the same schema, decided before any shard is written from
all candidates' metadata (`plan_metadata_fields`): `key`, `caption`, then each JSON field,
typed bool, int64, float64 (ints and floats mixed) or string; a field whose values are lists
or objects, or whose types conflict, is a string column of JSON text; an always-null field
is a string column. So `pyarrow.dataset` and duckdb read `shard-*.parquet` as one table.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import IO

from mmcurate.core.atomic import open_atomic, write_parquet
from mmcurate.core.storage import filesystem, is_local, join, with_retries
from mmcurate.pipeline.output.json_fill import Fill, shard_fills
from mmcurate.pipeline.output.names import part_file
from mmcurate.pipeline.output.shard_format import TAR_END_BYTES, ShardSpec
from mmcurate.pipeline.output.shard_metadata import metadata_row, metadata_table, spec_records

HASH_CHUNK = 1 << 20  # bytes of a local candidate hashed per read
COPY_BLOCK = 8 << 20  # bytes per ranged read when a shard is copied from an object store
COPY_BATCH = 16 << 20  # ranged reads in flight together, in bytes: what a copy holds at most
KERNEL_COPY = hasattr(os, "copy_file_range")  # Linux: local shards copied without Python


def candidate_name(part: int) -> str:
    return part_file(part, "tar")


def merged_runs(spans: list[tuple[str, int, int]]) -> list[tuple[int, int]]:
    """Adjacent (offset, length) spans joined into (start, end) byte runs: fewer reads."""
    runs: list[list[int]] = []
    for _, offset, length in spans:
        if runs and runs[-1][1] == offset:
            runs[-1][1] = offset + length
        else:
            runs.append([offset, offset + length])
    return [(start, end) for start, end in runs]


def copy_spans(
    candidates_url: str,
    spec: ShardSpec,
    storage_options: dict,
    out: HashingWriter,
    fills: dict[int, dict[str, Fill]] | None = None,
) -> None:
    """Append the spec's sample records, in order, from the candidate tars to `out`; a
    partition whose samples refer to payloads elsewhere (`spec.refs`) or get a new json
    member (`fills`, pipeline/output/json_fill.py) by pieces."""
    refs, fills = spec.refs, fills or {}
    for part, spans in spec.parts:
        if part not in refs and part not in fills:
            copy_runs(candidates_url, part, merged_runs(spans), storage_options, out)
            continue
        from mmcurate.pipeline.output.shard_refs import part_pieces, runs_of

        pieces = part_pieces(part, spans, refs.get(part, {}), fills.get(part))
        for group in runs_of(pieces):
            if isinstance(group, bytes):
                out.write(group)
            else:
                copy_runs(candidates_url, group[0], group[1], storage_options, out)


def copy_runs(
    candidates_url: str,
    part: int,
    runs: list[tuple[int, int]],
    storage_options: dict,
    out: HashingWriter,
) -> None:
    """Append (start, end) byte runs of one candidate tar: by the kernel from a local one,
    else by ranged reads in bounded batches."""
    fs, path = filesystem(join(candidates_url, candidate_name(part)), storage_options)
    if is_local(fs) and KERNEL_COPY:
        out.copy_runs(path, runs)
        return
    for batch in block_batches(runs):
        starts, ends = [a for a, _ in batch], [b for _, b in batch]
        blobs = with_retries(
            lambda: fs.cat_ranges([path] * len(starts), starts, ends)  # noqa: B023
        )
        for blob in blobs:
            out.write(blob)
        del blobs  # before the next batch is read: one batch in memory at a time


def block_batches(
    runs: list[tuple[int, int]], block: int = COPY_BLOCK, batch: int = COPY_BATCH
) -> list[list[tuple[int, int]]]:
    """(start, end) runs cut into blocks of at most `block` bytes, grouped into batches of at
    most `batch` bytes (a batch's ranges are fetched together; one batch is held at a time),
    in order: a shard or a run is never held whole."""
    batches: list[list[tuple[int, int]]] = [[]]
    used = 0
    for start, end in runs:
        for at in range(start, end, block):
            size = min(block, end - at)
            if batches[-1] and used + size > batch:
                batches.append([])
                used = 0
            batches[-1].append((at, at + size))
            used += size
    return batches if batches[-1] else []


def write_shard(
    spec: ShardSpec, candidates_url: str, output_url: str, storage_options: dict
) -> dict:
    """Write one final shard atomically; returns its manifest entry (a dict: manifest.json's
    form). The bytes are hashed as they are written (one pass). The metadata parquet takes its
    columns from `spec.fields` (the build's one schema, plan_metadata_fields); without it, from
    this shard's own rows. A json lacking one of `spec.json_keys` (the build's) is written
    with it as null."""
    fs, path = filesystem(join(output_url, spec.name), storage_options)
    records = spec_records(candidates_url, spec, storage_options)
    fills = shard_fills(list(spec.parts), records, spec.json_keys or [])
    with open_atomic(fs, path) as target, HashingWriter(target) as out:
        copy_spans(candidates_url, spec, storage_options, out, fills)
        out.write(b"\0" * TAR_END_BYTES)
    metadata = [metadata_row(records[part][key]) for part, spans in spec.parts for key, *_ in spans]
    meta_url = join(output_url, spec.name.removesuffix(".tar") + ".parquet")
    write_parquet(metadata_table(metadata, spec.fields, spec.json_keys), meta_url, storage_options)
    entry = {"name": spec.name, "samples": spec.samples}
    return entry | {"bytes": out.size, "sha256": out.sha256}


class HashingWriter:
    """Writes through to a file, keeping the sha256 and size of what went through. Hashing
    and copying overlap on two threads (hashlib, file writes and the kernel's copy release
    the GIL): a shard costs max(hash, copy) instead of their sum. `sha256` is set on exit."""

    def __init__(self, target: IO[bytes]) -> None:
        self.target, self.size, self.sha256 = target, 0, ""
        self.digest = hashlib.sha256()
        self.side = ThreadPoolExecutor(1, thread_name_prefix="shard-copy")
        self.pending: Future | None = None  # one job at a time on the side thread: in order

    def write(self, data: bytes) -> int:
        self.wait()
        self.pending = self.side.submit(self.digest.update, data)
        self.size += len(data)
        return self.target.write(data)

    def copy_runs(self, path: str, runs: list[tuple[int, int]]) -> None:
        """Append (start, end) byte runs of a local file: the kernel copies each run on the
        side thread (copy_file_range) while this one hashes it, read into one reused buffer,
        so no byte goes through a Python object. A file that ends early fails as OSError (a
        map of it would kill the process with SIGBUS if it shrank while being hashed)."""
        if not runs:
            return
        self.wait()
        self.target.flush()  # the kernel appends at the file's offset: buffered bytes first
        buffer = memoryview(bytearray(HASH_CHUNK))
        with open(path, "rb") as source:
            for start, end in runs:
                self.pending = self.side.submit(self.append_from, source.fileno(), start, end)
                self.hash_run(source.fileno(), start, end, buffer)
                self.size += end - start
                self.wait()

    def hash_run(self, source: int, start: int, end: int, buffer: memoryview) -> None:
        at = start
        while at < end:
            got = os.preadv(source, [buffer[: min(end - at, len(buffer))]], at)
            if not got:
                self.wait()  # the copy's own error first, if it has one
                raise OSError(f"candidate ended at byte {at}, before {end}")
            self.digest.update(buffer[:got])
            at += got

    def append_from(self, source: int, start: int, end: int) -> None:
        """Bytes [start, end) of the file `source` appended to the target by the kernel; by a
        read and a write where the kernel cannot copy between these two files."""
        at = start
        with contextlib.suppress(OSError):  # EXDEV, EOPNOTSUPP, ...: the plain way below
            while at < end and (
                copied := os.copy_file_range(source, self.target.fileno(), end - at, at)
            ):
                at += copied
        while at < end:
            data = os.pread(source, min(end - at, 1 << 24), at)
            if not data:
                raise OSError(f"candidate ended at byte {at}, before {end}")
            self.target.write(data)
            at += len(data)
        self.target.flush()

    def wait(self) -> None:
        if self.pending is not None:
            self.pending.result()

    def __enter__(self) -> HashingWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.wait()
            self.sha256 = self.digest.hexdigest()
        finally:
            self.side.shutdown()

"""Signature groups: runs of consecutive partitions that phases B and C handle as one unit.

The driver never holds the signatures (issue 19): it holds the group plan (partition numbers,
row counts). Phase B's first round gathers each group's partition files from
`_work/signatures/` into one file; later tasks read only the columns they need from it.
Everything a task hands to a later task goes through `_work/decide/` as parquet (fates,
shuffle payloads, kept rows), so the same code runs on Ray or in-process and the driver's
memory is O(partitions), not O(samples).

A fate table is one row per signature row of a group, sorted by (`__part__`, `__index__`):
`__key__`, the drop reason and stage so far, and `duplicate_of` (the kept key of a duplicate).
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from mmcurate.core.atomic import write_parquet
from mmcurate.core.mapreduce import Runner
from mmcurate.core.storage import cat_many, filesystem, join, with_retries
from mmcurate.pipeline.output.names import (
    DECIDE,
    SIGNATURES,
    group_file,
    part_file,
    round_folder,
)
from mmcurate.stages.base import DROP, DROP_STAGE

ROWS_PER_GROUP = 1_000_000  # a group task holds about this many rows' decision columns
# ... and gathers at most this many partitions' signature files: with `files_per_task: 1` a
# partition is one row, and rows alone would put 1M partitions (~18 GB of per-file tables) in
# one task. 4,096 one-row files gather in ~1 s and ~20 MB (2 vCPUs, local disk).
PARTS_PER_GROUP = 4_096
BYTES_PER_GROUP = 1 << 30  # ... and about this many bytes of signature columns (footers' estimate)
GATHER_BATCH = 512  # partition files read, then combined into one chunk, at a time
KEPT_ROW_GROUP = 16_384  # kept tables are read by row range (a shard's slice)
ORDER = [("__part__", "ascending"), ("__index__", "ascending")]
FATE_COLUMNS = ("__part__", "__index__", "__key__", DROP, DROP_STAGE, "duplicate_of")


def signatures_name(part: int) -> str:
    """A partition's signature file in `_work/signatures/` (phase A's completion mark)."""
    return part_file(part, "parquet")


@dataclass(frozen=True)
class Groups:
    """The group plan of one build: which partitions each group holds, and where its scratch
    goes. Plain data, so it travels to tasks as an argument."""

    work_url: str
    storage_options: dict[str, Any]
    parts: list[list[int]]  # partition numbers per group, ascending
    rows: list[int] = field(default_factory=list)  # signature rows per group

    @property
    def count(self) -> int:
        return len(self.parts)

    def signatures_url(self, part: int) -> str:
        return join(self.work_url, SIGNATURES, signatures_name(part))

    def scratch(self, *names: str) -> str:
        return join(self.work_url, DECIDE, *names)

    def group_url(self, group: int) -> str:
        """The group's signature rows in one file, in output order (decide's first round)."""
        return self.scratch("signatures", group_file(group))

    def fate_url(self, round_name: str, group: int) -> str:
        return self.scratch(round_folder("fate", round_name), group_file(group))

    def kept_url(self, group: int) -> str:
        return self.scratch("kept", group_file(group))


def plan_groups(
    parts: list[int],
    rows: list[int],
    max_rows: int = ROWS_PER_GROUP,
    max_parts: int | None = None,
    sizes: list[int] | None = None,
    max_bytes: int = BYTES_PER_GROUP,
) -> list[list[int]]:
    """Consecutive partitions, each run up to `max_rows` rows (a larger partition alone),
    `max_parts` partitions (default `PARTS_PER_GROUP`) and, given each partition's signature
    bytes (`sizes`), `max_bytes` bytes: wide rows (embeddings, thumbnails) make smaller groups."""
    most = PARTS_PER_GROUP if max_parts is None else max_parts
    sizes = [0] * len(parts) if sizes is None else sizes
    groups: list[list[int]] = []
    used = held = 0
    for part, count, size in zip(parts, rows, sizes, strict=True):
        full = used + count > max_rows or held + size > max_bytes
        if not groups or full or len(groups[-1]) >= most:
            groups.append([])
            used = held = 0
        groups[-1].append(part)
        used += count
        held += size
    return groups


def scan_partitions(
    work_url: str, parts: list[int], storage_options: dict, runner: Runner
) -> tuple[list[int], pa.Schema]:
    """Signature rows per partition and the union of their schemas, from the parquet footers,
    read in tasks of 256 files."""
    rows, _, schema = scan_footers(work_url, parts, storage_options, runner)
    return rows, schema


def scan_footers(
    work_url: str, parts: list[int], storage_options: dict, runner: Runner
) -> tuple[list[int], list[int], pa.Schema]:
    """`scan_partitions` plus each partition's signature bytes as a task holds them."""
    calls = [(work_url, parts[i : i + 256], storage_options) for i in range(0, len(parts), 256)]
    found = runner.run(read_footers, calls)
    schema = pa.unify_schemas([s for _, _, s in found], promote_options="permissive")
    rows = [n for counts, _, _ in found for n in counts]
    return rows, [b for _, sizes, _ in found for b in sizes], schema


def read_footers(
    work_url: str, parts: list[int], storage_options: dict
) -> tuple[list[int], list[int], pa.Schema]:
    """Task body: each partition's signature row count and bytes, and their schemas' union."""
    fs, folder = filesystem(join(work_url, "signatures"), storage_options)
    counts, sizes, schemas = [], [], []
    for part in parts:
        path = join(folder, signatures_name(part))
        with with_retries(lambda: fs.open(path, "rb")) as f:  # noqa: B023
            meta = pq.ParquetFile(f)
            counts.append(meta.metadata.num_rows)
            sizes.append(footer_bytes(meta.metadata))
            schemas.append(meta.schema_arrow)
    return counts, sizes, pa.unify_schemas(schemas, promote_options="permissive")


def footer_bytes(meta: pq.FileMetaData) -> int:
    """A signature file's bytes in memory, estimated from its footer: the uncompressed size of
    its column data (an embedding is about dim x 2 bytes a row, a thumbnail ~1 KB) plus 8
    bytes a row per column for offsets and validity."""
    data = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    return data + 8 * meta.num_rows * meta.num_columns


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """`table` with exactly `schema`'s columns, in its order and types (missing: nulls)."""
    arrays = [
        table[f.name].cast(f.type)
        if f.name in table.column_names
        else pa.nulls(table.num_rows, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def read_parquet(url: str, storage_options: dict, columns: list[str] | None = None) -> pa.Table:
    """One parquet file; of `columns`, those it has (a column no row had was never written)."""
    fs, path = filesystem(url, storage_options)
    blob = with_retries(lambda: fs.cat_file(path))
    source = pq.ParquetFile(io.BytesIO(blob))
    names = source.schema_arrow.names
    return source.read(columns=None if columns is None else [c for c in columns if c in names])


def gather_group(groups: Groups, group: int) -> pa.Table:
    """A group's rows from its partitions' signature files, in output order. Read and combined
    `GATHER_BATCH` files at a time: a one-row file's table costs ~18 KB of buffers and
    metadata, released once its batch is one chunk."""
    fs, folder = filesystem(join(groups.work_url, "signatures"), groups.storage_options)
    paths = [join(folder, signatures_name(p)) for p in groups.parts[group]]
    chunks = []
    for start in range(0, len(paths), GATHER_BATCH):
        tables = read_small_parquets(fs, paths[start : start + GATHER_BATCH])
        chunks.append(pa.concat_tables(tables, promote_options="permissive").combine_chunks())
        del tables
    return pa.concat_tables(chunks, promote_options="permissive").sort_by(ORDER)


def read_small_parquets(fs: Any, paths: list[str]) -> list[pa.Table]:
    """Whole parquet files, fetched together (an object store reads them concurrently) and
    decoded one thread each: for small files Arrow's thread pool costs more than it saves."""
    blobs = cat_many(fs, paths)
    tables = []
    for path in paths:
        blob = blobs[path]
        if isinstance(blob, Exception):  # retried alone; a missing file raises
            blob = with_retries(lambda: fs.cat_file(path))  # noqa: B023
        tables.append(pq.ParquetFile(pa.BufferReader(blob)).read(use_threads=False))
    return tables


def read_group(groups: Groups, group: int, columns: list[str] | None = None) -> pa.Table:
    """A group's signature rows (after `gather_group` wrote them as one file), in output
    order; of `columns`, those it lacks come back as nulls."""
    table = read_parquet(groups.group_url(group), groups.storage_options, columns)
    for name in columns or []:
        if name not in table.column_names:
            table = table.append_column(name, pa.nulls(table.num_rows))
    return table.select(columns) if columns else table


def read_fate(groups: Groups, round_name: str, group: int) -> pa.Table:
    return read_parquet(groups.fate_url(round_name, group), groups.storage_options)


def write_fate(groups: Groups, round_name: str, group: int, fate: pa.Table) -> None:
    write_parquet(
        fate.select(list(FATE_COLUMNS)), groups.fate_url(round_name, group), groups.storage_options
    )


def with_fate(table: pa.Table, fate: pa.Table) -> pa.Table:
    """Signature rows of a group with the fate columns set (both in output order)."""
    for name in (DROP, DROP_STAGE, "duplicate_of"):
        column = fate[name].cast(pa.string())
        if name in table.column_names:
            table = table.set_column(table.column_names.index(name), name, column)
        else:
            table = table.append_column(name, column)
    return table


def read_rows(url: str, storage_options: dict, start: int, stop: int) -> pa.Table:
    """Rows [start, stop) of a parquet file, reading only the row groups that hold them."""
    fs, path = filesystem(url, storage_options)
    with with_retries(lambda: fs.open(path, "rb")) as f:
        source = pq.ParquetFile(f)
        wanted, first, offset = [], None, 0
        for index in range(source.metadata.num_row_groups):
            size = source.metadata.row_group(index).num_rows
            if offset < stop and offset + size > start:
                wanted.append(index)
                first = offset if first is None else first
            offset += size
        if not wanted:
            return source.schema_arrow.empty_table()
        table = source.read_row_groups(wanted)
    return table.slice(start - first, stop - start)

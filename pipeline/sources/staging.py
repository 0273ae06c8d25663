"""Staging: one pass that turns a URL list no partition can read a slice of into a parquet
copy under the build's `_work/source/`: one small parquet file per partition (one file
per partition, not one row group each: a footer listing thousands of row groups would be
read by every partition).

Planned for gzipped lists (no random access), csv/tsv/jsonl whose rows are not one line each
(quoted newlines), and parquet whose row groups are much larger than a partition (a partition
cannot read less than a row group). The copy holds only the columns the build uses: url,
caption and `source.carry_columns`. It is written atomically after the build has claimed its
output folder (`_work/` is the build's scratch: cleared by --overwrite, removed at commit,
pipeline/output/claim.py) and reused when a build resumes. Staging returns new partition records
with `staged_url` set (records are immutable); until staged (`staged_url` unset), such a
partition reads the original the slow way, with the same keys and json.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from mmcurate.core.atomic import write_bytes_atomic
from mmcurate.core.storage import filesystem, join, with_protocol, with_retries
from mmcurate.pipeline.sources.records import Partition, UrlPartition
from mmcurate.pipeline.sources.tables import file_format, read_table

log = logging.getLogger("mmcurate.sources")
# Names in `_work/` (pipeline/output/names.py builds the rerun's pattern from these)
STAGE_FOLDER = "source"
STAGED_DONE = "done.json"  # a staged copy is complete
WRITERS = 8  # concurrent writes of staged files


def stage_folder(
    path: str, rows_per_part: int, columns: list[str] | None, version: dict[str, Any]
) -> str:
    """The staged copy's folder under `_work/`: fixed by the file and its version (size, ETag or
    mtime: a changed file gets a new copy), the columns it keeps and the partition size."""
    key = [path, columns, version["file_size"], version["file_version"]]
    digest = hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]
    return staged_folder(digest, rows_per_part)


def staged_folder(digest: str, rows_per_part: int) -> str:
    """`source/<16 hex>-<rows>`: a staged copy of a URL list, relative to `_work/`."""
    return f"{STAGE_FOLDER}/{digest}-{rows_per_part}"


def staged_chunk(index: int) -> str:
    """`000007.parquet`: one partition's rows in a staged copy's folder."""
    return f"{index:06d}.parquet"


def stage_jobs(
    parts: list[Partition], work_url: str
) -> tuple[list[dict[str, Any]], list[Partition]]:
    """One job per file to stage (partitions that ask for it), and the partitions with their
    `staged_url` set (new records; the others as they were)."""
    jobs: dict[str, dict[str, Any]] = {}
    staged: list[Partition] = []
    for part in parts:
        if not isinstance(part, UrlPartition) or part.stage is None:
            staged.append(part)
            continue
        folder = join(work_url, part.stage)
        staged.append(replace(part, staged_url=join(folder, staged_chunk(part.stage_index or 0))))
        jobs.setdefault(
            folder,
            {
                "folder": folder,
                "source": with_protocol(part.protocol, part.file),
                "columns": None if part.columns is None else list(part.columns),
                "text_columns": [part.url_column, part.caption_column],
                "rows_per_part": part.stage_rows,
            },
        )
    return list(jobs.values()), staged


def stage_sources(
    parts: list[Partition],
    work_url: str,
    storage_options: dict[str, Any],
    run: Any = None,
) -> list[Partition]:
    """Write the staged copies these partitions need (skipping those a resumed build already
    finished: their `done` mark exists); `run(jobs, fn)` fans out (e.g. Ray tasks), else one
    after another here. Returns the partitions, their `staged_url` set (new records: the
    given ones are unchanged). Call after the output is claimed, before phase A."""
    jobs, staged = stage_jobs(parts, work_url)
    todo = [job for job in jobs if not is_staged(job, storage_options)]
    if todo:
        log.info("staging %d URL list file(s) as parquet under %s", len(todo), work_url)
        # A partial of a module function, not a closure: it pickles plainly (a closure would
        # need cloudpickle, which imports Ray in the driver and the worker: ~0.8 s each).
        one = partial(stage_file, storage_options=storage_options)
        if run is not None:
            run(todo, one)
        else:
            for job in todo:
                one(job)
    return staged


def is_staged(job: dict[str, Any], storage_options: dict[str, Any]) -> bool:
    fs, folder = filesystem(job["folder"], storage_options)
    fs.invalidate_cache(folder)
    return fs.exists(join(folder, STAGED_DONE))


def stage_file(job: dict[str, Any], storage_options: dict[str, Any]) -> int:
    """Read the file once (as a whole-file read parses it) and write each partition's rows
    (the used columns) as its own small parquet file, atomically; the `done` mark last.
    Returns the rows written."""
    fs, path = filesystem(job["source"], storage_options)
    out_fs, folder = filesystem(job["folder"], storage_options)
    every = job["rows_per_part"]

    def write(index: int, table: pa.Table) -> None:
        buffer = io.BytesIO()
        pq.write_table(table, buffer)
        write_bytes_atomic(out_fs, join(folder, f"{index:06d}.parquet"), buffer.getvalue())

    if file_format(path) == "parquet" and not path.endswith(".gz"):
        chunks = parquet_chunks(fs, path, job["columns"], every)
    else:
        table = with_retries(lambda: read_table(fs, path, tuple(job["text_columns"])))
        if job["columns"] is not None:
            table = table.select(job["columns"])
        chunks = (table.slice(start, every) for start in range(0, table.num_rows, every))
    rows = 0
    with ThreadPoolExecutor(WRITERS) as pool:  # object stores: many small PUTs at once
        pending = []
        for index, chunk in enumerate(chunks):
            pending.append(pool.submit(write, index, chunk))
            rows += chunk.num_rows
            if len(pending) >= 4 * WRITERS:
                pending.pop(0).result()
        for future in pending:
            future.result()
    write_bytes_atomic(out_fs, join(folder, STAGED_DONE), json.dumps({"rows": rows}).encode())
    return rows


def parquet_chunks(fs: Any, path: str, columns: list[str] | None, every: int) -> Iterator[pa.Table]:
    """A parquet file's rows in tables of `every` rows, reading one row group at a time."""
    with fs.open(path, "rb") as src:
        reader = pq.ParquetFile(src)
        pending: pa.Table | None = None
        for group in range(reader.num_row_groups):
            table = reader.read_row_group(group, columns=columns)
            pending = table if pending is None else pa.concat_tables([pending, table])
            while pending.num_rows >= every:
                yield pending.slice(0, every)
                pending = pending.slice(every)
        if pending is not None and pending.num_rows:
            yield pending

"""Bench (issue 19): reading every partition of a LAION-like URL list, before and after
partition reads, against one whole-file read. Bytes are counted by reading through a counting
fsspec filesystem (`countfile://`: the local filesystem with every byte read tallied).

Before (the reader up to issue 19): every partition read the whole file and sliced its rows;
measured on `--sample` partitions and extrapolated to all of them (the output says so).
After: planning, then staging where planned (pipeline/sources/staging.py, as a build does once
its output is claimed), then every partition's `read_urls` (samples with their json), and the
same partitions' arrow reads alone (`part_table`, no json: comparable with the whole-file
read). `unstaged`: the sample partitions read without the staged copy (a build whose driver
does not stage: each partition reads its whole row group(s)).

    .venv/bin/python bench/source_read.py [--rows 2000000] [--row-group 100000] [--sample 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem
from mmcurate.pipeline.config import SourceConfig
from mmcurate.pipeline.sources.records import UrlPartition
from mmcurate.pipeline.sources.samples import append_sample, empty_batch
from mmcurate.pipeline.sources.staging import stage_sources
from mmcurate.pipeline.sources.synth import laion_like_table, write_csv_list, write_parquet_list
from mmcurate.pipeline.sources.urls import part_table, plan_urls, read_table, read_urls, url_sample

READ = {"bytes": 0, "calls": 0}


class CountingFile:
    """A file object that tallies the bytes read through it."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def read(self, size: int = -1) -> bytes:
        data = self.inner.read(size)
        READ["bytes"] += len(data)
        READ["calls"] += 1
        return data

    def readinto(self, buffer: Any) -> int:
        count = self.inner.readinto(buffer)
        READ["bytes"] += count or 0
        READ["calls"] += 1
        return count

    def __enter__(self) -> CountingFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class CountingFileSystem(LocalFileSystem):
    protocol = ("countfile",)
    root_marker = "/"

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        return super()._strip_protocol(str(path).removeprefix("countfile://"))

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        kwargs.pop("cache_type", None)
        if "r" not in mode:  # writes (staging) are not counted
            self.makedirs(self._parent(path), exist_ok=True)
            return super()._open(path, mode, **kwargs)
        return CountingFile(super()._open(path, mode, **kwargs))


fsspec.register_implementation("countfile", CountingFileSystem, clobber=True)


def measured(fn: Any) -> tuple[Any, float, int]:
    """(result, seconds, bytes read) of fn()."""
    READ["bytes"] = 0
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start, READ["bytes"]


def old_read(part: UrlPartition) -> int:
    """The pre-issue-19 partition read: the whole file, then this partition's slice."""
    fs = fsspec.filesystem("countfile")
    table = read_table(fs, part.file, (part.url_column, part.caption_column))
    batch = empty_batch()
    for index, row in enumerate(table.slice(part.start, part.count).to_pylist()):
        append_sample(batch, url_sample(row, part, part.first_key + index))
    return len(batch["__key__"])


def bench_file(path: Path, work: Path, sample: int) -> dict[str, Any]:
    cfg = SourceConfig(
        kind="urls", path=f"countfile://{path}", url_column="URL", caption_column="TEXT"
    )
    fmt = "parquet" if path.suffix == ".parquet" else "csv"
    fs = fsspec.filesystem("countfile")
    whole, whole_s, whole_bytes = measured(lambda: read_table(fs, str(path), ("URL", "TEXT")))
    parts, plan_s, plan_bytes = measured(lambda: plan_urls(cfg, {}))
    picks = [parts[i * (len(parts) - 1) // max(1, sample - 1)] for i in range(sample)]
    _, before_s, before_bytes = measured(lambda: [old_read(p) for p in picks])
    shutil.rmtree(work, ignore_errors=True)
    parts, stage_s, stage_bytes = measured(lambda: stage_sources(parts, f"countfile://{work}", {}))
    rows, read_s, read_bytes = measured(
        lambda: sum(len(read_urls(p, {})["__key__"]) for p in parts)
    )
    assert rows == whole.num_rows
    _, tables_s, _ = measured(lambda: [part_table(p, {}) for p in parts])
    unstaged = [replace(p, staged_url=None) for p in picks]
    _, unstaged_s, unstaged_bytes = measured(lambda: [read_urls(p, {}) for p in unstaged])
    return {
        "file": path.name,
        "format": fmt,
        "file_bytes": path.stat().st_size,
        "rows": whole.num_rows,
        "partitions": len(parts),
        "read_kinds": sorted({p.read + ("+staged" if p.staged_url else "") for p in parts}),
        "whole_read_s": round(whole_s, 3),
        "whole_read_bytes": whole_bytes,
        "before_s_per_partition": round(before_s / sample, 3),
        "before_bytes_per_partition": before_bytes // sample,
        "before_total_s_extrapolated": round(before_s / sample * len(parts), 1),
        "before_total_bytes_extrapolated": before_bytes // sample * len(parts),
        "after_plan_s": round(plan_s, 3),
        "after_plan_bytes": plan_bytes,
        "after_stage_s": round(stage_s, 3),
        "after_stage_bytes": stage_bytes,
        "after_read_all_s": round(read_s, 3),
        "after_read_all_bytes": read_bytes,
        "after_read_all_tables_only_s": round(tables_s, 3),
        "after_total_s": round(plan_s + stage_s + read_s, 3),
        "after_total_bytes": plan_bytes + stage_bytes + read_bytes,
        "unstaged_s_per_partition": round(unstaged_s / sample, 4),
        "unstaged_bytes_per_partition": unstaged_bytes // sample,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--row-group", type=int, default=100_000)
    parser.add_argument("--sample", type=int, default=3, help="partitions timed for 'before'")
    parser.add_argument("--formats", nargs="+", default=["parquet", "csv", "csv.gz"])
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="mmcurate-source-read-"))
    try:
        table = laion_like_table(args.rows)
        results = []
        for fmt in args.formats:
            path = folder / f"laion.{fmt}"
            if fmt == "parquet":
                write_parquet_list(table, path, args.row_group)
            else:
                write_csv_list(table, path)
            result = bench_file(path, folder / "_work", args.sample)
            print(json.dumps(result), flush=True)
            results.append(result)
        print(json.dumps({"machine": platform.machine(), "python": platform.python_version()}))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()

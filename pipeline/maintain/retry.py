"""`mmcurate retry OUTPUT [--storage-options JSON] [--no-progress]`: fetch again the samples of
a finished build that failed for a transient reason (timeouts, connection errors, 429, 5xx,
robots.txt unreachable: stages/lib/host_limits.py `transient`, and `host_paused`), and add
the recovered ones as if they had been there from the start (docs/maintenance.md).

The failed samples are found in the build's published signatures (one row per input sample,
with its drop reason) and read again from the build's own source (`source.path` as the
manifest records it: the list must still be there), keys unchanged."""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import replace
from typing import Any

from mmcurate.core.config_io import OneLineParser, add_storage_options, parse_storage_options
from mmcurate.pipeline.maintain.grow_merge import read_published
from mmcurate.pipeline.maintain.grow_run import run_grow
from mmcurate.pipeline.maintain.grow_state import (
    Finished,
    finished_build,
    new_record,
    records,
    resumed_op,
    start_op,
)
from mmcurate.pipeline.sources.partitions import plan_source
from mmcurate.pipeline.sources.records import Partition, UrlPartition
from mmcurate.stages.lib.host_limits import transient

log = logging.getLogger("mmcurate.maintain")
RETRIED = ("host_paused",)  # besides the transient reasons: a paused host's samples never went


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="mmcurate retry", description=__doc__.splitlines()[0])
    p.add_argument("output", help="a finished build's folder (output.path), any fsspec URL")
    add_storage_options(p)
    p.add_argument("--no-progress", action="store_true", help="no progress lines")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)  # a mistake: one ConfigError line
    options = parse_storage_options(args.storage_options)
    before = records(finished_build(args.output, options, "retry").manifest)
    manifest = retry(args.output, options, not args.no_progress)
    print(json.dumps(new_record(manifest, before)))
    return 0


def retry(output: str, options: dict[str, Any], progress: bool = False) -> dict[str, Any]:
    """Retry the build at `output`; returns its manifest (untouched when nothing failed)."""
    build = finished_build(output, options, "retry")
    op = resumed_op(build, "retry", None)
    if op is None:
        parts = failed_parts(build)
        if not parts:
            log.info("retry: no sample failed for a transient reason")
            return build.manifest
        op = start_op(build, "retry", None, parts)
    return run_grow(build, op, None, progress)


def failed_keys(build: Finished) -> list[str]:
    """Keys whose drop reason is transient, from the published signatures."""
    table = read_published(build.url, build.storage_options)
    if "drop_reason" not in table.column_names:
        return []
    reasons = table["drop_reason"].to_pylist()
    keys = table["key"].to_pylist()
    return [k for k, r in zip(keys, reasons, strict=True) if transient(r) or r in RETRIED]


def failed_parts(build: Finished) -> list[Partition]:
    """The source's partitions that hold failed samples, each with `only_keys` (phase A reads
    just those)."""
    keys = failed_keys(build)
    if not keys:
        return []
    parts = plan_source(build.cfg.source, build.storage_options)
    chosen = []
    for part in parts:
        mine = keys
        if isinstance(part, UrlPartition) and all(k.isdigit() for k in keys):
            first, count = part.first_key, part.count
            mine = [k for k in keys if first <= int(k) < first + count]
        if mine:
            chosen.append(replace(part, only_keys=tuple(sorted(mine))))
    return chosen


__all__ = ["main", "retry"]

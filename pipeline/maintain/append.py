"""`mmcurate append OUTPUT CONFIG.yaml [--set KEY.PATH=VALUE ...] [--storage-options JSON]`:
add new input to a finished build. CONFIG holds only `source` (the new input); its samples go
through the build's own per-sample stages (as the manifest records them), are deduplicated
and globally filtered against everything already in the build (earlier samples win ties),
and only new shards are written (docs/maintenance.md).

Keys stay unique: a URL list's new samples are numbered after the build's highest numeric
key; for other sources a key the build already has drops the new sample (`duplicate_key`)."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from typing import Any

from mmcurate.core.config_io import (
    ConfigError,
    OneLineParser,
    add_overrides,
    add_storage_options,
    load_yaml,
    parse_storage_options,
    validate,
)
from mmcurate.pipeline.config import SourceConfig
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


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="mmcurate append", description=__doc__.splitlines()[0])
    p.add_argument("output", help="a finished build's folder (output.path), any fsspec URL")
    p.add_argument("config", help="YAML holding `source:` (the new input) only")
    add_overrides(p, "source.path=more.parquet")
    add_storage_options(p)
    p.add_argument("--no-progress", action="store_true", help="no progress lines")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)  # a mistake: one ConfigError line
    source = new_source(load_yaml(args.config, args.overrides))
    options = parse_storage_options(args.storage_options)
    before = records(finished_build(args.output, options, "append").manifest)
    manifest = append(args.output, source, options, not args.no_progress)
    print(json.dumps(new_record(manifest, before)))
    return 0


def new_source(tree: dict[str, Any]) -> dict[str, Any]:
    """CONFIG's `source`, validated; any other key is refused (stages and output are the
    build's: the new samples are processed exactly as the earlier ones were)."""
    other = sorted(set(tree) - {"source"})
    if other or "source" not in tree:
        raise ConfigError(
            "append CONFIG: only `source` (the new input) is allowed; stages and output are "
            f"the build's own{f' (found {other[0]})' if other else ''}"
        )
    return json.loads(validate(SourceConfig, tree["source"]).model_dump_json())


def append(
    output: str, source: dict[str, Any], options: dict[str, Any], progress: bool = False
) -> dict[str, Any]:
    """Append `source` (a source config mapping) to the build at `output`; its manifest."""
    build = finished_build(output, options, "append")
    op = resumed_op(build, "append", source)
    if op is None:
        op = start_op(build, "append", source, numbered_parts(build, source))
    return run_grow(build, op, source, progress)


def numbered_parts(build: Finished, source: dict[str, Any]) -> list[Partition]:
    """The new source's partitions; a URL list's keys start after the build's highest."""
    parts = plan_source(SourceConfig.model_validate(source), build.storage_options)
    table = read_published(build.url, build.storage_options)
    keys = table["key"].to_pylist() if "key" in table.column_names else []
    numbers = [int(k) for k in keys if isinstance(k, str) and k.isdigit()]
    base = max(numbers) + 1 if numbers else 0
    return [
        replace(p, first_key=p.first_key + base) if isinstance(p, UrlPartition) else p
        for p in parts
    ]

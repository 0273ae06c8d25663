"""A grow operation from start to commit (`mmcurate retry`, `mmcurate append`):

1. phase A of the build itself over the new samples (pipeline/phase_a.py), into
   `_grow/build/` under its own claim: resumable by its markers;
2. the union's decisions and what they change (pipeline/maintain/grow_merge.py), staged in
   `_grow/merge/` and ended by `plan.json`: a rerun reuses a plan once written (the
   published files it was made from may already be replaced);
3. applied: existing shards that lose samples rewritten, new shards written, signatures
   replaced by the staged ones, shardindex.json, then manifest.json last; `_grow/` dropped.
Every step of 3 writes the same bytes when run again, so a rerun after kill -9 finishes it.
"""

from __future__ import annotations

import json
import logging
from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from mmcurate.core.atomic import write_bytes_atomic
from mmcurate.core.storage import filesystem, join, remove_tree
from mmcurate.pipeline.build_run import BuildRun
from mmcurate.pipeline.config import BuildConfig
from mmcurate.pipeline.maintain.grow_merge import (
    decide_union,
    kept_back,
    published_rows,
    read_published,
    undecided,
    union_table,
)
from mmcurate.pipeline.maintain.grow_publish import apply_plan, stage_signatures
from mmcurate.pipeline.maintain.grow_shards import new_shard_specs, shard_schema
from mmcurate.pipeline.maintain.grow_state import Finished, committed, sub_config
from mmcurate.pipeline.maintain.takedowns import removed_hashes, without_taken_down
from mmcurate.pipeline.output.claim import build_identity, claim_output
from mmcurate.pipeline.output.existing import read_json
from mmcurate.pipeline.output.groups import read_small_parquets
from mmcurate.pipeline.output.names import CANDIDATES, GROW_MERGE, SIGNATURES, part_file
from mmcurate.pipeline.output.shard_format import ShardSpec
from mmcurate.pipeline.output.stats import build_stats, count_rows, merge_counts
from mmcurate.pipeline.phase_a import phase_a
from mmcurate.pipeline.runtime.session import connect
from mmcurate.pipeline.sources.records import partitions_from_dicts
from mmcurate.pipeline.sources.staging import stage_sources
from mmcurate.stages.base import DROP
from mmcurate.stages.registry import build_stages

log = logging.getLogger("mmcurate.maintain")
PLAN = "plan.json"


def run_grow(
    build: Finished, op: dict[str, Any], source: dict | None, progress: bool
) -> dict[str, Any]:
    """Finish the operation `op` (fresh or resumed) on `build`; returns the new manifest."""
    fs, grow = filesystem(build.grow_url(), build.storage_options)
    if committed(build, op):  # the manifest was written: only the scratch is left
        remove_tree(fs, grow)
        return build.manifest
    sub = sub_config(build, source)
    stages = build_stages(sub.stages)
    plan = read_json(fs, join(grow, GROW_MERGE, PLAN))
    if not isinstance(plan, dict) or plan.get("op") != op["op"]:
        new = new_rows(sub, stages, op["parts"], progress)
        plan = make_plan(build, op, sub, stages, new)
    manifest = apply_plan(build, plan, candidates_url(sub))
    remove_tree(fs, grow)
    return manifest


def candidates_url(sub: BuildConfig) -> str:
    return join(sub.output.path, "_work", CANDIDATES)


def new_rows(sub: BuildConfig, stages: list, planned: list[dict], progress: bool) -> pa.Table:
    """Phase A over the new samples (resumed where a killed run left it); their rows.
    `planned`: the operation record's partitions (their dicts)."""
    parts = partitions_from_dicts(planned)
    for stage in stages:
        stage.check()
    runtime = connect(sub.ray)
    try:
        claim = claim_output(sub, build_identity(sub, parts))
        staging = partial(runtime.run_tasks, label="staging")
        staged = stage_sources(parts, claim.work_url, sub.storage_options, staging)
        phase_a(BuildRun(sub, stages, claim, runtime, progress), staged)
    finally:
        runtime.close()
    fs, folder = filesystem(join(claim.work_url, SIGNATURES), sub.storage_options)
    paths = [join(folder, part_file(p.number, "parquet")) for p in staged]
    return pa.concat_tables(read_small_parquets(fs, paths), promote_options="permissive")


def make_plan(
    build: Finished, op: dict, sub: BuildConfig, stages: list, new: pa.Table
) -> dict[str, Any]:
    """Decide over old and new rows, stage the signatures, write the plan (last)."""
    merge = build.grow_url(GROW_MERGE)
    fetched = new.num_rows
    new, taken_down = without_taken_down(new, removed_hashes(build.url, build.storage_options))
    old = read_published(build.url, build.storage_options)
    union = undecided(union_table(old, new, op["command"]), stages)
    decided = decide_union(union, stages, merge, build.storage_options)
    union, not_restored = kept_back(decided, op["command"])
    rewrite, fresh, shards = changes(union)
    specs = new_specs(build, sub, union, fresh)
    keys = union["__key__"].to_pylist()
    at = {keys[i]: i for i in fresh}
    for spec in specs:
        for _, spans in spec.parts:
            for key, *_ in spans:
                shards[at[key]] = spec.name
    count = stage_signatures(merge, published_rows(union, shards), build.storage_options)
    stats = grown_stats(build, union, stages)
    plan = {
        "op": op["op"],
        "command": op["command"],
        "rewrite": rewrite,
        "new_shards": [spec.to_dict() for spec in specs],  # read back by a resume
        "signature_files": count,
        "stats": stats,
        "record": {
            "fetched": fetched,
            "taken_down": taken_down,  # new samples a remove had taken out: left out
            "added": len(fresh),
            "dropped_from_shards": sum(len(v) for v in rewrite.values()),
            "not_restored": not_restored,
        },
    }
    fs, path = filesystem(join(merge, PLAN), build.storage_options)
    write_bytes_atomic(fs, path, json.dumps(plan).encode())
    return plan


def changes(union: pa.Table) -> tuple[dict[str, list[str]], list[int], list[str | None]]:
    """Per existing shard, the keys it loses; the new rows kept (their positions); each row's
    shard as far as the existing shards go (None for new and dropped rows)."""
    n = union.num_rows
    live = pc.is_null(union[DROP]).to_pylist()
    origin = union["__origin__"].to_pylist()
    has_old = "__old_shard__" in union.column_names
    old_shards = union["__old_shard__"].to_pylist() if has_old else [None] * n
    keys = union["__key__"].to_pylist()
    rewrite: dict[str, list[str]] = {}
    for i, key in enumerate(keys):
        if origin[i] == "old" and old_shards[i] is not None and not live[i]:
            rewrite.setdefault(old_shards[i], []).append(key)
    fresh = [i for i in range(n) if origin[i] == "new" and live[i]]
    shards = [old_shards[i] if origin[i] == "old" and live[i] else None for i in range(n)]
    return rewrite, fresh, shards


def grown_stats(build: Finished, union: pa.Table, stages: list) -> dict[str, Any] | None:
    """stats.json counted again over every row (the stages' seconds as the build measured
    them); None (stats.json left as it is) when the build's has no stage list."""
    fs, path = filesystem(join(build.url, "stats.json"), build.storage_options)
    old = read_json(fs, path)
    if not isinstance(old, dict) or not isinstance(old.get("stages"), list):
        return None
    counted = build_stats(merge_counts([count_rows(union, {})]), stages)
    seconds = {s.get("name"): s.get("seconds", 0.0) for s in old["stages"] if isinstance(s, dict)}
    for entry in counted["stages"]:
        entry["seconds"] = seconds.get(entry["name"], 0.0)
    return old | {k: counted[k] for k in ("stages", "samples_in", "samples_out")}


def new_specs(
    build: Finished, sub: BuildConfig, union: pa.Table, fresh: list[int]
) -> list[ShardSpec]:
    """The new shards' specs (after the build's last shard), with one metadata schema."""
    if not fresh:
        return []
    picked = union.take(pa.array(fresh, pa.int64()))
    rows = list(
        zip(
            picked["__key__"].to_pylist(),
            picked["__cand_part__"].to_pylist(),
            picked["__offset__"].to_pylist(),
            picked["__bytes__"].to_pylist(),
            strict=True,
        )
    )
    names = sorted(e["name"] for e in build.manifest.get("shards", []))
    first = int(names[-1].removeprefix("shard-").removesuffix(".tar")) + 1 if names else 0
    out = build.cfg.output
    specs = new_shard_specs(rows, first, out.shard_max_samples, out.shard_max_bytes)
    parts = sorted({row[1] for row in rows})
    fields, json_keys = shard_schema(
        build.url, names[0] if names else None, candidates_url(sub), parts, build.storage_options
    )
    return [spec.replace(fields=fields, json_keys=json_keys) for spec in specs]

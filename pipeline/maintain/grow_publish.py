"""Applying a grow operation's plan (pipeline/maintain/grow_run.py): each step writes the same
bytes when run again, and the manifest, written last, is the commit."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from mmcurate.core.atomic import write_bytes_atomic, write_parquet
from mmcurate.core.storage import filesystem, join, with_retries
from mmcurate.pipeline.maintain.grow_merge import MERGE_ROWS
from mmcurate.pipeline.maintain.grow_shards import filter_shard
from mmcurate.pipeline.maintain.grow_state import Finished
from mmcurate.pipeline.output.names import (
    GROW_DIR,
    GROW_MERGE,
    MANIFEST,
    shard_files,
    signatures_file,
)
from mmcurate.pipeline.output.publish import wids_index
from mmcurate.pipeline.output.shard_format import ShardSpec
from mmcurate.pipeline.output.shards import write_shard

STAGED = "publish"  # staged signature files under _grow/merge/


def stage_signatures(merge: str, table: pa.Table, options: dict[str, Any]) -> int:
    """The union's published rows as signature files of MERGE_ROWS rows, staged; how many."""
    count = max(1, -(-table.num_rows // MERGE_ROWS))
    for group in range(count):
        piece = table.slice(group * MERGE_ROWS, MERGE_ROWS)
        write_parquet(piece, join(merge, STAGED, signatures_file(group)), options)
    return count


def apply_plan(build: Finished, plan: dict[str, Any], candidates: str) -> dict[str, Any]:
    """Shards, signatures, shardindex.json, then the manifest (the commit)."""
    options = build.storage_options
    entries = {e["name"]: e for e in build.manifest.get("shards", [])}
    for name, keys in sorted(plan["rewrite"].items()):
        entry = filter_shard(build.url, name, set(keys), options)
        if entry is None:
            entries.pop(name, None)
        else:
            entries[name] = entry
    for spec in map(ShardSpec.from_dict, plan["new_shards"]):  # plan.json's JSON form
        entries[spec.name] = write_shard(spec, candidates, build.url, options)
    signatures = publish_signatures(build, plan["signature_files"])
    shards = [entries[name] for name in sorted(entries)]
    fs, root = filesystem(build.url, options)
    write_bytes_atomic(fs, join(root, "shardindex.json"), json.dumps(wids_index(shards)).encode())
    if plan.get("stats") is not None:
        stats = json.dumps(plan["stats"], indent=2).encode()
        write_bytes_atomic(fs, join(root, "stats.json"), stats)
    manifest = grown_manifest(build, plan, shards, signatures)
    write_bytes_atomic(fs, join(root, MANIFEST), json.dumps(manifest, indent=2).encode())
    return manifest


def publish_signatures(build: Finished, count: int) -> list[str]:
    """The staged signature files over the published ones; files beyond them removed."""
    fs, root = filesystem(build.url, build.storage_options)
    names = [signatures_file(g) for g in range(count)]
    for name in names:
        blob = with_retries(lambda n=name: fs.cat_file(join(root, GROW_DIR, GROW_MERGE, STAGED, n)))
        write_bytes_atomic(fs, join(root, name), blob)
    fs.invalidate_cache(join(root, "signatures"))
    extra = sorted(
        path
        for path in fs.glob(join(root, "signatures", "part-*.parquet"))
        if path.rpartition("/")[2] not in {n.rpartition("/")[2] for n in names}
    )
    if extra:
        fs.rm(extra)
    return names


def grown_manifest(
    build: Finished, plan: dict[str, Any], shards: list[dict], signatures: list[str]
) -> dict[str, Any]:
    """The build's manifest with its new shard list, file record and the operation's record."""
    manifest = dict(build.manifest)
    old_shards = {e["name"] for e in build.manifest.get("shards", [])}
    gone = {f for name in old_shards - {e["name"] for e in shards} for f in shard_files(name)}
    files = set(manifest.get("files") or []) - gone
    files = {f for f in files if not f.startswith("signatures/")} | set(signatures)
    files |= {f for e in shards for f in shard_files(e["name"])}
    manifest["files"] = sorted(files)
    manifest["shards"] = shards
    manifest["samples"] = sum(e["samples"] for e in shards)
    record = {"op": plan["op"], "command": plan["command"], "at": utc_now()}
    record |= plan["record"] | {
        "shards_rewritten": sorted(plan["rewrite"]),
        "shards_added": [s["name"] for s in plan["new_shards"]],
    }
    manifest["maintenance"] = [*(manifest.get("maintenance") or []), record]
    return manifest


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")

"""What a build publishes: the commit's per-group work, in tasks (each signature group's
signatures file, every row with its fate and shard, and its embeddings file set; nothing comes
back); and the names a build writes: outside `_work/` (what its ledger records,
pipeline/output/resume.py, and the only files a later build may delete) and inside it (its
scratch)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from mmcurate.core.formats import MANIFEST_FORMAT
from mmcurate.core.mapreduce import Runner
from mmcurate.pipeline.output.embeddings import EMBEDDING_COLUMNS, ROWS_PER_FILE, write_embeddings
from mmcurate.pipeline.output.groups import Groups, conform, read_fate, read_group, with_fate
from mmcurate.pipeline.output.layout import shard_of_rows
from mmcurate.pipeline.output.shard_format import shard_name
from mmcurate.pipeline.output.signatures import signatures_file, write_signatures
from mmcurate.stages.base import DROP

MANIFEST = "manifest.json"
BUILD_ID = re.compile(r"[0-9a-f]{64}")
# Names a build writes: a file there that no build of ours recorded would be overwritten.
RESERVED_FILES = (
    *(MANIFEST, "stats.json", "report.html", "shardindex.json", "buckets.json"),
    "audit.jsonl",  # `mmcurate remove`'s record of what it took out (pipeline/maintain/)
)
PUBLISHED_FOLDERS = ("signatures", "embeddings")
SHARD_PREFIX = "shard-"
ATOMIC_TMP = re.compile(r"(.+)\.tmp-[0-9a-f]{32}")  # atomic.write_bytes_atomic's temp names


@dataclass(frozen=True)
class Publication:
    """What every group's task needs besides its own rows: plain data."""

    output: str
    final_round: str
    schema: pa.Schema  # the union of the partitions' signature columns
    kept_starts: list[int]  # global kept position of each group's first kept row
    shard_starts: list[int]  # global kept position of each shard's first row


def publish(groups: Groups, plan: Publication, runner: Runner) -> None:
    """Every group's published files."""
    runner.run(publish_group, [(groups, plan, g) for g in range(groups.count)])


def publish_group(groups: Groups, plan: Publication, group: int) -> None:
    """Task body: one group's signatures file and embeddings."""
    table = conform(read_group(groups, group), plan.schema)
    table = with_fate(table, read_fate(groups, plan.final_round, group))
    table = table.append_column("shard", shard_column(table, plan, group))
    write_signatures(plan.output, table, groups.storage_options, group)
    write_embeddings(plan.output, table, groups.storage_options, group)


def shard_column(table: pa.Table, plan: Publication, group: int) -> pa.Array:
    """Each kept row's shard name (null for dropped rows)."""
    kept = pc.is_null(table[DROP]).to_numpy(zero_copy_only=False)
    positions = plan.kept_starts[group] + np.cumsum(kept) - 1
    names = np.full(table.num_rows, None, dtype=object)
    if kept.any():
        index = shard_of_rows(positions[kept], plan.shard_starts)
        names[kept] = [shard_name(int(i)) for i in index]
    return pa.array(names.tolist(), pa.string())  # a list: an ndarray imports numpy.ma (~20 ms)


# ---- the names a build writes outside _work/ ------------------------------------------------


def in_namespace(rel: str) -> bool:
    """Names a build records outside _work: the fixed files, shard-*, signatures/, embeddings/."""
    top, _, rest = rel.partition("/")
    if top in PUBLISHED_FOLDERS:
        return bool(rest)
    return not rest and (top in RESERVED_FILES or top.startswith(SHARD_PREFIX))


def safe_recorded(names: Any) -> list[str]:
    """Recorded names a build may delete: relative, inside our namespace, no `..` (a forged or
    damaged record can never point a deletion anywhere else)."""
    if not isinstance(names, list):
        return []
    ok = []
    for name in names:
        parts = name.split("/") if isinstance(name, str) else [""]
        if all(p not in ("", ".", "..") for p in parts) and in_namespace(name):
            ok.append(name)
    return ok


def temp_of(rel: str) -> str | None:
    """`x` for `x.tmp-<uuid>` (an atomic write a crash interrupted), else None."""
    match = ATOMIC_TMP.fullmatch(rel)
    return match.group(1) if match else None


def embedding_files(count: int) -> list[str]:
    """Every name pipeline.output.embeddings may write for `count` file sets (one per group)."""
    folders = [*EMBEDDING_COLUMNS.values(), "metadata"]
    return [
        f"embeddings/{f}/{f}_{i:04d}.{'parquet' if f == 'metadata' else 'npy'}"
        for i in range(count)
        for f in folders
    ]


def shard_files(name: str) -> list[str]:
    """A final shard and its metadata parquet (pipeline.output.shards.write_shard)."""
    return [name, name.removesuffix(".tar") + ".parquet"]


def output_files(shards: list[str], groups: int) -> list[str]:
    """Every file (but the manifest) a build with these shards and signature groups may write."""
    fixed = ["stats.json", "shardindex.json", "report.html", "buckets.json"]  # buckets: if asked
    fixed += [signatures_file(g) for g in range(max(1, groups))]
    return fixed + embedding_files(groups) + [f for name in shards for f in shard_files(name)]


def manifest_files(manifest: dict) -> set[str]:
    """What a finished build wrote: its `files` record, or for a manifest from before that
    record existed, the names such a build wrote (one signatures file, embeddings per 1M)."""
    if "files" in manifest:
        return {MANIFEST, *safe_recorded(manifest["files"])}
    shards = manifest.get("shards")
    names = (
        [e.get("name") for e in shards if isinstance(e, dict)] if isinstance(shards, list) else []
    )
    samples = manifest.get("samples")
    rows = samples if isinstance(samples, int) and samples > 0 else 0
    derived = output_files([n for n in names if isinstance(n, str)], 0)
    derived += embedding_files(-(-rows // ROWS_PER_FILE))
    return {MANIFEST, *safe_recorded(derived)}


def ours_manifest(value: Any) -> dict | None:
    """The manifest if an mmcurate build wrote it (format and build id), else None."""
    if isinstance(value, dict) and value.get("format") == MANIFEST_FORMAT:
        build_id = value.get("build_id")
        if isinstance(build_id, str) and BUILD_ID.fullmatch(build_id):
            return value
    return None


def wids_index(entries: list[dict]) -> dict[str, Any]:
    """The shard index `wids` (webdataset's indexed reader) loads; urls relative to it."""
    shards = [{"url": e["name"], "nsamples": e["samples"], "filesize": e["bytes"]} for e in entries]
    return {"__kind__": "wids-shard-index-v1", "wids_version": 1, "shardlist": shards}

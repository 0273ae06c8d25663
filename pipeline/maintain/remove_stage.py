"""`mmcurate remove`, step 2: every changed output file written whole under
`_work/remove/staged/<its name>`, from the plan and the untouched originals; then
`_work/remove/staged.json` lists the swaps in their order (remove_swap.py), the manifest last.

Shards are cut with the build's own writer: the runs of samples that stay are copied byte for
byte (by the kernel on local disks) and hashed as they go, then the two zero blocks that end
a tar; a shard left with no samples is deleted instead. The shard parquets, signatures and
embeddings lose the removed rows (embeddings' arrays and metadata stay aligned row for row);
buckets.json is counted again from the signatures; stats.json gets a `remove` stage.
"""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
import pyarrow.parquet as pq
from mmcurate.core.atomic import open_atomic, write_bytes_atomic, write_parquet
from mmcurate.core.storage import is_local, join, with_retries
from mmcurate.pipeline.maintain.common import FinishedBuild
from mmcurate.pipeline.maintain.remove_audit import (
    AUDIT,
    audit_bytes,
    buckets_after,
    stats_after,
)
from mmcurate.pipeline.maintain.remove_plan import end_bytes, kept_runs, mask_of, signature_files
from mmcurate.pipeline.output.embeddings import EMBEDDING_COLUMNS
from mmcurate.pipeline.output.names import (
    MANIFEST,
    REMOVE,
    REMOVE_STAGED,
    WORK_DIR,
    manifest_files,
    remove_file,
    shard_files,
)
from mmcurate.pipeline.output.names import remove_staged as staged_name
from mmcurate.pipeline.output.publish import wids_index
from mmcurate.pipeline.output.shards import KERNEL_COPY, HashingWriter, block_batches

NPY_CHUNK = 64 << 20  # bytes of embedding rows filtered at a time


def staged_url(build: FinishedBuild, rel: str = "") -> str:
    """The staged copy of output file `rel` as a URL (the staged folder for "")."""
    base = join(build.url, WORK_DIR, REMOVE, REMOVE_STAGED)
    return join(base, rel) if rel else base


def stage_all(build: FinishedBuild, plan: dict[str, Any]) -> dict[str, Any]:
    """Write every staged file, then staged.json (the swaps and the summary); returns it."""
    old = {s["name"]: s for s in build.manifest["shards"]}
    new: dict[str, dict | None] = {}
    for name, shard in plan["shards"].items():
        new[name] = stage_shard(build, name, shard, old[name]["samples"] - len(shard["keys"]))
        stage_shard_metadata(build, name, set(shard["keys"]), new[name] is None)
    for rel, keys in plan["signatures"].items():
        stage_rows(build, rel, set(keys))
    removed = {key for shard in plan["shards"].values() for key in shard["keys"]}
    embeddings = stage_embeddings(build, removed)
    entries = [new.get(s["name"], s) for s in build.manifest["shards"]]
    entries = [e for e in entries if e is not None]
    summary = summarize(build, plan, entries, new)
    rest = stage_documents(build, plan, entries, summary)
    names = files_of(build)
    actions = [[f, "delete" if new[n] is None else "replace"] for n in new for f in shard_files(n)]
    actions = [a for a in actions if a[0] in names]  # a shard's parquet, where it has one
    actions += [[rel, "replace"] for rel in [*plan["signatures"], *embeddings, *rest]]
    actions += [[MANIFEST, "replace"]]
    staged = {"actions": actions, "summary": summary, "request": plan["request"]}
    write_bytes_atomic(
        build.fs, build.work(remove_file("staged.json")), json.dumps(staged).encode()
    )
    return staged


def files_of(build: FinishedBuild) -> set[str]:
    return manifest_files(build.manifest)


def stage_shard(
    build: FinishedBuild, name: str, shard: dict[str, Any], samples: int
) -> dict[str, Any] | None:
    """The shard without the removed samples; its manifest entry (None: nothing left)."""
    if samples <= 0:
        return None
    source, runs = build.path(name), kept_runs(shard)
    with open_atomic(build.fs, build.work(staged_name(name))) as target:
        with HashingWriter(target) as out:
            if is_local(build.fs) and KERNEL_COPY:
                out.copy_runs(source, runs)
            else:
                for batch in block_batches(runs):
                    starts, ends = [a for a, _ in batch], [b for _, b in batch]
                    blobs = with_retries(
                        lambda: build.fs.cat_ranges([source] * len(starts), starts, ends)  # noqa: B023
                    )
                    for blob in blobs:
                        out.write(blob)
                    del blobs
            out.write(end_bytes())
    return {"name": name, "samples": samples, "bytes": out.size, "sha256": out.sha256}


def stage_shard_metadata(build: FinishedBuild, name: str, keys: set[str], empty: bool) -> None:
    """The shard's metadata parquet without the removed rows (nothing when it is deleted)."""
    rel = shard_files(name)[1]
    if not empty and rel in files_of(build) and build.fs.exists(build.path(rel)):
        stage_rows(build, rel, keys)


def stage_rows(build: FinishedBuild, rel: str, keys: set[str], column: str = "key") -> int:
    """A parquet file (schema and footer kept) without the rows whose `column` is in `keys`;
    returns the rows left."""
    with build.fs.open(build.path(rel), "rb") as f:
        table = pq.ParquetFile(f).read()
    table = table.filter(mask_of(table[column].to_pylist(), keys))
    write_parquet(table, staged_url(build, rel), build.storage_options)
    return table.num_rows


def stage_embeddings(build: FinishedBuild, removed: set[str]) -> list[str]:
    """Each embeddings file set holding a removed sample, its rows removed from the metadata
    and from every array alike; returns the staged names."""
    staged = []
    names = files_of(build)
    for rel in sorted(n for n in names if n.startswith("embeddings/metadata/")):
        with build.fs.open(build.path(rel), "rb") as f:
            keys = pq.ParquetFile(f).read(columns=["key"])["key"].to_pylist()
        keep = mask_of(keys, removed)
        if keep.all():
            continue
        index = rel.rsplit("_", 1)[1].removesuffix(".parquet")
        stage_rows(build, rel, removed)
        staged.append(rel)
        for folder in EMBEDDING_COLUMNS.values():
            array = f"embeddings/{folder}/{folder}_{index}.npy"
            if array in names and build.fs.exists(build.path(array)):
                filter_npy(build, array, keep)
                staged.append(array)
    return staged


def filter_npy(build: FinishedBuild, rel: str, keep: np.ndarray) -> None:
    """A 2-D .npy without the rows `keep` marks False, streamed in chunks of rows: the array
    is never held whole. The header is np.save's for the smaller array."""
    fmt = np.lib.format
    with build.fs.open(build.path(rel), "rb") as f:
        version = fmt.read_magic(f)
        read_header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
        shape, fortran, dtype = read_header(f)
        width = int(np.prod(shape[1:], dtype=np.int64))
        header = {"descr": fmt.dtype_to_descr(dtype), "fortran_order": fortran}
        header["shape"] = (int(keep.sum()), *shape[1:])
        row_bytes = width * dtype.itemsize
        per_chunk = max(1, NPY_CHUNK // max(1, row_bytes))
        with open_atomic(build.fs, build.work(staged_name(rel))) as out:
            head = io.BytesIO()
            fmt.write_array_header_1_0(head, header)  # np.save's choice for a small header
            out.write(head.getvalue())
            for at in range(0, shape[0], per_chunk):
                rows = min(per_chunk, shape[0] - at)
                block = np.frombuffer(f.read(rows * row_bytes), dtype=dtype).reshape(rows, -1)
                out.write(block[keep[at : at + rows]].tobytes())


def summarize(
    build: FinishedBuild, plan: dict[str, Any], entries: list[dict], new: dict[str, dict | None]
) -> dict[str, Any]:
    """What the command prints and the audit records (counts and names, never content)."""
    rewritten = sorted(n for n, e in new.items() if e is not None)
    return {
        "removed": sum(len(s["keys"]) for s in plan["shards"].values()),
        "signature_rows_deleted": sum(len(k) for k in plan["signatures"].values()),
        "samples_before": build.manifest["samples"],
        "samples_after": sum(e["samples"] for e in entries),
        "shards_rewritten": rewritten,
        "shards_deleted": sorted(n for n, e in new.items() if e is None),
        "bytes_rewritten": sum(new[n]["bytes"] for n in rewritten),
        "bytes_total": sum(e["bytes"] for e in entries),
    }


def stage_documents(
    build: FinishedBuild, plan: dict[str, Any], entries: list[dict], summary: dict[str, Any]
) -> list[str]:
    """buckets.json (if the build has one), stats.json, shardindex.json, audit.jsonl and the
    manifest, staged; returns their names but the manifest's (always swapped last)."""
    staged: list[str] = []

    def put(rel: str, data: bytes) -> None:
        write_bytes_atomic(build.fs, build.work(staged_name(rel)), data)
        if rel != MANIFEST:
            staged.append(rel)

    names = files_of(build)
    groups = [(rel, rel in plan["signatures"]) for rel in signature_files(build)]
    buckets = buckets_after(build, groups, staged_url(build)) if "buckets.json" in names else None
    if buckets is not None:
        put("buckets.json", json.dumps(buckets, indent=2).encode())
    if "stats.json" in names and build.fs.exists(build.path("stats.json")):
        stats = json.loads(build.fs.cat_file(build.path("stats.json")))
        put("stats.json", json.dumps(stats_after(stats, plan, summary), indent=2).encode())
    put("shardindex.json", json.dumps(wids_index(entries)).encode())
    put(AUDIT, audit_bytes(build, plan, summary))
    put(MANIFEST, json.dumps(manifest_after(build, entries, summary), indent=2).encode())
    return staged


def manifest_after(
    build: FinishedBuild, entries: list[dict], summary: dict[str, Any]
) -> dict[str, Any]:
    """The manifest with the new shard entries and count; its files lose deleted shards and
    gain the audit log (so --overwrite and reruns know it is the build's)."""
    manifest = dict(build.manifest)
    manifest["samples"] = sum(e["samples"] for e in entries)
    manifest["shards"] = entries
    gone = {f for name in summary["shards_deleted"] for f in shard_files(name)}
    files = build.manifest.get("files")
    if isinstance(files, list):
        manifest["files"] = sorted({*files, AUDIT} - gone)
    return manifest

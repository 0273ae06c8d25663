"""Final shard layout (pure planning) and writing one planned shard (runs in a Ray task).

Samples keep the source order: sorted by (partition, index). Shards are filled greedily up
to `shard_max_samples` samples and `shard_max_bytes` bytes (a single larger sample gets a shard
of its own). Names are `shard-000000.tar`, ..., so the same input gives the same layout.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.storage import filesystem, join, put_file_atomic
from pipeline.tario import iter_tar_samples, write_tar

TAR_END_BYTES = 1024  # two zero blocks close a tar


def shard_name(index: int) -> str:
    return f"shard-{index:06d}.tar"


def candidate_name(part: int) -> str:
    return f"part-{part:06d}.tar"


def plan_shards(sizes: list[int], max_samples: int, max_bytes: int) -> list[tuple[int, int]]:
    """Greedy contiguous [start, end) ranges over samples of the given tar sizes."""
    ranges: list[tuple[int, int]] = []
    start, used = 0, TAR_END_BYTES
    for i, size in enumerate(sizes):
        full = i - start >= max_samples or (i > start and used + size > max_bytes)
        if full:
            ranges.append((start, i))
            start, used = i, TAR_END_BYTES
        used += size
    if start < len(sizes):
        ranges.append((start, len(sizes)))
    return ranges


def shard_specs(kept: list[dict[str, Any]], max_samples: int, max_bytes: int) -> list[dict]:
    """kept rows (`__key__`, `__part__`, `__bytes__`, in output order) -> one spec per shard."""
    ranges = plan_shards([row["__bytes__"] for row in kept], max_samples, max_bytes)
    specs = []
    for index, (start, end) in enumerate(ranges):
        rows = kept[start:end]
        specs.append(
            {
                "name": shard_name(index),
                "keys": [row["__key__"] for row in rows],
                "parts": parts_and_keys(rows),
            }
        )
    return specs


def parts_and_keys(rows: list[dict[str, Any]]) -> list[tuple[int, list[str]]]:
    """[(partition, its keys in this shard)] in order: a key is read from its own partition."""
    grouped: dict[int, list[str]] = {}
    for row in rows:
        grouped.setdefault(row["__part__"], []).append(row["__key__"])
    return sorted(grouped.items())


def iter_wanted(candidates_url: str, spec: dict, storage_options: dict) -> Iterator[dict]:
    """Stream the spec's samples out of candidate tars, in output order."""
    for part, keys in spec["parts"]:
        wanted = set(keys)
        fs, path = filesystem(join(candidates_url, candidate_name(part)), storage_options)
        with fs.open(path, "rb") as fileobj:
            for sample in iter_tar_samples(fileobj):
                if sample["__key__"] in wanted:
                    yield sample


def write_shard(spec: dict, candidates_url: str, output_url: str, storage_options: dict) -> dict:
    """Write one final shard atomically; returns its manifest entry."""
    with tempfile.TemporaryDirectory(prefix="mmcurate-shard-") as tmp:
        local = os.path.join(tmp, spec["name"])
        metadata: list[dict[str, Any]] = []
        samples = collect_metadata(iter_wanted(candidates_url, spec, storage_options), metadata)
        with open(local, "wb") as out:
            count = write_tar(samples, out)
        if count != len(spec["keys"]):
            raise RuntimeError(f"{spec['name']}: expected {len(spec['keys'])} samples, got {count}")
        digest = file_sha256(local)
        size = os.path.getsize(local)
        fs, path = filesystem(join(output_url, spec["name"]), storage_options)
        put_file_atomic(fs, local, path)
        write_metadata_parquet(fs, path.removesuffix(".tar") + ".parquet", metadata, tmp)
    return {"name": spec["name"], "samples": count, "bytes": size, "sha256": digest}


def collect_metadata(samples: Iterator[dict], into: list[dict[str, Any]]) -> Iterator[dict]:
    """Pass samples through, recording key, caption and JSON fields of each (img2dataset's
    per-shard parquet)."""
    for sample in samples:
        meta = json.loads(sample["json"]) if sample.get("json") else {}
        caption = sample.get("txt")
        row = {
            "key": sample["__key__"],
            "caption": caption.decode("utf-8") if isinstance(caption, bytes) else caption,
        }
        row.update({k: v for k, v in meta.items() if k not in row})
        into.append(row)
        yield sample


def write_metadata_parquet(fs: Any, path: str, rows: list[dict[str, Any]], tmp: str) -> None:
    """Scalar JSON values keep their type; lists, dicts and mixed columns become JSON text."""
    names = sorted({name for row in rows for name in row}, key=lambda n: (n != "key", n))
    columns = {}
    for name in names:
        values = [row.get(name) for row in rows]
        try:
            columns[name] = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            columns[name] = pa.array([None if v is None else json.dumps(v) for v in values])
        if pa.types.is_nested(columns[name].type):
            columns[name] = pa.array([None if v is None else json.dumps(v) for v in values])
    local = os.path.join(tmp, "meta.parquet")
    pq.write_table(
        pa.table(columns) if names else pa.table({"key": pa.array([], pa.string())}), local
    )
    put_file_atomic(fs, local, path)


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as src:
        for block in iter(lambda: src.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()

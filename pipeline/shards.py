"""Final shard layout (pure planning) and writing one planned shard (runs in a Ray task).

Samples keep the source order: sorted by (partition, index). Shards are filled greedily up
to `shard_max_samples` samples and `shard_max_bytes` bytes (a single larger sample gets a shard
of its own). Names are `shard-000000.tar`, ..., so the same input gives the same layout.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
from typing import IO, Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.storage import filesystem, join, put_file_atomic, with_retries, write_parquet

TAR_END_BYTES = 1024  # two zero blocks close a tar


def shard_name(index: int) -> str:
    return f"shard-{index:06d}.tar"


def candidate_name(part: int) -> str:
    return f"part-{part:06d}.tar"


def metadata_name(part: int) -> str:
    return f"part-{part:06d}.parquet"


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
    """kept rows (`__key__`, `__part__`, `__offset__`, `__bytes__`, in output order) -> one spec
    per shard: its name and, per candidate partition, the (key, offset, length) to copy."""
    ranges = plan_shards([row["__bytes__"] for row in kept], max_samples, max_bytes)
    specs = []
    for index, (start, end) in enumerate(ranges):
        grouped: dict[int, list[tuple[str, int, int]]] = {}
        for row in kept[start:end]:
            span = (row["__key__"], row["__offset__"], row["__bytes__"])
            grouped.setdefault(row["__part__"], []).append(span)
        specs.append(
            {"name": shard_name(index), "samples": end - start, "parts": sorted(grouped.items())}
        )
    return specs


def merged_runs(spans: list[tuple[str, int, int]]) -> list[tuple[int, int]]:
    """Adjacent (offset, length) spans joined into (start, end) byte runs: fewer reads."""
    runs: list[list[int]] = []
    for _, offset, length in spans:
        if runs and runs[-1][1] == offset:
            runs[-1][1] = offset + length
        else:
            runs.append([offset, offset + length])
    return [(start, end) for start, end in runs]


def copy_spans(candidates_url: str, spec: dict, storage_options: dict, out: IO[bytes]) -> None:
    """Append the spec's sample records, in order, from the candidate tars to `out`."""
    for part, spans in spec["parts"]:
        fs, path = filesystem(join(candidates_url, candidate_name(part)), storage_options)
        runs = merged_runs(spans)
        starts, ends = [a for a, _ in runs], [b for _, b in runs]
        blobs = with_retries(lambda: fs.cat_ranges([path] * len(runs), starts, ends))  # noqa: B023
        for blob in blobs:
            out.write(blob)


def spec_metadata(candidates_url: str, spec: dict, storage_options: dict) -> list[dict]:
    """Per-sample metadata rows of the spec's samples, from the candidates' metadata tables."""
    rows: list[dict[str, Any]] = []
    for part, spans in spec["parts"]:
        fs, path = filesystem(join(candidates_url, metadata_name(part)), storage_options)
        blob = with_retries(lambda: fs.cat_file(path))  # noqa: B023
        by_key = {r["__key__"]: r for r in pq.read_table(io.BytesIO(blob)).to_pylist()}
        rows.extend(metadata_row(by_key[key]) for key, _, _ in spans)
    return rows


def metadata_row(record: dict[str, Any]) -> dict[str, Any]:
    meta = json.loads(record["json"]) if record.get("json") else {}
    row = {"key": record["__key__"], "caption": record.get("txt")}
    row.update({k: v for k, v in meta.items() if k not in row})
    return row


def write_shard(spec: dict, candidates_url: str, output_url: str, storage_options: dict) -> dict:
    """Write one final shard atomically; returns its manifest entry."""
    with tempfile.TemporaryDirectory(prefix="mmcurate-shard-") as tmp:
        local = os.path.join(tmp, spec["name"])
        with open(local, "wb") as out:
            copy_spans(candidates_url, spec, storage_options, out)
            out.write(b"\0" * TAR_END_BYTES)
        digest = file_sha256(local)
        size = os.path.getsize(local)
        fs, path = filesystem(join(output_url, spec["name"]), storage_options)
        put_file_atomic(fs, local, path)
        metadata = spec_metadata(candidates_url, spec, storage_options)
        meta_url = join(output_url, spec["name"].removesuffix(".tar") + ".parquet")
        write_parquet(metadata_table(metadata), meta_url, storage_options)
    return {"name": spec["name"], "samples": spec["samples"], "bytes": size, "sha256": digest}


def metadata_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Scalar JSON values keep their type; lists, dicts and mixed columns become JSON text."""
    names = sorted({name for row in rows for name in row}, key=lambda n: (n != "key", n))
    if not names:
        return pa.table({"key": pa.array([], pa.string())})
    return pa.table({name: metadata_column([row.get(name) for row in rows]) for name in names})


def metadata_column(values: list[Any]) -> pa.Array:
    try:
        array = pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        array = None
    if array is None or pa.types.is_nested(array.type):
        array = pa.array([None if v is None else json.dumps(v) for v in values])
    return array


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as src:
        for block in iter(lambda: src.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()

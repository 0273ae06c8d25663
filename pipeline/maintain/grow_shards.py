"""The grow commands' shards: an existing shard rewritten without the samples the new
decisions drop (its other records copied byte for byte), and the new kept samples laid out
in new shards after the last one, written by the build's own shard writer from the new
samples' candidate tars (pipeline/output/shards.py). Both are idempotent: a rerun after a
crash writes the same bytes."""

from __future__ import annotations

import hashlib
import tarfile
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
from mmcurate.core.atomic import open_atomic, write_parquet
from mmcurate.core.mapreduce import LocalRunner
from mmcurate.core.storage import filesystem, join
from mmcurate.pipeline.output.layout import ShardPlanner
from mmcurate.pipeline.output.shard_format import TAR_END_BYTES, ShardSpec, Span, shard_name
from mmcurate.pipeline.output.shard_metadata import footer_schema, merge_fields, plan_shard_schema

BLOCK = 512
COPY_BLOCK = 8 << 20  # bytes per read when a shard is copied or hashed


def record_spans(source: Any) -> list[tuple[str, int, int]]:
    """(key, start, end) of each member of a shard's tar (an open file), headers included (a
    sample's members are `<key>.<ext>`: keys have no dots). Only headers are read."""
    spans = []
    with tarfile.open(fileobj=source, mode="r:") as tar:
        for member in tar:
            end = member.offset_data + -(-member.size // BLOCK) * BLOCK
            spans.append((member.name.partition(".")[0], member.offset, end))
    return spans


def copy_spans(source: Any, spans: list[tuple[int, int]], out: Any, digest: Any) -> int:
    """Append byte ranges of `source` to `out` in blocks of COPY_BLOCK, hashing them."""
    size = 0
    for start, end in spans:
        source.seek(start)
        while start < end:
            data = source.read(min(COPY_BLOCK, end - start))
            if not data:
                raise OSError(f"shard ended at byte {start}, before {end}")
            out.write(data)
            digest.update(data)
            start += len(data)
            size += len(data)
    return size


def filter_shard(
    output: str, name: str, drop: set[str], options: dict[str, Any]
) -> dict[str, Any] | None:
    """Rewrite shard `name` without the samples keyed in `drop` (and its metadata parquet);
    its manifest entry, or None when no sample is left (both files then deleted). Streams:
    memory holds one block, never the shard."""
    fs, path = filesystem(join(output, name), options)
    meta_path = path.removesuffix(".tar") + ".parquet"
    if not fs.exists(meta_path):  # emptied by an earlier run of this command (metadata first)
        if fs.exists(path):
            fs.rm_file(path)
        return None
    meta = pq.read_table(fs.open(meta_path, "rb"))
    kept_meta = meta.filter(pc.invert(pc.is_in(meta["key"], value_set=_strings(drop))))
    if kept_meta.num_rows == 0:
        fs.rm_file(meta_path)
        fs.rm_file(path)
        return None
    digest = hashlib.sha256()
    with fs.open(path, "rb") as source:
        spans = record_spans(source)
        kept = [(a, b) for key, a, b in spans if key not in drop]
        if len(kept) == len(spans):  # nothing of it to drop (or dropped by an earlier run)
            size = copy_spans(source, [(0, fs.size(path))], NoWrite(), digest)
        else:
            with open_atomic(fs, path) as out:
                size = copy_spans(source, kept, out, digest)
                out.write(b"\0" * TAR_END_BYTES)
                digest.update(b"\0" * TAR_END_BYTES)
                size += TAR_END_BYTES
    if kept_meta.num_rows != meta.num_rows:
        write_parquet(kept_meta, join(output, name.removesuffix(".tar") + ".parquet"), options)
    entry = {"name": name, "samples": kept_meta.num_rows, "bytes": size}
    return entry | {"sha256": digest.hexdigest()}


class NoWrite:
    """An output that keeps nothing (hashing an unchanged shard)."""

    def write(self, data: bytes) -> int:
        return len(data)


def _strings(values: set[str]) -> Any:
    import pyarrow as pa

    return pa.array(sorted(values), pa.string())


def new_shard_specs(
    rows: list[tuple[str, int, int, int]], first: int, max_samples: int, max_bytes: int
) -> list[ShardSpec]:
    """Shards for the new kept rows (key, candidate part, offset, bytes) in output order,
    named from `shard-<first>` on, filled as a build fills its shards."""
    planner = ShardPlanner(max_samples, max_bytes)
    planner.feed(np.array([row[3] for row in rows], dtype=np.int64))
    specs = []
    for i, (start, stop) in enumerate(planner.ranges()):
        grouped: dict[int, list[Span]] = {}
        for key, part, offset, size in rows[start:stop]:
            grouped.setdefault(part, []).append((key, offset, size))
        parts = tuple(sorted(grouped.items()))
        specs.append(ShardSpec(shard_name(first + i), stop - start, parts=parts))
    return specs


def shard_schema(
    output: str, old_shard: str | None, candidates: str, parts: list[int], options: dict
) -> tuple[dict[str, str], list[str]]:
    """One metadata schema and json key set for the new shards: the build's (from an existing
    shard's footer) merged with the new candidates'."""
    fields, keys = plan_shard_schema(candidates, parts, options, LocalRunner())
    if old_shard is not None:
        fs, path = filesystem(join(output, old_shard.removesuffix(".tar") + ".parquet"), options)
        if fs.exists(path):
            old_fields, old_keys = footer_schema(fs, path)
            fields = merge_fields(old_fields or {}, fields)
            keys = sorted({*(old_keys or []), *keys})
    return fields, keys

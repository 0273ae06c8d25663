"""The done markers of a build's tasks (a partition's, a shard's), which a rerun trusts only when
they name its build and a run it trusts (pipeline/output/claim.py)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from mmcurate.core.atomic import write_bytes_atomic
from mmcurate.core.storage import cat_many, filesystem, join
from mmcurate.pipeline.output.names import (
    PARTS,
    SHARDS,
    SIGNATURES,
    part_file,
    part_number,
    shard_marker_name,
)

if TYPE_CHECKING:
    from mmcurate.pipeline.output.claim import Claim


def part_marker(work_url: str, part: int) -> str:
    """Written just before the partition's signatures (its completion mark): who wrote them."""
    return join(work_url, PARTS, part_file(part, "json"))


def shard_marker(work_url: str, name: str) -> str:
    return join(work_url, SHARDS, shard_marker_name(name))


ENTRY_KEYS = ("name", "samples", "bytes", "sha256")  # a shard's manifest entry


def mark(claim: Claim, url: str, record: dict[str, Any]) -> None:
    """A done marker: `record` plus this build's id and this run's."""
    fs, path = filesystem(url, claim.storage_options)
    write_bytes_atomic(fs, path, json.dumps(record | claim.stamp()).encode())


def done_parts(claim: Claim) -> set[int]:
    """Partitions whose signatures exist and whose marker names this build and a run it trusts."""
    fs, folder = filesystem(join(claim.work_url, SIGNATURES), claim.storage_options)
    fs.invalidate_cache(folder)  # other processes wrote there: never trust a cached listing
    found = fs.glob(join(folder, "part-*.parquet")) if fs.exists(folder) else []
    signed = {part_number(path.rpartition("/")[2]) for path in found}
    trusted = {part_number(f"{name}.json") for name in done_records(claim, PARTS)}
    return {part for part in signed & trusted if part is not None}


def done_shards(claim: Claim) -> dict[str, dict]:
    """Manifest entries of final shards already written by this build and a run it trusts."""
    records = done_records(claim, SHARDS).values()
    return {r["name"]: {key: r[key] for key in ENTRY_KEYS} for r in records}


def done_records(claim: Claim, folder: str) -> dict[str, dict]:
    """The markers in `_work/<folder>/` that name this build and a run it trusts, by name."""
    fs, path = filesystem(join(claim.work_url, folder), claim.storage_options)
    fs.invalidate_cache(path)
    paths = fs.glob(join(path, "*.json")) if fs.exists(path) else []
    found = {}
    for name, blob in cat_many(fs, paths).items():
        try:
            record = json.loads(blob) if isinstance(blob, bytes) else None
        except ValueError:
            continue  # not a marker of ours
        if claim.trusts(record):
            found[name.rpartition("/")[2].removesuffix(".json")] = record
    return found

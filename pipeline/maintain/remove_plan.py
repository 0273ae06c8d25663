"""`mmcurate remove`, step 1: the plan. Which signature rows go (every file), which shards hold
them and where each removed sample's bytes lie in its shard (from the tar's own headers), and
the hashes the audit keeps; written to `_work/remove/plan.json` before anything changes, so a
rerun after a kill stages exactly the same files.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
import time
from typing import Any

import numpy as np
import pyarrow.parquet as pq
from mmcurate.core.atomic import write_bytes_atomic
from mmcurate.core.config_io import ConfigError
from mmcurate.core.storage import with_retries
from mmcurate.core.tario import regular_member, split_member_name
from mmcurate.pipeline.maintain.common import FinishedBuild
from mmcurate.pipeline.maintain.remove_select import COLUMN, Request, matches, near_options
from mmcurate.pipeline.output.existing import read_json
from mmcurate.pipeline.output.names import manifest_files, remove_file
from mmcurate.pipeline.output.shard_format import TAR_END_BYTES

PLAN_FORMAT = "mmcurate-remove-plan/1"
BLOCK = tarfile.BLOCKSIZE


def signature_files(build: FinishedBuild) -> list[str]:
    """The build's published signatures files (relative names), in order."""
    return sorted(n for n in manifest_files(build.manifest) if n.startswith("signatures/"))


def check_shards(build: FinishedBuild) -> None:
    """Every shard the manifest lists is there at its size: a folder whose shards were changed
    behind the manifest's back (an interrupted remove whose scratch was deleted) is refused."""
    build.fs.invalidate_cache(build.root)
    sizes = {
        e["name"].rstrip("/").rsplit("/", 1)[-1]: e.get("size")
        for e in build.fs.ls(build.root, detail=True)
    }
    wrong = [s["name"] for s in build.manifest["shards"] if sizes.get(s["name"]) != s["bytes"]]
    if wrong:
        raise ConfigError(
            f"{build.url}: {len(wrong)} shard(s) differ from the manifest ({wrong[0]}, ...); "
            "rebuild with --overwrite"
        )


def make_plan(build: FinishedBuild, request: Request) -> dict[str, Any] | None:
    """The plan for `request` (None when it matches nothing), written before it returns."""
    radius = near_options(build.manifest)["radius"] if request.kind == "like" else 0
    rows: dict[str, list[str]] = {}
    shards: dict[str, list[str]] = {}
    content: list[str] = []
    for rel in signature_files(build):
        table = read_columns(build, rel, request.kind)
        hit = matches(request, table, radius)
        if not hit.any():
            continue
        chosen = table.filter(hit).to_pylist()
        rows[rel] = sorted(r["key"] for r in chosen)
        for row in chosen:
            if row.get("shard"):
                shards.setdefault(row["shard"], []).append(row["key"])
                content += [row["sha256"]] if row.get("sha256") else []
    if not rows:
        return None
    plan = {
        "format": PLAN_FORMAT,
        "request": request.record(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "manifest_sha256": hashlib.sha256(build.manifest_bytes).hexdigest(),
        "signatures": rows,
        "shards": {name: shard_plan(build, name, keys) for name, keys in sorted(shards.items())},
        "content_sha256": sorted(content),
    }
    write_bytes_atomic(build.fs, build.work(remove_file("plan.json")), json.dumps(plan).encode())
    return plan


def read_columns(build: FinishedBuild, rel: str, kind: str) -> Any:
    """The columns of one signatures file the selection and the audit need."""
    with build.fs.open(build.path(rel), "rb") as f:
        parquet = pq.ParquetFile(f)
        wanted = ["key", "shard", COLUMN[kind], "sha256"]
        wanted += ["phash_crops"] if kind == "like" else []
        # a missing selector column is left out: matches() says so in one line
        names = [c for c in dict.fromkeys(wanted) if c in parquet.schema_arrow.names]
        return parquet.read(columns=names)


def shard_plan(build: FinishedBuild, name: str, keys: list[str]) -> dict[str, Any]:
    """Where the removed samples lie in shard `name` ([start, end) byte runs, merged), where
    its samples end, and the sha256 of each removed sample's bytes (its tar record)."""
    spans, end = sample_spans(build, name)
    missing = [k for k in keys if k not in spans]
    if missing:
        raise ConfigError(
            f"{build.url}: {name} does not hold {len(missing)} sample(s) its signatures place there"
        )
    runs = sorted(spans[k] for k in keys)
    path = build.path(name)
    blobs = with_retries(
        lambda: build.fs.cat_ranges([path] * len(runs), [a for a, _ in runs], [b for _, b in runs])
    )
    record = sorted(hashlib.sha256(blob).hexdigest() for blob in blobs)
    return {"keys": sorted(keys), "removed": merge(runs), "end": end, "record_sha256": record}


def sample_spans(build: FinishedBuild, name: str) -> tuple[dict[str, tuple[int, int]], int]:
    """Each sample's [start, end) bytes in a shard (its members' headers and padded data,
    which lie together), and where the last sample ends, read from the tar's headers: plain
    ones parsed here (what the build writes), any other tar through tarfile."""
    with build.fs.open(build.path(name), "rb") as f:
        found = plain_spans(f)
        if found is not None:
            return found
        f.seek(0)
        return tarfile_spans(f)


def plain_spans(f: Any) -> tuple[dict[str, tuple[int, int]], int] | None:
    """`sample_spans` over a tar of plain regular-file headers (None at any other header):
    each header is read and the data seeked over, ~10x faster than a TarInfo per member."""
    spans: dict[str, tuple[int, int]] = {}
    at = 0
    while True:
        f.seek(at)
        header = f.read(BLOCK)
        if len(header) < BLOCK or not header.strip(b"\0"):
            return spans, at
        member = regular_member(header)
        if member is None:
            return None
        key = split_member_name(member[0])[0]
        stop = at + BLOCK + -(-member[1] // BLOCK) * BLOCK
        spans[key] = (spans.get(key, (at, stop))[0], stop)
        at = stop


def tarfile_spans(f: Any) -> tuple[dict[str, tuple[int, int]], int]:
    spans: dict[str, tuple[int, int]] = {}
    end = 0
    with tarfile.open(fileobj=f, mode="r:") as tar:
        for member in tar:
            key = split_member_name(member.name)[0]
            stop = member.offset_data + -(-member.size // BLOCK) * BLOCK
            spans[key] = (spans.get(key, (member.offset, stop))[0], stop)
            end = max(end, stop)
    return spans, end


def merge(runs: list[tuple[int, int]]) -> list[list[int]]:
    merged: list[list[int]] = []
    for start, stop in runs:
        if merged and merged[-1][1] == start:
            merged[-1][1] = stop
        else:
            merged.append([start, stop])
    return merged


def kept_runs(shard: dict[str, Any]) -> list[tuple[int, int]]:
    """The [start, end) runs of the shard's samples that stay, in order."""
    runs, at = [], 0
    for start, stop in shard["removed"]:
        if start > at:
            runs.append((at, start))
        at = stop
    if shard["end"] > at:
        runs.append((at, shard["end"]))
    return runs


def pending_plan(build: FinishedBuild) -> dict[str, Any] | None:
    plan = read_json(build.fs, build.work(remove_file("plan.json")))
    return plan if isinstance(plan, dict) and plan.get("format") == PLAN_FORMAT else None


def end_bytes() -> bytes:
    return b"\0" * TAR_END_BYTES


def mask_of(keys: Any, removed: set[str]) -> np.ndarray:
    """True for the rows that stay (their key is not among `removed`)."""
    return np.fromiter((k not in removed for k in keys), dtype=bool)

"""An arm's samples: a decision over the scores and dedupe results a sweep recorded once.

Pure decisions (`select_keys`, `mix`) over `(key, score)` rows, and the writer of an arm's
build: the chosen samples' tar members copied byte for byte, in the scored build's order, into
shards of the base build's sizes, then manifest.json last (format mmcurate/1, as a build
writes it), so `mmcurate train` and `mmcurate eval` read an arm like any build.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from mmcurate.core.formats import MANIFEST_FORMAT
from mmcurate.pipeline.sweep.config import Arm
from mmcurate.stages.lib.decisions import top_count

Row = tuple[str, float | None]  # (key, clip_score) of a sample the scoring build kept


def read_scores(build: Path, column: str | None = "clip_score") -> list[Row]:
    """A build's kept samples (signatures rows without a drop reason) and their score, in
    key order; score None when the build has no such column."""
    table = pq.read_table(build / "signatures").to_pylist()
    return sorted(
        (r["key"], r.get(column) if column else None) for r in table if r.get("drop_reason") is None
    )


def top_fraction(rows: list[Row], fraction: float) -> set[str]:
    """Exactly ceil(fraction x N) of the N scored rows: highest score first, then smallest key
    (the build's rule, stages/lib/top_fraction.py; scores compared as the float32 the
    signatures hold)."""
    scored = [(key, score) for key, score in rows if score is not None]
    need = top_count(fraction, len(scored))  # not math.ceil: 0.55 x 2940 = 1617.0000000000002
    order = sorted(scored, key=lambda row: (-row[1], row[0]))
    return {key for key, _ in order[:need]}


def select_keys(rows: list[Row], arm: Arm, deduped: set[str] | None) -> set[str]:
    """The keys one source contributes to `arm` before mixing: its threshold (the score as
    clip_score compares it: rounded to 6 decimals), then the dedupe survivors."""
    if arm.min_score is not None:
        keys = {k for k, s in rows if s is not None and round(float(s), 6) >= arm.min_score}
    elif arm.keep_top_fraction is not None:
        keys = top_fraction(rows, arm.keep_top_fraction)
    else:
        keys = {k for k, _ in rows}
    if arm.dedupe and deduped is not None:
        keys &= deduped
    return keys


def stable_order(keys: set[str]) -> list[str]:
    """Keys in an order fixed by their names alone (no seed): a mixture's draw."""
    return sorted(keys, key=lambda k: (hashlib.sha1(k.encode()).hexdigest(), k))


def mix(pools: dict[str, set[str]], weights: dict[str, float]) -> dict[str, set[str]]:
    """Per source, the keys of a mixture with these weights (summing to 1): the largest total
    N every source can fill without repeats, round-down w x N from each, drawn in
    `stable_order`. One source with weight 1 keeps its whole pool."""
    total = min(math.floor(len(pools[s]) / w + 1e-9) for s, w in weights.items())
    share = {s: math.floor(w * total + 1e-9) for s, w in weights.items()}
    return {s: set(stable_order(pools[s])[: share[s]]) for s in weights}


@dataclass(frozen=True)
class Part:
    """One source's share of an arm: its scored build, the keys it gives, and the prefix
    that keeps keys unique when several sources mix (empty for a single source)."""

    build: Path
    keys: frozenset[str]
    prefix: str = ""


def members(part: Part) -> Iterator[tuple[str, tarfile.TarInfo, bytes]]:
    """(key, member, bytes) of the part's samples, in the build's shard and member order."""
    manifest = json.loads((part.build / "manifest.json").read_text())
    for shard in manifest["shards"]:
        with tarfile.open(part.build / shard["name"]) as tar:
            for info in tar:
                key = info.name.partition(".")[0]
                if info.isfile() and key in part.keys:
                    data = tar.extractfile(info).read()  # type: ignore[union-attr]
                    yield key, info, data


def samples(parts: list[Part]) -> Iterator[list[tuple[tarfile.TarInfo, bytes]]]:
    """Each sample's members together (members of a key are adjacent in a build's shards)."""
    for part in parts:
        current, group = None, []
        for key, info, data in members(part):
            if key != current and group:
                yield group
                group = []
            current = key
            info.name = part.prefix + info.name
            group.append((info, data))
        if group:
            yield group


def write_arm(parts: list[Part], out: Path, max_samples: int, max_bytes: int) -> dict[str, Any]:
    """The arm's shards (greedy: a new shard when the next sample would pass either limit),
    then manifest.json (written last, atomically); returns the manifest."""
    out.mkdir(parents=True, exist_ok=True)
    entries: list[dict[str, Any]] = []
    writer: ShardWriter | None = None
    for group in samples(parts):
        size = sum(512 + -(-len(d) // 512) * 512 for _, d in group)
        if writer is None or writer.full(size, max_samples, max_bytes):
            if writer is not None:
                entries.append(writer.close())
            writer = ShardWriter(out / f"shard-{len(entries):06d}.tar")
        writer.add(group, size)
    if writer is not None:
        entries.append(writer.close())
    manifest = {
        "format": MANIFEST_FORMAT,
        "samples": sum(e["samples"] for e in entries),
        "shards": entries,
        "config": {"sweep_arm": out.name},
    }
    tmp = out / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(tmp, out / "manifest.json")
    return manifest


class ShardWriter:
    """One tar being written, with its sample count and size."""

    def __init__(self, path: Path) -> None:
        self.path, self.samples, self.bytes = path, 0, 0
        self.tar = tarfile.open(path, "w", format=tarfile.USTAR_FORMAT)

    def full(self, size: int, max_samples: int, max_bytes: int) -> bool:
        return self.samples >= max_samples or (self.samples > 0 and self.bytes + size > max_bytes)

    def add(self, group: list[tuple[tarfile.TarInfo, bytes]], size: int) -> None:
        import io

        for info, data in group:
            self.tar.addfile(info, io.BytesIO(data))
        self.samples += 1
        self.bytes += size

    def close(self) -> dict[str, Any]:
        self.tar.close()
        raw = self.path.read_bytes()
        digest = hashlib.sha256(raw).hexdigest()
        entry = {"name": self.path.name, "samples": self.samples, "bytes": len(raw)}
        return {**entry, "sha256": digest}

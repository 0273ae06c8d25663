"""exact_dedupe: sha256 of the media bytes per sample, then one survivor per hash globally.

The per-sample part adds a `sha256` column. The global part runs on the signatures table
after every per-sample stage (phase B): within each hash group the smallest key is kept.
"""

from __future__ import annotations

import hashlib

import pyarrow as pa
import pyarrow.compute as pc

from stages.base import DROP, Batch, Stage, StageOptions, media_column, register


class ExactDedupeOptions(StageOptions):
    pass


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def smallest_key_per_hash(keys: list[str], hashes: list[str]) -> dict[str, str]:
    """hash -> the smallest key having it (the deterministic survivor)."""
    kept: dict[str, str] = {}
    for key, digest in zip(keys, hashes, strict=True):
        if digest not in kept or key < kept[digest]:
            kept[digest] = key
    return kept


@register
class ExactDedupe(Stage):
    name = "exact_dedupe"
    Options = ExactDedupeOptions
    is_global = True

    def process(self, batch: Batch) -> tuple[Batch, list[str | None]]:
        hashes: list[str | None] = []
        reasons: list[str | None] = []
        for row in range(len(batch["__key__"])):
            col = media_column(batch, row)
            hashes.append(sha256_hex(batch[col][row]) if col else None)
            reasons.append(None if col else "no_image")
        batch["sha256"] = hashes
        return batch, reasons

    def decide(self, signatures: pa.Table) -> dict[str, tuple[str, str | None]]:
        live = signatures.filter(pc.is_null(signatures[DROP]))
        keys = live["__key__"].to_pylist()
        hashes = live["sha256"].to_pylist()
        kept = smallest_key_per_hash(keys, hashes)
        return {
            key: ("duplicate_exact", kept[digest])
            for key, digest in zip(keys, hashes, strict=True)
            if kept[digest] != key
        }

"""exact_dedupe: sha256 per sample, then one survivor per hash across the whole dataset.

Per sample: `sha256` of the media bytes (`of: bytes`), or of the decoded pixels (`of: pixels`:
RGB size and values, so the same picture saved twice by different encoders still matches).
Globally (phase B, signatures only): rows are hash-partitioned by their sha256 across reduce
tasks and each reduce keeps one sample per hash by the keep policy every dedupe follows
(stages/lib/dedupe_common.py): the highest `clip_score` when the build has one (identical
images with different captions score differently), else the smallest key. Memory: a reduce
holds its share of (key, sha256, score) rows, about 256 MiB.
"""

from __future__ import annotations

import hashlib
from functools import partial
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from mmcurate.core.mapreduce import LocalRunner, Runner, partitions_for, split_range
from mmcurate.core.spill import COPY_BLOCK, Spilled
from mmcurate.stages.base import Columns, Stage, StageOptions, media_column, register
from mmcurate.stages.lib.decisions import KeyedDecision, split_by
from mmcurate.stages.lib.dedupe_common import Decisions, keepers, live_rows, priority_rank
from mmcurate.stages.lib.pixels import (
    DECODE_ERRORS,
    failure_reason,
    open_image,
    to_rgb,
    too_big,
    upright,
)

RANKED_BY = ("clip_score",)  # read where the build has it (identical images tie on size)
DROPPED = ("sha256", *RANKED_BY)  # columns the decisions do not carry
HEX_PAIRS = pa.array([f"{i:02x}" for i in range(256)])


class ExactDedupeOptions(StageOptions):
    of: Literal["bytes", "pixels"] = "bytes"


def sha256_hex(data: bytes | Spilled) -> str:
    """sha256 of media bytes; of a spilled file, read in blocks."""
    if not isinstance(data, Spilled):
        return hashlib.sha256(data).hexdigest()
    digest = hashlib.sha256()
    with data.open() as f:
        while block := f.read(COPY_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def pixels_sha256(data: bytes | Spilled) -> str:
    """sha256 of the decoded pixels as a viewer sees them (upright, 8-bit RGB) and their size."""
    with open_image(data) as image:
        rgb = to_rgb(upright(image))
        digest = hashlib.sha256(f"{rgb.width}x{rgb.height}:".encode())
        digest.update(rgb.tobytes())
    return digest.hexdigest()


@register
class ExactDedupe(Stage):
    name = "exact_dedupe"
    Options = ExactDedupeOptions
    is_global = True

    def process(self, batch: Columns) -> tuple[Columns, list[str | None]]:
        hashes: list[str | None] = []
        reasons: list[str | None] = []
        for row in range(len(batch["__key__"])):
            col = media_column(batch, row)
            digest, reason = (None, "no_image") if col is None else self.digest(batch[col][row])
            hashes.append(digest)
            reasons.append(reason)
        batch["sha256"] = hashes
        return batch, reasons

    def digest(self, data: bytes | Spilled) -> tuple[str | None, str | None]:
        if self.options.of == "bytes":
            return sha256_hex(data), None
        if too_big(data):
            return None, "too_big"
        try:
            return pixels_sha256(data), None
        except DECODE_ERRORS as err:  # too_many_pixels from the header, or decode_error
            return None, failure_reason(err)

    def decide(self, signatures: pa.Table, runner: Runner | None = None) -> Decisions:
        live = live_rows(signatures, "sha256")
        live = live.select([c for c in ("__key__", "sha256", *RANKED_BY) if c in live.column_names])
        if live.num_rows < 2:
            return {}  # nothing can repeat (also: every sample dropped before hashing)
        runner = runner or LocalRunner()
        partitions = partitions_for(live.nbytes, runner)
        blocks = [live.slice(a, b - a) for a, b in split_range(live.num_rows, 1 << 20)]
        mapper = partial(route_by_hash, partitions=partitions)
        decided: Decisions = {}
        for table in runner.map_reduce(blocks, mapper, best_per_hash, partitions):
            keys, kept = table["__key__"].to_pylist(), table["kept"].to_pylist()
            decided.update(zip(keys, kept, strict=True))
        return {key: ("duplicate_exact", kept) for key, kept in decided.items()}

    def decide_plan(self) -> KeyedDecision:
        return KeyedDecision(
            ("sha256",), route_by_hash, best_per_hash, "duplicate_exact", 120, RANKED_BY
        )


def route_by_hash(block: pa.Table, partitions: int) -> list[pa.Table]:
    """Split rows by the first two bytes of their sha256 (65,536 routes), so equal hashes
    meet in one reduce."""
    if partitions == 1:
        return [block]
    route = np.zeros(block.num_rows, np.int64)
    for start in (0, 2):
        byte = pc.index_in(pc.utf8_slice_codeunits(block["sha256"], start, start + 2), HEX_PAIRS)
        route = route * 256 + byte.to_numpy(zero_copy_only=False).astype(np.int64)
    return split_by(block, route % partitions, partitions)


def best_per_hash(tables: list[pa.Table]) -> pa.Table:
    """(key, kept) for each row whose hash has a better row (keep policy) in the partition,
    with the row's place (`__part__`, `__index__`) where the rows were routed with it."""
    rows = pa.concat_tables(tables, promote_options="permissive")
    carried = rows.drop_columns([c for c in DROPPED if c in rows.column_names])
    if rows.num_rows == 0:  # a reduce no row was routed to
        return carried.append_column("kept", rows["__key__"])
    hashes = pc.dictionary_encode(rows["sha256"].combine_chunks()).indices.to_numpy()
    keeper = keepers(hashes, priority_rank(rows))
    dropped = np.flatnonzero(keeper != np.arange(rows.num_rows))
    kept = rows["__key__"].take(pa.array(keeper[dropped]))
    return carried.take(pa.array(dropped)).append_column("kept", kept)  # + where rows are

"""near_dedupe: perceptual hash per sample, then one survivor per group of near-identical images.

Per sample: a 64-bit pHash (or dHash) and the image size. Globally (phase B, signatures only):
identical hashes collapse first, candidate pairs come from the tables `stages.lib.hamming`
plans for the radius and target recall, each is verified by popcount, groups are the connected
components of the verified pairs (union-find), and the keep policy of
`stages.lib.dedupe_common` picks one item.

Memory: the driver holds the hash column (8 bytes a row) and the group labels; each reduce task
holds about 256 MiB of routed (hash, id) entries, and the tables run in waves of at most
`wave_bytes` of entries, so the object store never holds more than one wave.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Literal

import numpy as np
import pyarrow as pa
from PIL import Image
from pydantic import Field
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from core.mapreduce import LocalRunner, Runner, partitions_for, split_range
from stages.base import (
    FRAME_COLUMN,
    Columns,
    Stage,
    StageOptions,
    media_column,
    register,
    sample_meta,
)
from stages.lib.dedupe_common import Decisions, group_decisions, keepers, live_rows, priority_rank
from stages.lib.hamming import (
    TablePlan,
    map_block,
    plan_tables,
    reduce_partition,
    table_pairs,
    unique_inverse,
    unique_pairs,
)
from stages.lib.image_hash import image_hash

log = logging.getLogger("mmcurate.near_dedupe")
ENTRY_BYTES = 16  # one routed (hash, id) pair
REDUCE_BYTES = 256 << 20  # routed entries one reduce task holds


class NearDedupeOptions(StageOptions):
    hash: Literal["phash", "dhash"] = "phash"
    radius: int = Field(4, ge=0, le=16, description="largest Hamming distance called a duplicate")
    recall: float = Field(0.99, gt=0, lt=1, description="target recall at the radius (lsh)")
    mode: Literal["auto", "exact", "lsh"] = "auto"
    seed: int = 0
    wave_bytes: int = Field(1 << 30, ge=1 << 20, description="routed entries held at once")


@register
class NearDedupe(Stage):
    name = "near_dedupe"
    Options = NearDedupeOptions
    is_global = True

    def process(self, batch: Columns) -> tuple[Columns, list[str | None]]:
        size = len(batch["__key__"])
        hashes: list[int | None] = [None] * size
        widths: list[int | None] = [None] * size
        heights: list[int | None] = [None] * size
        reasons: list[str | None] = [None] * size
        for row in range(size):
            picture = picture_to_hash(batch, row)
            if picture is None:
                reasons[row] = "no_image"
                continue
            try:
                hashes[row], (w, h) = image_hash(picture, self.options.hash)
            except (OSError, ValueError, Image.DecompressionBombError):
                reasons[row] = "decode_error"
                continue
            widths[row], heights[row] = original_size(batch.get("json"), row, (w, h))
        batch["phash"], batch["width"], batch["height"] = hashes, widths, heights
        return batch, reasons

    def decide(self, signatures: pa.Table, runner: Runner | None = None) -> Decisions:
        live = live_rows(signatures, "phash")
        if live.num_rows < 2:
            return {}
        hashes = live["phash"].to_numpy().astype(np.uint64)
        plan = self.plan(len(hashes))
        labels = near_groups(hashes, plan, runner or LocalRunner(), self.options.wave_bytes)
        keeper = keepers(labels, priority_rank(live))
        return group_decisions(live["__key__"].to_pylist(), keeper, "duplicate_near")

    def plan(self, n: int) -> TablePlan:
        opts = self.options
        plan = plan_tables(n, opts.radius, opts.recall, opts.mode, opts.seed)
        log.info("near_dedupe on %d hashes, radius %d: %s", n, opts.radius, plan.describe())
        return plan


def picture_to_hash(batch: Columns, row: int) -> bytes | None:
    """The image, or for a video sample its middle sampled frame."""
    col = media_column(batch, row)
    if col is not None:
        return batch[col][row]
    frames = [batch[c][row] for c in sorted(batch) if FRAME_COLUMN.match(c)]
    frames = [f for f in frames if f is not None]
    return frames[len(frames) // 2] if frames else None


def original_size(metas: list | None, row: int, decoded: tuple[int, int]) -> tuple[int, int]:
    """The size before decode_image resized it (its `original_*` JSON fields), else as decoded."""
    meta = sample_meta(metas[row] if metas else None)
    try:
        width, height = int(meta["original_width"]), int(meta["original_height"])
    except (KeyError, TypeError, ValueError, OverflowError):
        return decoded  # absent or not numbers: the decoded size is the truth we have
    return (width, height) if 0 < width < 2**31 and 0 < height < 2**31 else decoded


def near_groups(
    hashes: np.ndarray, plan: TablePlan, runner: Runner, wave_bytes: int = 1 << 30
) -> np.ndarray:
    """Group label per hash: connected components of pairs within the plan's radius."""
    inverse, unique = unique_inverse(hashes)  # equal hashes: one node
    a, b = close_pairs(unique, plan, runner, wave_bytes)
    graph = coo_matrix((np.ones(len(a), np.int8), (a, b)), shape=(len(unique), len(unique)))
    _, labels = connected_components(graph, directed=False)
    return labels[inverse]


def close_pairs(
    hashes: np.ndarray, plan: TablePlan, runner: Runner, wave_bytes: int = 1 << 30
) -> tuple[np.ndarray, np.ndarray]:
    """Every verified pair (a, b), a < b, of positions in `hashes` sharing a table of the plan.

    When one table's entries fit in one reduce (up to ~16M hashes), each task takes a whole
    table over the shared hash blocks. Beyond that, entries are hash-partitioned by (table,
    key) across reduces, the tables running in waves of at most `wave_bytes` of entries.
    """
    n = len(hashes)
    if n * ENTRY_BYTES <= REDUCE_BYTES:
        shared = runner.share(hashes)
        calls = [(mask, plan.radius, shared) for mask in plan.masks]
        return merge_pairs(runner.run(table_pairs, calls))
    blocks = [(hashes[start:stop], start) for start, stop in split_range(n, 1 << 20)]
    per_wave = max(1, wave_bytes // (n * ENTRY_BYTES))
    results = []
    for first in range(0, len(plan.masks), per_wave):
        masks = plan.masks[first : first + per_wave]
        partitions = partitions_for(n * len(masks) * ENTRY_BYTES, runner, REDUCE_BYTES)
        mapper = partial(map_block, masks=masks, first_table=first, partitions=partitions)
        reducer = partial(reduce_partition, masks=masks, radius=plan.radius)
        results += runner.map_reduce(blocks, mapper, reducer, partitions)
    return merge_pairs(results)


def merge_pairs(results: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    if not results:
        empty = np.empty(0, np.int64)
        return empty, empty
    return unique_pairs(
        np.concatenate([a for a, _ in results]), np.concatenate([b for _, b in results])
    )

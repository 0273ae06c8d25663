"""near_dedupe: one survivor per group of near-identical images (crops and light edits too).

Per sample (`process`): the 64-bit pHash (or dHash), the same hash of two inset windows
(`phash_crops`: 1.5% and 3% cut from every side) and the 32x32 grey thumbnail (`thumb`),
plus the image size. Globally (`decide`, signatures only):

- sure pairs: pHashes within `radius` (what `radius` always meant); identical hashes are one
  node;
- candidate pairs: any of a pair's hashes (whole frame or inset) within `candidate_radius` of
  the other's whole-frame hash; each joins only when verified: its thumbnails match after
  alignment (`stages.lib.thumb_match`), and, when the signatures carry CLIP embeddings
  (clip_score ran), their cosine is at least `min_cosine`;
- groups without chaining (`star_keepers`): in keep order, an unclaimed item is kept and claims
  the items paired with it, so every dropped item was paired with its keeper itself.

Candidate search: the tables `stages.lib.hamming` plans for the radius and target recall,
verified by popcount. Memory: the driver holds 3 hashes a row (24 bytes), the group labels and
the thumbnails of candidate pairs; each reduce task holds about 256 MiB of routed (hash, id)
entries, and the tables run in waves of at most `wave_bytes` of entries.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any, Literal

import numpy as np
import pyarrow as pa
from mmcurate.core.formats import FRAME_COLUMN, sample_meta
from mmcurate.core.mapreduce import LocalRunner, Runner, partitions_for, split_range
from mmcurate.stages.base import Columns, Stage, StageOptions, media_column, register
from mmcurate.stages.lib.dedupe_common import (
    Decisions,
    group_decisions,
    live_rows,
    priority_rank,
    star_keepers,
)
from mmcurate.stages.lib.hamming import (
    distinct,
    expand_pairs,
    group_task,
    map_block,
    reduce_partition,
    table_rows_pairs,
    unique_inverse,
    unique_pairs,
)
from mmcurate.stages.lib.hamming_plan import TablePlan, plan_tables
from mmcurate.stages.lib.image_hash import image_signals
from mmcurate.stages.lib.near_verify import candidate_entries, class_leaders, verify_pairs
from mmcurate.stages.lib.pixels import DECODE_ERRORS, failure_reason, too_big
from pydantic import Field

log = logging.getLogger("mmcurate.near_dedupe")
ENTRY_BYTES = 16  # one routed (hash, id) pair
REDUCE_BYTES = 256 << 20  # routed entries one reduce task holds
SIGNAL_COLUMNS = ("phash", "phash_crops", "thumb", "width", "height")


class NearDedupeOptions(StageOptions):
    hash: Literal["phash", "dhash"] = "phash"
    radius: int = Field(4, ge=0, le=16, description="largest Hamming distance called a duplicate")
    candidate_radius: int = Field(
        8, ge=0, le=16, description="largest distance (any hash) of a pair that is verified"
    )
    verify: Literal["auto", "thumbnail", "none"] = "auto"
    max_mismatch: float = Field(0.4, gt=0, description="thumbnail mismatch a duplicate may have")
    min_cosine: float = Field(0.9, ge=-1, le=1, description="embedding cosine (auto, if any)")
    recall: float = Field(0.99, gt=0, lt=1, description="target recall at the radius (lsh)")
    mode: Literal["auto", "exact", "lsh"] = "auto"
    seed: int = Field(0, ge=0, description="LSH permutations (numpy: non-negative)")
    wave_bytes: int = Field(1 << 30, ge=1 << 20, description="routed entries held at once")


@register
class NearDedupe(Stage):
    name = "near_dedupe"
    Options = NearDedupeOptions
    is_global = True
    decide_columns = ("__key__", *SIGNAL_COLUMNS, "clip_score", "embedding")  # what decide reads

    def process(self, batch: Columns) -> tuple[Columns, list[str | None]]:
        size = len(batch["__key__"])
        columns: dict[str, list] = {c: [None] * size for c in SIGNAL_COLUMNS}
        reasons: list[str | None] = [None] * size
        for row in range(size):
            picture = picture_to_hash(batch, row)
            if picture is None:
                reasons[row] = "no_image"
                continue
            if too_big(picture):  # a spilled file too big to be a picture: never opened
                reasons[row] = "too_big"
                continue
            try:
                full, crops, thumb, decoded = image_signals(picture, self.options.hash)
            except DECODE_ERRORS as err:  # too_many_pixels from the header, or decode_error
                reasons[row] = failure_reason(err)
                continue
            width, height = original_size(batch.get("json"), row, decoded)
            for column, value in zip(
                SIGNAL_COLUMNS, (full, crops, thumb, width, height), strict=True
            ):
                columns[column][row] = value
        batch.update(columns)
        return batch, reasons

    def decide(self, signatures: pa.Table, runner: Runner | None = None) -> Decisions:
        live = live_rows(signatures, "phash")
        if live.num_rows < 2:
            return {}
        runner = runner or LocalRunner()
        inverse, unique = unique_inverse(live["phash"].to_numpy().astype(np.uint64))
        rank = priority_rank(live)
        leader = class_leaders(inverse, rank, len(unique))  # best-ranked row of each hash
        a, b = close_pairs(unique, self.plan(len(unique), self.options.radius), runner)
        if self.options.verify != "none" and self.options.candidate_radius > 0:
            found = self.verified_pairs(live, unique, leader, runner)
            a, b = unique_pairs(np.concatenate([a, found[0]]), np.concatenate([b, found[1]]))
        node_keeper = star_keepers(len(unique), a, b, rank[leader])
        keeper = leader[node_keeper[inverse]]
        return group_decisions(live["__key__"].to_pylist(), keeper, "duplicate_near")

    def verified_pairs(
        self, live: pa.Table, unique: np.ndarray, leader: np.ndarray, runner: Runner
    ) -> tuple[np.ndarray, np.ndarray]:
        """Pairs of nodes beyond `radius` but within `candidate_radius` by any of their hashes,
        kept when their leaders' thumbnails (and embeddings, if any) say they are one image."""
        opts = self.options
        entries, owner = candidate_entries(live, unique, leader)
        plan = self.plan(len(entries), opts.candidate_radius)
        a, b = close_pairs(entries, plan, runner, opts.wave_bytes)
        a, b = owner[a], owner[b]
        beyond = (a != b) & (np.bitwise_count(unique[a] ^ unique[b]) > opts.radius)
        a, b = unique_pairs(np.minimum(a, b)[beyond], np.maximum(a, b)[beyond])
        keep = verify_pairs(live, leader[a], leader[b], opts.max_mismatch, opts.min_cosine)
        log.info("near_dedupe: %d of %d candidate pairs verified", int(keep.sum()), len(a))
        return a[keep], b[keep]

    def plan(self, n: int, radius: int) -> TablePlan:
        opts = self.options
        plan = plan_tables(n, radius, opts.recall, opts.mode, opts.seed)
        log.info("near_dedupe on %d hashes, radius %d: %s", n, radius, plan.describe())
        return plan


def picture_to_hash(batch: Columns, row: int) -> Any:
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
    """Group label per hash: connected components of pairs within the plan's radius, each
    labelled by its smallest distinct-hash index (a hash in no pair: its own)."""
    inverse, unique = unique_inverse(hashes)  # equal hashes: one node
    a, b = close_pairs(unique, plan, runner, wave_bytes)
    labels = np.arange(len(unique))
    if len(a):  # components over the nodes in pairs only, not a graph of every hash
        from scipy.sparse import coo_matrix  # here: only the bench groups this way
        from scipy.sparse.csgraph import connected_components

        nodes, index = np.unique(np.concatenate([a, b]), return_inverse=True)
        edges = (np.ones(len(a), np.int8), (index[: len(a)], index[len(a) :]))
        graph = coo_matrix(edges, shape=(len(nodes), len(nodes)))
        count, component = connected_components(graph, directed=False)
        smallest = np.full(count, len(unique))
        np.minimum.at(smallest, component, nodes)
        labels[nodes] = smallest[component]
    return labels[inverse]


def close_pairs(
    hashes: np.ndarray, plan: TablePlan, runner: Runner, wave_bytes: int = 1 << 30
) -> tuple[np.ndarray, np.ndarray]:
    """Every verified pair (a, b), a < b, of positions in `hashes` sharing a table of the plan
    (rows holding one hash always pair). The tables run over the distinct hashes, sorted.

    When one table's entries fit in one reduce (up to ~16M hashes), each task takes a whole
    table (exact) or permutation group (lsh) over the shared hashes. Beyond that, entries are
    hash-partitioned by (table, key) across reduces, the tables running in waves of at most
    `wave_bytes` of entries.
    """
    inverse, unique = distinct(hashes)
    n = len(unique)
    if n * ENTRY_BYTES <= REDUCE_BYTES:
        shared = runner.share(unique)
        if plan.mode == "lsh":
            results = runner.run(group_task, [(plan, g, shared) for g in range(len(plan.perms))])
        else:
            results = runner.run(
                table_rows_pairs, [(plan, t, shared) for t in range(len(plan.masks))]
            )
        return expand_pairs(*merge_pairs(results), inverse)
    blocks = [(unique[start:stop], start) for start, stop in split_range(n, 1 << 20)]
    per_wave = max(1, wave_bytes // (n * ENTRY_BYTES))
    results = []
    for first in range(0, len(plan.masks), per_wave):
        count = min(per_wave, len(plan.masks) - first)
        partitions = partitions_for(n * count * ENTRY_BYTES, runner, REDUCE_BYTES)
        mapper = partial(
            map_block, plan=plan, first_table=first, count=count, partitions=partitions
        )
        reducer = partial(reduce_partition, plan=plan, first_table=first, count=count)
        results += runner.map_reduce(blocks, mapper, reducer, partitions)
    return expand_pairs(*merge_pairs(results), inverse)


def merge_pairs(results: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    if not results:
        empty = np.empty(0, np.int64)
        return empty, empty
    return np.concatenate([a for a, _ in results]), np.concatenate([b for _, b in results])

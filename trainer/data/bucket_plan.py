"""The bucketed epoch plan: which batches an epoch has, each of one aspect-ratio bucket, and
which of them each rank and loader worker yields (pure functions of the per-sample bucket
labels, the seed, the epoch and the layout; trainer/data/buckets.py streams them).

- The epoch's samples are trainer/data/plan.py's pieces (shuffled shards, weighted mixes), so
  position p holds the same sample here as in the square loader.
- Each bucket's positions, in epoch order, are shuffled locally (a seeded jitter sort over a
  window of `shuffle_buffer` of its samples: the shuffle buffer's effect, computed at once),
  then cut into batches of `batch_size`. A bucket's last batch holds its remainder (shorter;
  never dropped, never padded with repeats), so every labelled sample is in exactly one
  batch per epoch.
- Every rank must yield the same number of batches (DDP would hang otherwise): when the
  count is not a multiple of world x step_batches, the largest batches are split in two
  until it is (still one bucket each, no sample repeated).
- Batches are interleaved by their bucket's share: batch j of a bucket with n batches gets
  the key (j + u) / n, u seeded uniform in [0, 1), and batches run in key order. So a bucket
  with 10% of the batches has about every tenth batch, and a bucket's batches keep their
  order, which follows the shard stream (workers read ahead little).
- Rank r gets a contiguous block of the batches, its workers contiguous runs of that block
  (counts differing by at most one, the larger first) exactly as in trainer/data/plan.py, so the
  resume arithmetic (`consumed_per_worker`) and the DataLoader's round-robin carry over.

Cost: each loader process plans each epoch itself: about 10 bytes a sample kept (int64
positions, int16 labels) and a few times that while planning; about 1-1.5 s per million
samples on this 2-vCPU machine (shared with other jobs when measured).
"""

from __future__ import annotations

import heapq
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from mmcurate.trainer.data.plan import Layout, Piece, Segment, consumed_per_worker, worker_batches

NO_BUCKET = -1  # the label of a sample the metadata gives no bucket
READ_PAST = 32  # gaps of up to this many positions in a shard are read through, not reopened


class TooFewSamples(ValueError):
    """Fewer labelled samples than ranks x step batches: no equal split exists."""


@dataclass(frozen=True)
class BucketEpoch:
    """One epoch's batches in training order: batch k is `order[bounds[k]:bounds[k + 1]]`
    (epoch positions), of bucket `bucket[k]`."""

    order: np.ndarray
    bounds: np.ndarray
    bucket: np.ndarray
    unlabelled: int  # samples left out: no bucket in the metadata (drop reason "no_bucket")

    def __len__(self) -> int:
        return len(self.bucket)

    def batch(self, k: int) -> np.ndarray:
        return self.order[self.bounds[k] : self.bounds[k + 1]]


def epoch_labels(pieces: Sequence[Piece], labels: Sequence[np.ndarray]) -> np.ndarray:
    """The bucket label of every epoch position (labels[shard][offset] for each piece)."""
    if not pieces:
        return np.zeros(0, dtype=np.int16)
    return np.concatenate([labels[p.shard][p.start : p.stop] for p in pieces])


def seeded(*parts: object) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(":".join(map(str, parts)).encode()))


def local_shuffle(
    by_bucket: np.ndarray, counts: np.ndarray, window: int, rng: np.random.Generator
) -> np.ndarray:
    """Each bucket's run of positions shuffled locally: a seeded jitter sort that moves a
    sample at most `window` places (a shuffle buffer's effect, computed at once)."""
    if window <= 1:
        return by_bucket
    out, start = by_bucket.copy(), 0
    for count in counts:
        jitter = np.arange(count) + rng.random(count) * window
        out[start : start + count] = by_bucket[start : start + count][np.argsort(jitter)]
        start += count
    return out


def batch_sizes(count: int, batch_size: int) -> list[int]:
    """One bucket's batches: full ones, then the remainder (short, never dropped)."""
    full, rest = divmod(int(count), batch_size)
    return [batch_size] * full + ([rest] if rest else [])


def split_to_multiple(sizes: list[list[int]], multiple: int) -> None:
    """Split the largest batches (in place, the parts side by side in their bucket, sizes
    as even as can be) until the count is a multiple of `multiple`. TooFewSamples when the
    samples run out first."""
    count, samples = sum(map(len, sizes)), sum(map(sum, sizes))
    extra = -count % multiple
    if count + extra > samples or count == 0:
        raise TooFewSamples(
            f"{samples} samples with a bucket cannot make a multiple of {multiple} batches "
            "(world size x accumulation steps): every rank needs the same number of steps"
        )
    if not extra:
        return
    # Only the `extra` largest can be chosen: each earlier pick cuts one batch at most.
    flat = [(-n, g, i) for g, group in enumerate(sizes) for i, n in enumerate(group)]
    heap = heapq.nsmallest(extra, flat)
    parts = {(g, i): 1 for _, g, i in heap}
    for _ in range(extra):  # the largest part is cut once more
        _, g, i = heapq.heappop(heap)
        parts[(g, i)] += 1
        heapq.heappush(heap, (-(-sizes[g][i] // parts[(g, i)]), g, i))
    for (g, i), n in sorted(parts.items(), reverse=True):  # from the back: indices hold
        base, rest = divmod(sizes[g][i], n)
        sizes[g][i : i + 1] = [base + 1] * rest + [base] * (n - rest)


def interleaved(sizes: list[list[int]], rng: np.random.Generator) -> np.ndarray:
    """Indices into the buckets' concatenated batches, in training order: batch j of the n
    of a bucket is keyed (j + u) / n, u seeded uniform in [0, 1)."""
    keys, buckets, local = [], [], []
    for g, group in enumerate(sizes):
        n = len(group)
        keys.append((np.arange(n) + rng.random(n)) / n)
        buckets.append(np.full(n, g))
        local.append(np.arange(n))
    return np.lexsort((np.concatenate(local), np.concatenate(buckets), np.concatenate(keys)))


def plan_epoch(
    labels: np.ndarray,
    batch_size: int,
    seed: int,
    epoch: int,
    world: int = 1,
    multiple: int = 1,
    shuffle_buffer: int = 0,
) -> BucketEpoch:
    """All ranks' batches of one epoch, given each position's bucket label."""
    labelled = np.flatnonzero(labels != NO_BUCKET)
    by_bucket = labelled[np.argsort(labels[labelled], kind="stable")]
    names, counts = np.unique(labels[labelled], return_counts=True)
    rng = seeded(seed, epoch, "buckets")
    by_bucket = local_shuffle(by_bucket, counts, shuffle_buffer, rng)
    sizes = [batch_sizes(count, batch_size) for count in counts]
    split_to_multiple(sizes, world * multiple)
    ranked = interleaved(sizes, rng)
    flat = np.array([n for group in sizes for n in group], dtype=np.int64)
    label = np.repeat(names, [len(group) for group in sizes])
    starts = np.concatenate([[0], np.cumsum(flat)[:-1]])  # in by_bucket, bucket after bucket
    flat, starts = flat[ranked], starts[ranked]
    bounds = np.concatenate([[0], np.cumsum(flat)])
    order = by_bucket[np.repeat(starts - bounds[:-1], flat) + np.arange(bounds[-1])]
    return BucketEpoch(order, bounds, label[ranked].astype(np.int16), len(labels) - len(labelled))


@dataclass(frozen=True)
class BucketWorkerPlan:
    """What one worker yields this epoch: its batches (indices into the epoch's), from the
    first not consumed before a resume, and the shard runs holding their samples."""

    batches: list[int]
    segments: list[Segment]


def worker_range(total: int, layout: Layout) -> tuple[int, int]:
    """[first, stop) of the epoch's batches this worker yields (before a resume)."""
    rank_batches = total // layout.world
    counts = worker_batches(rank_batches, layout.workers)
    first = layout.rank * rank_batches + sum(counts[: layout.worker])
    return first, first + counts[layout.worker]


def bucket_worker_plan(
    epoch: BucketEpoch, pieces: Sequence[Piece], layout: Layout, consumed: int = 0
) -> BucketWorkerPlan:
    """One worker's plan, resuming after its rank consumed `consumed` batches."""
    first, stop = worker_range(len(epoch), layout)
    counts = worker_batches(len(epoch) // layout.world, layout.workers)
    skip = min(consumed_per_worker(counts, consumed)[layout.worker], stop - first)
    batches = list(range(first + skip, stop))
    needed = [epoch.batch(k) for k in batches]
    positions = np.unique(np.concatenate(needed)) if needed else np.zeros(0, np.int64)
    return BucketWorkerPlan(batches, position_runs(positions, pieces))


def position_runs(positions: np.ndarray, pieces: Sequence[Piece]) -> list[Segment]:
    """Shard runs covering sorted `positions`, in order: runs within one piece merge across
    gaps of up to READ_PAST positions (read through: cheaper than reopening the shard)."""
    if not len(positions):
        return []
    ends = np.cumsum([p.size for p in pieces])
    piece_of = np.searchsorted(ends, positions, side="right")
    breaks = (np.diff(positions) > READ_PAST + 1) | (np.diff(piece_of) != 0)
    starts = np.concatenate([[0], np.flatnonzero(breaks) + 1])
    stops = np.concatenate([starts[1:], [len(positions)]])
    out = []
    for a, b in zip(starts, stops, strict=True):
        index = int(piece_of[a])
        piece, base = pieces[index], int(ends[index]) - pieces[index].size
        lo, hi = int(positions[a]), int(positions[b - 1]) + 1
        out.append(Segment(piece.shard, piece.start + lo - base, piece.start + hi - base, lo))
    return out

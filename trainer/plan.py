"""The epoch plan: which samples each rank and DataLoader worker reads, in which order.

Everything here is a pure function of the manifest's shard sizes, the seed, the epoch and the
layout (world size, workers, batch size), so every process computes the same plan without
talking to the others, and a checkpoint only needs (epoch, batches consumed) to resume exactly.

- An epoch is a list of pieces (runs of shard samples) from one manifest or several mixed by
  weight, shuffled per epoch (`epoch_pieces`); their samples, concatenated, get positions
  0..N-1.
- Every rank gets the same number of full batches, `N // (world * batch)`, as one contiguous
  span of positions (the few left over are dropped this epoch; the permutation changes which).
  Equal batches per rank is what keeps DDP from hanging on uneven shards.
- A rank's batches are split into contiguous runs per worker (counts differ by at most one).
- Within a worker a shuffle buffer permutes its span (seeded), like webdataset's `shuffle(n)`,
  but computed on positions, so which samples a worker has emitted is known from a count.
- PyTorch's DataLoader takes batches from workers round-robin, skipping exhausted ones, so
  after k batches on a rank each worker's share of k is known too (`consumed_per_worker`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    """Where one loader process sits: its rank among `world` and its worker index."""

    rank: int = 0
    world: int = 1
    worker: int = 0
    workers: int = 1  # DataLoader workers per rank (1 when loading in the main process)


@dataclass(frozen=True)
class Segment:
    """A run of one shard's samples: offsets [start, stop) in the shard, and the epoch
    position of `start`."""

    shard: int
    start: int
    stop: int
    position: int


@dataclass(frozen=True)
class Piece:
    """Samples [start, stop) of one shard: what an epoch is made of."""

    shard: int
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class WeightedManifest:
    """One manifest's shards (their indices among all shards and sizes) and its weight:
    each epoch takes round(weight x its samples) samples from it."""

    shards: tuple[int, ...]
    sizes: tuple[int, ...]
    weight: float = 1.0

    @property
    def quota(self) -> int:
        return round(self.weight * sum(self.sizes))


def epoch_pieces(sources: Sequence[WeightedManifest], seed: int, epoch: int) -> list[Piece]:
    """The epoch's pieces in order, a function of (seed, epoch) only. Each source gives its
    whole shards as often as its quota holds them, then a seeded pick of further shards (the
    last one cut) for the rest, so weight 0.5 reads a different half each epoch and weight 2
    each sample twice. All pieces are then shuffled together, mixing the sources."""
    pieces: list[Piece] = []
    for number, source in enumerate(sources):
        left, passes = source.quota, 0
        total = sum(source.sizes)
        while total and left >= total:  # whole passes
            pieces += [Piece(i, 0, n) for i, n in zip(source.shards, source.sizes, strict=True)]
            left, passes = left - total, passes + 1
        order = list(zip(source.shards, source.sizes, strict=True))
        random.Random(f"{seed}:{epoch}:{number}:{passes}").shuffle(order)
        for shard, size in order:
            if left <= 0:
                break
            pieces.append(Piece(shard, 0, min(size, left)))
            left -= min(size, left)
    random.Random(f"{seed}:{epoch}").shuffle(pieces)
    return pieces


def batches_per_rank(total_samples: int, world: int, batch_size: int, multiple: int = 1) -> int:
    """Full batches each rank gets, rounded down to a multiple of `multiple` (the batches one
    optimizer step takes under gradient accumulation)."""
    return total_samples // (world * batch_size) // multiple * multiple


def worker_batches(rank_batches: int, workers: int) -> list[int]:
    """Batches per worker: as equal as possible, the larger counts first."""
    base, extra = divmod(rank_batches, workers)
    return [base + (1 if w < extra else 0) for w in range(workers)]


def consumed_per_worker(counts: Sequence[int], consumed: int) -> list[int]:
    """How many of each worker's batches the first `consumed` batches of a rank hold, given
    the DataLoader's round-robin over workers (exhausted workers are skipped). Needs counts
    that differ by at most one with the larger first, as `worker_batches` makes them."""
    workers = len(counts)
    full_rounds = min(counts) if counts else 0
    if consumed <= full_rounds * workers:
        rounds, extra = divmod(consumed, workers)
        return [rounds + (1 if w < extra else 0) for w in range(workers)]
    extra = consumed - full_rounds * workers  # one more from each of the first `extra` workers
    return [
        full_rounds + (1 if w < extra and counts[w] > full_rounds else 0) for w in range(workers)
    ]


def worker_span(
    total_samples: int, layout: Layout, batch_size: int, multiple: int = 1
) -> tuple[int, int, int]:
    """(first position, number of batches, batches before this worker in the rank)."""
    rank_batches = batches_per_rank(total_samples, layout.world, batch_size, multiple)
    counts = worker_batches(rank_batches, layout.workers)
    before = sum(counts[: layout.worker])
    first = (layout.rank * rank_batches + before) * batch_size
    return first, counts[layout.worker], before


def segments(pieces: Sequence[Piece], first: int, count: int, skip_below: int = 0) -> list[Segment]:
    """The shard runs that hold epoch positions [first, first + count), in order, leaving
    out positions below `skip_below` (already consumed before a resume: never read again)."""
    out, position = [], 0
    end = first + count
    for piece in pieces:
        lo, hi = max(first, skip_below, position), min(end, position + piece.size)
        if lo < hi:
            start = piece.start + lo - position
            out.append(Segment(piece.shard, start, start + hi - lo, lo))
        position += piece.size
        if position >= end:
            break
    return out


def shuffled(first: int, count: int, buffer: int, seed: str) -> list[int]:
    """Positions first..first+count-1 as a shuffle buffer of `buffer` would emit them: fill
    the buffer, then emit a random element per element read; drain it shuffled at the end."""
    positions = range(first, first + count)
    if buffer <= 1:
        return list(positions)
    rng = random.Random(seed)
    held: list[int] = []
    out: list[int] = []
    for position in positions:
        held.append(position)
        if len(held) >= buffer:
            j = rng.randrange(len(held))
            held[j], held[-1] = held[-1], held[j]
            out.append(held.pop())
    rng.shuffle(held)
    out.extend(held)
    return out


@dataclass(frozen=True)
class WorkerPlan:
    """What one worker reads this epoch and the order it emits positions in."""

    segments: list[Segment]
    emit: list[int]  # epoch positions in emission order, already-consumed ones removed
    batches: int  # batches this worker still yields


def worker_plan(
    pieces: Sequence[Piece],
    seed: int,
    epoch: int,
    layout: Layout,
    batch_size: int,
    shuffle_buffer: int,
    consumed_batches: int = 0,
    multiple: int = 1,
) -> WorkerPlan:
    """The plan of one worker, resuming after the rank consumed `consumed_batches` batches."""
    total = sum(piece.size for piece in pieces)
    first, count, _ = worker_span(total, layout, batch_size, multiple)
    rank_batches = batches_per_rank(total, layout.world, batch_size, multiple)
    done = consumed_per_worker(worker_batches(rank_batches, layout.workers), consumed_batches)
    skip = done[layout.worker]
    emit = shuffled(
        first,
        count * batch_size,
        shuffle_buffer,
        f"{seed}:{epoch}:{layout.rank}:{layout.worker}",
    )[skip * batch_size :]
    lowest = min(emit) if emit else first + count * batch_size
    needed = segments(pieces, first, count * batch_size, skip_below=lowest)
    return WorkerPlan(segments=needed, emit=emit, batches=count - skip)

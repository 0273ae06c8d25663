"""The epoch plan: which samples each rank and DataLoader worker reads, in which order.

Everything here is a pure function of the manifest's shard sizes, the seed, the epoch and the
layout (world size, workers, batch size), so every process computes the same plan without
talking to the others, and a checkpoint only needs (epoch, batches consumed) to resume exactly.

- Shards are permuted per epoch; their samples, concatenated, get positions 0..N-1.
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


def shard_permutation(num_shards: int, seed: int, epoch: int) -> list[int]:
    """The shard order for one epoch: a shuffle that depends only on (seed, epoch)."""
    order = list(range(num_shards))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return order


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


def segments(
    shard_sizes: Sequence[int], order: Sequence[int], first: int, count: int, skip_below: int = 0
) -> list[Segment]:
    """The shard runs that hold epoch positions [first, first + count), in order, leaving
    out positions below `skip_below` (already consumed before a resume: never read again)."""
    out, position = [], 0
    end = first + count
    for shard in order:
        size = shard_sizes[shard]
        lo, hi = max(first, skip_below, position), min(end, position + size)
        if lo < hi:
            out.append(Segment(shard, lo - position, hi - position, lo))
        position += size
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
    shard_sizes: Sequence[int],
    seed: int,
    epoch: int,
    layout: Layout,
    batch_size: int,
    shuffle_buffer: int,
    consumed_batches: int = 0,
    multiple: int = 1,
) -> WorkerPlan:
    """The plan of one worker, resuming after the rank consumed `consumed_batches` batches."""
    total = sum(shard_sizes)
    first, count, _ = worker_span(total, layout, batch_size, multiple)
    rank_batches = batches_per_rank(total, layout.world, batch_size, multiple)
    done = consumed_per_worker(worker_batches(rank_batches, layout.workers), consumed_batches)
    skip = done[layout.worker]
    order = shard_permutation(len(shard_sizes), seed, epoch)
    emit = shuffled(
        first,
        count * batch_size,
        shuffle_buffer,
        f"{seed}:{epoch}:{layout.rank}:{layout.worker}",
    )[skip * batch_size :]
    lowest = min(emit) if emit else first + count * batch_size
    needed = segments(shard_sizes, order, first, count * batch_size, skip_below=lowest)
    return WorkerPlan(segments=needed, emit=emit, batches=count - skip)

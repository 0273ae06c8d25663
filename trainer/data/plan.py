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

import itertools
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from mmcurate.core.manifest import Manifest, Shard


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


def mixed(
    manifest: Manifest | Sequence[tuple[Manifest, float]],
) -> tuple[list[Shard], list[WeightedManifest]]:
    """All shards, and each manifest as a WeightedManifest: one manifest, or several with weights
    (samples per epoch = weight x samples)."""
    mix = [(manifest, 1.0)] if isinstance(manifest, Manifest) else list(manifest)
    shards, sources = [], []
    for source, weight in mix:
        first = len(shards)
        shards += source.shards
        sizes = tuple(shard.samples for shard in source.shards)
        sources.append(WeightedManifest(tuple(range(first, len(shards))), sizes, weight))
    return shards, sources


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
    return list(Emission(first, count, buffer, seed))


class Cursor:
    """The state of an emission being drawn: positions in the buffer, the next one to read."""

    def __init__(self) -> None:
        self.held: list[int] = []
        self.following = 0


class Emission:
    """A worker's positions in emission order, made as they are drawn (no list of the span):
    the shuffle buffer of `shuffled` run on positions, less its first `skip` (emitted before
    a resume). Iterating starts over; len, slices and == work as on the list it stands for."""

    def __init__(self, first: int, count: int, buffer: int, seed: str, skip: int = 0) -> None:
        self.first, self.count, self.buffer, self.seed = first, count, buffer, seed
        self.skip = min(max(skip, 0), max(count, 0))
        self._resume: tuple[int, frozenset[int]] | None = None

    def positions(self, cursor: Cursor | None = None) -> Iterator[int]:
        """All `count` positions in emission order; `cursor` follows the buffer's state."""
        cursor = cursor or Cursor()
        held, cursor.following = cursor.held, self.first
        end = self.first + self.count
        if self.buffer <= 1:
            for position in range(self.first, end):
                cursor.following = position + 1
                yield position
            return
        rng = random.Random(self.seed)
        for position in range(self.first, end):
            held.append(position)
            cursor.following = position + 1
            if len(held) >= self.buffer:
                j = rng.randrange(len(held))
                held[j], held[-1] = held[-1], held[j]
                yield held.pop()
        rng.shuffle(held)
        held.reverse()  # popped from the end: the shuffled order
        while held:
            yield held.pop()

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(self.positions(), self.skip, None)

    def resume_point(self) -> tuple[int, frozenset[int]]:
        """(next position to read, positions held in the buffer) after the skipped ones:
        what is left to emit is the held ones and every position from the next on."""
        if self._resume is None:
            cursor = Cursor()
            for _ in itertools.islice(self.positions(cursor), self.skip):
                pass
            self._resume = (cursor.following, frozenset(cursor.held))
        return self._resume

    def lowest(self) -> int:
        """The lowest position left to emit (the end of the span when none is)."""
        following, held = self.resume_point()
        return min(held, default=following)

    def fresh(self, position: int) -> bool:
        """Whether `position` is still to be emitted (not emitted before the resume)."""
        following, held = self.resume_point()
        return position >= following or position in held

    def __len__(self) -> int:
        return self.count - self.skip

    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            return list(itertools.islice(self, index.start, index.stop, index.step))
        if not 0 <= index < len(self):
            raise IndexError(index)
        return next(itertools.islice(self, index, None))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (Emission, list, tuple)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # compares by value, as a list


@dataclass(frozen=True)
class WorkerPlan:
    """What one worker reads this epoch and the order it emits positions in."""

    segments: list[Segment]
    emit: Emission  # epoch positions in emission order, already-consumed ones removed
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
    """The plan of one worker, resuming after the rank consumed `consumed_batches` batches.
    Its memory is O(pieces + shuffle_buffer), whatever the span (the emission is drawn)."""
    total = sum(piece.size for piece in pieces)
    first, count, _ = worker_span(total, layout, batch_size, multiple)
    rank_batches = batches_per_rank(total, layout.world, batch_size, multiple)
    done = consumed_per_worker(worker_batches(rank_batches, layout.workers), consumed_batches)
    skip = min(done[layout.worker], count)
    emit = Emission(
        first,
        count * batch_size,
        shuffle_buffer,
        f"{seed}:{epoch}:{layout.rank}:{layout.worker}",
        skip * batch_size,
    )
    lowest = emit.lowest() if len(emit) else first + count * batch_size
    needed = segments(pieces, first, count * batch_size, skip_below=lowest)
    return WorkerPlan(segments=needed, emit=emit, batches=count - skip)

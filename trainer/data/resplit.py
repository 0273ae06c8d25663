"""A mid-epoch resume on another number of ranks or loader workers: the rest of the epoch,
re-split over the new layout (trainer/data/plan.py splits an epoch by world and workers, so the
old plan's positions cannot simply go on).

A checkpoint holds, besides the current layout and the batches each rank consumed of it,
`carried`: the earlier layouts of the same epoch and what was consumed of each. What is left
of a plan after `consumed` batches per rank is known exactly from the plan itself: in each
worker's span, the positions its shuffle buffer still held and every position from the next
one to read (`Emission.resume_point`), and the tail the old layout dropped for lack of a full
batch. Those positions, in epoch order, become the pieces of a smaller epoch that the new
layout splits as usual (equal full batches per rank). The samples of the epoch are then
trained on exactly once, except a remainder short of one full step of the new layout
(logged, as an epoch's tail is).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from mmcurate.trainer.data.dataset import ShardDataset
from mmcurate.trainer.data.plan import (
    Layout,
    Piece,
    batches_per_rank,
    epoch_pieces,
    worker_plan,
    worker_span,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Split:
    """One earlier layout of an epoch, and the batches each of its ranks consumed."""

    world: int
    workers: int
    consumed: int

    def saved(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class PlanShape:
    """What every layout of the run shares (a resume refuses to change these mid-epoch)."""

    seed: int
    batch_size: int
    shuffle_buffer: int
    multiple: int  # batches per optimizer step (accum_freq)


def unconsumed(pieces: Sequence[Piece], shape: PlanShape, epoch: int, split: Split) -> list:
    """Epoch positions [lo, hi) that `split`'s plan had not yet emitted, sorted, merged."""
    total = sum(piece.size for piece in pieces)
    ranges, covered = [], 0
    for rank in range(split.world):
        for worker in range(split.workers):
            layout = Layout(rank, split.world, worker, split.workers)
            plan = worker_plan(
                pieces,
                shape.seed,
                epoch,
                layout,
                shape.batch_size,
                shape.shuffle_buffer,
                split.consumed,
                shape.multiple,
            )
            first, count, _ = worker_span(total, layout, shape.batch_size, shape.multiple)
            end = first + count * shape.batch_size
            # Why the check: with nothing emitted yet resume_point's cursor never started.
            emitting = count and plan.emit.skip
            following, held = plan.emit.resume_point() if emitting else (first, frozenset())
            ranges += [(p, p + 1) for p in held] + [(following, end)]
            covered = max(covered, end)
    ranges.append((covered, total))  # the tail this layout dropped (no full batch)
    return merged(ranges)


def merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(r for r in ranges if r[0] < r[1]):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(hi, out[-1][1]))
        else:
            out.append((lo, hi))
    return out


def pieces_at(pieces: Sequence[Piece], ranges: list[tuple[int, int]]) -> list[Piece]:
    """The pieces holding epoch positions `ranges` (sorted, disjoint), in position order."""
    out, position, index = [], 0, 0
    for piece in pieces:
        end = position + piece.size
        while index < len(ranges) and ranges[index][0] < end:
            lo, hi = max(ranges[index][0], position), min(ranges[index][1], end)
            out.append(Piece(piece.shard, piece.start + lo - position, piece.start + hi - position))
            if ranges[index][1] > end:
                break  # the range goes on into the next piece
            index += 1
        position = end
    return out


def carried_pieces(
    pieces: Sequence[Piece], shape: PlanShape, epoch: int, splits: Sequence[Split]
) -> list[Piece]:
    """What is left of an epoch after each of `splits` in turn consumed its part."""
    for split in splits:
        pieces = pieces_at(pieces, unconsumed(pieces, shape, epoch, split))
    return list(pieces)


class ResplitDataset(ShardDataset):
    """A ShardDataset whose epoch `carried[0]` is what earlier layouts left of it."""

    carried: tuple[int, list[Piece]] | None = None

    def carry(self, epoch: int, splits: Sequence[Split]) -> int:
        """Plan `epoch` as the rest its `splits` left; returns this rank's batches of it."""
        shape = PlanShape(self.seed, self.batch_size, self.shuffle_buffer, self.step_batches)
        pieces = epoch_pieces(self.sources, self.seed, epoch)
        self.carried = (epoch, carried_pieces(pieces, shape, epoch, splits))
        left = sum(piece.size for piece in self.carried[1])
        batches = self.batches_per_epoch(epoch)
        unused = left - batches * self.batch_size * self.world
        log.info(
            "epoch %d re-split over %d ranks: %d samples left, %d batches per rank%s",
            *(epoch, self.world, left, batches),
            f" ({unused} short of a full step are left out)" if unused else "",
        )
        return batches

    def pieces(self, epoch: int) -> list[Piece]:
        if self.carried and self.carried[0] == epoch:
            return self.carried[1]
        return epoch_pieces(self.sources, self.seed, epoch)

    def batches_per_epoch(self, epoch: int | None = None) -> int:
        if epoch is None or not self.carried or self.carried[0] != epoch:
            return super().batches_per_epoch()
        left = sum(piece.size for piece in self.carried[1])
        return batches_per_rank(left, self.world, self.batch_size, self.step_batches)


def saved_splits(loader: dict[str, Any]) -> list[Split]:
    return [Split(**entry) for entry in loader.get("carried", ())]

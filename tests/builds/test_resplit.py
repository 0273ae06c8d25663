"""trainer/data/resplit.py on plans alone (no loader, no ranks): whatever the old and the new
layout, the samples an epoch's earlier layouts emitted and those the re-split rest emits are
the epoch's samples, each exactly once, and every new rank gets the same number of batches."""

from __future__ import annotations

import pytest
from mmcurate.trainer.data.plan import (
    Layout,
    Piece,
    WeightedManifest,
    batches_per_rank,
    consumed_per_worker,
    epoch_pieces,
    worker_batches,
    worker_plan,
)
from mmcurate.trainer.data.resplit import PlanShape, Split, carried_pieces, merged, pieces_at


def samples_of(pieces: list[Piece], positions: list[int]) -> list[tuple[int, int]]:
    """(shard, offset) of each epoch position of `pieces`."""
    flat = [(p.shard, offset) for p in pieces for offset in range(p.start, p.stop)]
    return [flat[position] for position in positions]


def emitted(pieces, shape: PlanShape, epoch: int, world: int, workers: int, consumed: int):
    """The samples a layout's ranks trained on in their first `consumed` batches."""
    total = sum(p.size for p in pieces)
    counts = worker_batches(
        batches_per_rank(total, world, shape.batch_size, shape.multiple), workers
    )
    done = consumed_per_worker(counts, consumed)
    out = []
    for rank in range(world):
        for worker in range(workers):
            plan = worker_plan(
                pieces, shape.seed, epoch, Layout(rank, world, worker, workers),
                shape.batch_size, shape.shuffle_buffer, 0, shape.multiple,
            )  # fmt: skip
            out += samples_of(pieces, list(plan.emit)[: done[worker] * shape.batch_size])
    return out


SOURCES = [WeightedManifest(tuple(range(5)), (37, 20, 41, 9, 29))]  # 136 samples, uneven


@pytest.mark.parametrize(
    ("layouts", "buffer"),
    [
        ([(4, 2, 3), (2, 2, None)], 16),  # 4 ranks x 2 workers, 3 batches; the rest on 2
        ([(4, 1, 2), (2, 3, 1), (1, 2, None)], 8),  # 4 -> 2 (a batch) -> 1 (the rest)
        ([(2, 2, 5), (3, 1, None)], 1),  # no shuffle buffer, onto 3 ranks
    ],
)
def test_every_sample_is_trained_on_once_across_layouts(layouts, buffer):
    shape = PlanShape(seed=7, batch_size=4, shuffle_buffer=buffer, multiple=1)
    pieces = epoch_pieces(SOURCES, shape.seed, 2)
    seen, splits, current = [], [], pieces
    for world, workers, consumed in layouts:
        current = carried_pieces(pieces, shape, 2, splits)
        if consumed is None:  # the last layout trains on all of its rest
            total = sum(p.size for p in current)
            consumed = batches_per_rank(total, world, shape.batch_size, 1)
            left = total - consumed * world * shape.batch_size
        seen += emitted(current, shape, 2, world, workers, consumed)
        splits.append(Split(world, workers, consumed))
    every = samples_of(pieces, list(range(sum(p.size for p in pieces))))
    assert len(seen) == len(set(seen))  # none twice
    assert len(seen) + left == len(every) and set(seen) <= set(every)
    assert left < layouts[-1][0] * shape.batch_size  # only a tail short of one step is left


def test_pieces_at_cuts_ranges_across_pieces():
    pieces = [Piece(3, 10, 15), Piece(1, 0, 4), Piece(2, 5, 8)]  # positions 0-4, 5-8, 9-11
    ranges = merged([(9, 10), (2, 7), (7, 8), (11, 12)])
    assert ranges == [(2, 8), (9, 10), (11, 12)]
    assert pieces_at(pieces, ranges) == [
        Piece(3, 12, 15),
        Piece(1, 0, 3),
        Piece(2, 5, 6),
        Piece(2, 7, 8),
    ]

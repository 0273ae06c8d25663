"""Reusable shared-memory batch slots between the loader workers and the training process.

Why: a DataLoader hands over each batch in a fresh shared-memory segment, which the training
process maps, faults in page by page and unmaps again: about 3 ms of its time per batch here,
some 5% of a step at 90% demand. Instead each worker writes its batches into a fixed ring of
slots that the training process maps once, and sends only (ring, slot, keys). The training
process gives a slot back when it draws `hold` more batches, so a batch's tensors are views
that stay valid until then; clone them to keep them longer.

A worker that finds its next slot still held (the DataLoader sends a worker more work when
another one has run out) sends that batch the ordinary way, so a slot is never overwritten
while the training process may still read it.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
from torch.utils.data import DataLoader

from trainer.batch import Batch


class Ring:
    """A worker's slots: `images[slot]`, `tokens[slot]`, and how many batches the training
    process has given back (it gives them back in the order they were written)."""

    def __init__(self, slots: int, first: Batch) -> None:
        self.key = uuid.uuid4().hex
        self.images = torch.empty((slots, *first.images.shape), dtype=first.images.dtype)
        self.tokens = torch.empty((slots, *first.tokens.shape), dtype=first.tokens.dtype)
        self.released = torch.zeros(1, dtype=torch.int64)
        for tensor in (self.images, self.tokens, self.released):
            tensor.share_memory_()
        self.written = 0  # worker side only
        self.announced = False  # worker side: whether the training process has the tensors

    @staticmethod
    def holds(batch: Batch) -> bool:
        """Whether batches like this one can go through a ring (not device-decode lists)."""
        return isinstance(batch.images, torch.Tensor)

    def fits(self, batch: Batch) -> bool:
        images, tokens = batch.images, batch.tokens
        return (
            isinstance(images, torch.Tensor)
            and images.shape == self.images.shape[1:]
            and images.dtype == self.images.dtype
            and tokens.shape == self.tokens.shape[1:]
        )

    def free_slot(self) -> int | None:
        """The slot the next batch goes to, or None while the training process holds it."""
        if self.written - int(self.released[0]) >= len(self.images):
            return None
        return self.written % len(self.images)

    def out(self, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[slot], self.tokens[slot]

    def store(self, slot: int, batch: Batch) -> SlotRef | None:
        """`batch` written into `slot` (unless collate stacked it there already), and the
        message that stands for it; None when it does not fit the ring."""
        if not self.fits(batch):
            return None
        images, tokens = self.out(slot)
        if batch.images.data_ptr() != images.data_ptr():
            images.copy_(batch.images)
        tokens.copy_(batch.tokens)
        self.written += 1
        ref = SlotRef(None if self.announced else self, self.key, slot, batch.keys)
        self.announced = True  # the tensors travel once, with the first message
        return ref


class SlotRef(NamedTuple):
    ring: Ring | None  # the ring itself with a worker's first batch, then None
    key: str
    slot: int
    keys: list[str]


class SlotLoader:
    """Iterates a DataLoader whose workers send `SlotRef`s, yielding `Batch`es that are views
    into the rings; ordinary batches pass through. A yielded batch stays valid until `hold`
    more batches have been drawn."""

    def __init__(self, loader: DataLoader, hold: int) -> None:
        if hold < 1:
            raise ValueError("hold must be at least 1")
        self.loader, self.hold = loader, hold

    def __iter__(self) -> Iterator[Batch]:
        # Why not a generator itself: as with a DataLoader, the workers start at iter(), not
        # at the first draw.
        return self.views(iter(self.loader))

    def views(self, items: Iterator[Any]) -> Iterator[Batch]:
        rings: dict[str, Ring] = {}
        held: deque[Ring | None] = deque()
        try:
            for item in items:
                yield self.view(item, rings, held)
                while len(held) >= self.hold:  # the next draw: the oldest held slot is free
                    self.release(held.popleft())
        finally:
            while held:
                self.release(held.popleft())

    @staticmethod
    def release(ring: Ring | None) -> None:
        """Give a batch's slot back to its worker (None: a batch sent the ordinary way)."""
        if ring is not None:
            ring.released += 1

    @staticmethod
    def view(item: Any, rings: dict[str, Ring], held: deque) -> Batch:
        if not isinstance(item, SlotRef):
            held.append(None)
            return item
        if item.ring is not None:
            rings[item.key] = item.ring
        ring = rings[item.key]
        held.append(ring)
        return Batch(ring.images[item.slot], ring.tokens[item.slot], item.keys)

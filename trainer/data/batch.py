"""What the loader yields (its own module so trainer/data/dataset.py and ring.py share it)."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch


class Batch(NamedTuple):
    # [B, 3, H, W] (or clips [B, T, 3, H, W]), uint8 until finished; with device decode, a
    # list of per-sample tensors: still-encoded JPEG bytes (1-D) or already-transformed images
    images: torch.Tensor | list[torch.Tensor]
    tokens: torch.Tensor  # [B, context_length]
    keys: list[str]  # the planned samples, in order (for audits and the resume tests)
    # What the worker found since its previous batch: shards it skipped (indices among the
    # dataset's shards, each reported once per worker) and samples it replaced by others.
    skipped: tuple[int, ...] = ()
    replaced: int = 0
    # The key of the sample each place really holds, where a place was filled by another
    # sample of the batch (an unusable one replaced; "" for stand-ins); None: as `keys`.
    used: list[str] | None = None
    # Bucketed loader only (trainer/data/buckets.py): each place's caption, and SDXL's size and
    # crop conditioning [B, 6] (original h, w; crop top, left; target h, w), else None.
    texts: list[str] | None = None
    conditions: torch.Tensor | None = None


class NoData(NamedTuple):
    """Sent by a worker instead of a batch when no shard holds a usable sample; the
    loader raises trainer.data.manifest.NoUsableData with this message in the training process."""

    message: str


def used_keys(keys: list[str], items: list[Any]) -> list[str] | None:
    """The key of the sample each place of a batch holds, as collate fills the places (an
    unusable sample's place takes the usable one `i % usable` of the batch; "" where none
    of the batch is usable); None when every planned sample is used."""
    usable = [i for i, item in enumerate(items) if item is not None]
    if len(usable) == len(items):
        return None
    if not usable:
        return [""] * len(items)
    return [keys[i if items[i] is not None else usable[i % len(usable)]] for i in range(len(items))]

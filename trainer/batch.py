"""What the loader yields (its own module so trainer/data.py and trainer/ring.py share it)."""

from __future__ import annotations

from typing import NamedTuple

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


class NoData(NamedTuple):
    """Sent by a worker instead of a batch when no shard holds a usable sample; the
    loader raises trainer.manifest.NoUsableData with this message in the training process."""

    message: str

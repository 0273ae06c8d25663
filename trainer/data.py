"""Stream WebDataset shards (local or any fsspec URL) into (image, tokens) training pairs.

Shards are read sequentially with tarfile's streaming mode, so no seeking and no local copy is
needed. Each DataLoader worker takes every n-th shard of a seeded, per-epoch shard order.
"""

from __future__ import annotations

import io
import logging
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import fsspec
import torch
from PIL import Image
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from pipeline.tario import iter_tar_samples
from stages.base import FRAME_COLUMN, IMAGE_COLUMNS
from trainer.cache import ShardCache
from trainer.config import DataConfig
from trainer.manifest import Manifest

log = logging.getLogger(__name__)


def shard_order(urls: Sequence[str], seed: int, epoch: int) -> list[str]:
    """The shard order for one epoch: a shuffle that depends only on (seed, epoch)."""
    order = list(urls)
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return order


def worker_shards(urls: Sequence[str], worker: int, num_workers: int) -> list[str]:
    """The shards one DataLoader worker reads: every `num_workers`-th, starting at `worker`."""
    return list(urls[worker::num_workers])


def decode_image(sample: dict[str, Any]) -> Image.Image | None:
    """The sample's image as RGB, or None when it has no image column."""
    for column in IMAGE_COLUMNS:
        if column in sample:
            with Image.open(io.BytesIO(sample[column])) as img:
                return img.convert("RGB")
    return None


def frame_columns(sample: dict[str, Any]) -> list[str]:
    """A video sample's sampled frames (`000.jpg`, `001.jpg`, ...) in order."""
    return sorted(c for c in sample if FRAME_COLUMN.match(c))


def decode_frames(sample: dict[str, Any]) -> list[Image.Image]:
    frames = []
    for column in frame_columns(sample):
        with Image.open(io.BytesIO(sample[column])) as img:
            frames.append(img.convert("RGB"))
    return frames


class ShardDataset(IterableDataset):
    """Yields `(image_tensor, token_ids)` from a manifest's shards; call set_epoch per epoch.
    A video sample (frames `<key>.000.jpg`, ...) yields its frames as one clip tensor
    [frames, 3, H, W]; a batch of clips is [batch, frames, 3, H, W]."""

    def __init__(
        self,
        manifest: Manifest,
        preprocess: Callable[[Image.Image], torch.Tensor],
        tokenizer: Callable[..., torch.Tensor],
        seed: int = 0,
        storage_options: dict[str, Any] | None = None,
        cache: tuple[str, int] | None = None,
    ) -> None:
        self.urls = [shard.url for shard in manifest.shards]
        self.shard_info = {shard.url: shard for shard in manifest.shards}
        self.cache_spec = cache  # (folder, byte limit): read shards through a local ShardCache
        self._cache: ShardCache | None = None
        self.preprocess = preprocess
        self.tokenizer = tokenizer
        self.seed = seed
        self.storage_options = dict(storage_options or {})
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        # Why: workers are forked per epoch and copy this value, so set it before iter(loader).
        self.epoch = epoch

    def my_shards(self) -> list[str]:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info else (0, 1)
        return worker_shards(shard_order(self.urls, self.seed, self.epoch), worker, num_workers)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        shards = self.my_shards()
        for index, url in enumerate(shards):
            if self.cache_spec:
                self.cache().prefetch([self.shard_entry(u) for u in shards[index + 1 : index + 3]])
            yield from self.read_shard(url)

    def cache(self) -> ShardCache:
        """This process's handle on the node's shard cache (made after the worker forks)."""
        if self._cache is None:
            folder, limit = self.cache_spec
            self._cache = ShardCache(folder, limit, self.storage_options)
        return self._cache

    def shard_entry(self, url: str) -> tuple[str, str | None, int]:
        shard = self.shard_info[url]
        return url, shard.sha256, shard.bytes

    def open_shard(self, url: str) -> Any:
        if self.cache_spec:
            return self.cache().open(*self.shard_entry(url))
        return fsspec.open(url, "rb", **self.storage_options)

    def read_shard(self, url: str) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        skipped = 0
        with self.open_shard(url) as f:
            for sample in iter_tar_samples(f):
                pair = self.to_pair(sample)
                if pair is None:
                    skipped += 1
                    continue
                yield pair
        if skipped:
            log.warning("%s: skipped %d samples lacking a usable image or caption", url, skipped)

    def to_pair(self, sample: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Decode one sample; None (counted, skipped) when the image or caption is unusable."""
        if "txt" not in sample:
            return None
        try:
            text = sample["txt"].decode("utf-8")
            frames = decode_frames(sample)
            if frames:
                clip = torch.stack([self.preprocess(frame) for frame in frames])
                return clip, self.tokenizer([text])[0]
            image = decode_image(sample)
        except (OSError, ValueError, Image.DecompressionBombError):
            return None  # Why: one bad sample must not stop training
        if image is None:
            return None
        return self.preprocess(image), self.tokenizer([text])[0]


def make_loader(dataset: ShardDataset, cfg: DataConfig, pin_memory: bool = False) -> DataLoader:
    """Batches of `cfg.batch_size`; each worker drops its last incomplete batch (contrastive
    losses want full batches)."""
    return DataLoader(
        dataset,
        batch_size=cfg.batch_size,
        num_workers=cfg.workers,
        drop_last=True,
        pin_memory=pin_memory,
    )

"""The bucketed loader: batches of one aspect-ratio bucket each, for Stable Diffusion-style
training on a build made with the `aspect_buckets` stage (`data.batching: bucketed`).

Every image of such a build is already its bucket's size, so a batch of one bucket stacks
into [B, 3, H, W] with no padding and no resize. The plan (trainer/data/bucket_plan.py) comes
from the shards' metadata parquets (`shard-*.parquet`, column `bucket`), read once when the
loader is made: no tar is opened to plan. A bucket's last batch of an epoch is short (its
remainder: never dropped, never padded with repeats); the batch count is made a multiple of
world x step_batches by splitting the largest batches, so every rank yields the same number
of batches and every sample with a bucket comes exactly once per epoch. Samples without a
bucket are left out (counted: `no_bucket`); an image whose decoded size is not its bucket's
is replaced by another of its batch (counted: `off_bucket`).

What the square loader guarantees still holds: equal batches per rank, an exact mid-epoch
resume from (epoch, batches consumed), the node's shard cache, verified streaming, and
byte-bounded memory (samples read ahead of their batch wait in a SampleStore, their media
on local disk past `shuffle_buffer_bytes`). Batches go through a DataLoader (their shapes
vary, so not through trainer/data/ring.py's fixed slots). `mmcurate train` (CLIP, square input)
does not take this option; an SD training script uses `bucketed_loader` (docs/recipes.md).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import fsspec
import numpy as np
import pyarrow.parquet as pq
import torch
from mmcurate.core.manifest import Manifest, ManifestError, Shard
from mmcurate.trainer.data.batch import Batch
from mmcurate.trainer.data.bucket_plan import (
    NO_BUCKET,
    BucketEpoch,
    BucketWorkerPlan,
    bucket_worker_plan,
    epoch_labels,
    plan_epoch,
)
from mmcurate.trainer.data.collate import trained_member
from mmcurate.trainer.data.dataset import ImageTransform, ShardDataset, make_loader
from mmcurate.trainer.data.hold import SampleStore
from mmcurate.trainer.data.manifest import read_manifest
from mmcurate.trainer.data.plan import Layout, epoch_pieces
from torchvision.transforms import Compose, Normalize, ToTensor

log = logging.getLogger(__name__)

READ_THREADS = 8  # metadata parquets read at once when the loader is made


class BucketMetadataError(ManifestError):
    """A shard's metadata gives no buckets (not an aspect_buckets build); one line."""


@dataclass(frozen=True)
class BucketLabels:
    """Each shard's bucket label per sample (indices into `names`, NO_BUCKET for none)."""

    names: tuple[str, ...]  # "WxH", sorted by (width, height)
    shards: tuple[np.ndarray, ...]

    def size(self, label: int) -> tuple[int, int]:
        """(height, width) of bucket `label`: a batch's image shape."""
        width, height = parse_bucket(self.names[label])
        return height, width


def parse_bucket(name: str) -> tuple[int, int]:
    """'832x1216' -> (832, 1216)."""
    width, _, height = name.partition("x")
    if not (width.isdigit() and height.isdigit()):
        raise BucketMetadataError(f"bucket {name!r} is not WIDTHxHEIGHT")
    return int(width), int(height)


def metadata_url(shard: Shard) -> str:
    """The metadata parquet a build writes beside each shard."""
    if not shard.url.endswith(".tar"):
        raise BucketMetadataError(f"{shard.url}: not a .tar shard, so no metadata parquet")
    return shard.url.removesuffix(".tar") + ".parquet"


def shard_buckets(shard: Shard, storage_options: dict[str, Any]) -> list[str | None]:
    """The `bucket` column of one shard's metadata parquet, one value per sample."""
    url = metadata_url(shard)
    try:
        with fsspec.open(url, "rb", **storage_options) as f:
            table = pq.ParquetFile(f)
            if "bucket" not in table.schema_arrow.names:
                raise BucketMetadataError(
                    f"{url} has no bucket column: build with the aspect_buckets stage"
                )
            values = table.read(columns=["bucket"]).column("bucket").to_pylist()
    except BucketMetadataError:
        raise
    except Exception as err:  # noqa: BLE001 - each storage backend raises its own errors
        raise BucketMetadataError(f"cannot read {url}: {type(err).__name__}: {err}") from None
    if len(values) != shard.samples:
        raise BucketMetadataError(
            f"{url} has {len(values)} rows, the manifest says {shard.samples} samples"
        )
    return values


def read_labels(shards: Sequence[Shard], storage_options: dict[str, Any]) -> BucketLabels:
    """Every shard's bucket labels, from its metadata parquet (several read at once)."""
    with ThreadPoolExecutor(READ_THREADS, "mmcurate-buckets") as pool:
        columns = list(pool.map(lambda s: shard_buckets(s, storage_options), shards))
    found = {value for column in columns for value in column if value}
    names = tuple(sorted(found, key=parse_bucket))
    index = {name: i for i, name in enumerate(names)}
    labels = tuple(
        np.array([index[v] if v else NO_BUCKET for v in column], dtype=np.int16)
        for column in columns
    )
    return BucketLabels(names, labels)


def bucket_member(ext: str) -> bool:
    """Members the bucketed loader keeps: the square loader's, plus the json (conditioning)."""
    return ext == "json" or trained_member(ext)


def no_tokens(texts: list[str]) -> torch.Tensor:
    """The tokenizer when none is given: captions come as `Batch.texts`."""
    return torch.zeros((len(texts), 0), dtype=torch.long)


def sd_transform() -> ImageTransform:
    """Images as they are in the shard (their bucket's size), uint8 in the workers; `finish`
    maps them to [-1, 1] floats, the range SD's VAE takes."""
    return ImageTransform(Compose([ToTensor(), Normalize([0.5] * 3, [0.5] * 3)]))


def conditioning(raw: dict[str, Any] | None, size: tuple[int, int]) -> list[int]:
    """SDXL's (original h, w, crop top, left, target h, w) from a sample's json."""
    height, width = size
    meta: dict[str, Any] = {}
    if raw is not None and "json" in raw:
        try:
            loaded = json.loads(raw["json"])
            meta = loaded if isinstance(loaded, dict) else {}
        except (UnicodeDecodeError, json.JSONDecodeError):
            meta = {}
    fields = ("original_height", "original_width", "crop_top", "crop_left")
    defaults = (height, width, 0, 0)
    values = [meta.get(name, d) for name, d in zip(fields, defaults, strict=True)]
    values = [v if isinstance(v, int) else d for v, d in zip(values, defaults, strict=True)]
    return [*values, height, width]


class BucketDataset(ShardDataset):
    """ShardDataset whose batches each come from one bucket (module docstring). Takes the
    same arguments except the transform (images keep their size) and device decode."""

    def __init__(
        self,
        manifest: Manifest | Sequence[tuple[Manifest, float]],
        batch_size: int,
        tokenizer: Callable[..., torch.Tensor] | None = None,
        labels: BucketLabels | None = None,
        **options: Any,
    ) -> None:
        options.pop("device_decode", None)  # variable shapes: decoded in the workers
        transform = options.pop("transform", None) or sd_transform()
        super().__init__(manifest, transform, tokenizer or no_tokens, batch_size, **options)
        self.used_member = bucket_member
        self.labels = labels or read_labels(self.shards, self.storage_options)
        self.want: tuple[int, int] | None = None  # (h, w) of the batch being collated
        self.off_bucket = 0  # decoded images whose size was not their bucket's
        self._epoch: tuple[int, list, BucketEpoch] | None = None
        self.epoch_plan(self.epoch)  # too few samples for the world: fails here, in one line

    def epoch_plan(self, epoch: int) -> BucketEpoch:
        """All ranks' batches of `epoch` (computed once per epoch and process)."""
        if self._epoch is None or self._epoch[0] != epoch:
            pieces = epoch_pieces(self.sources, self.seed, epoch)
            labels = epoch_labels(pieces, self.labels.shards)
            plan = plan_epoch(
                *(labels, self.batch_size, self.seed, epoch, self.world),
                multiple=self.step_batches,
                shuffle_buffer=self.shuffle_buffer,
            )
            self._epoch = (epoch, pieces, plan)
        return self._epoch[2]

    def batches_per_epoch(self, epoch: int | None = None) -> int:
        return len(self.epoch_plan(self.epoch if epoch is None else epoch)) // self.world

    def unlabelled(self, epoch: int | None = None) -> int:
        """Samples of the epoch left out for having no bucket (drop reason `no_bucket`)."""
        return self.epoch_plan(self.epoch if epoch is None else epoch).unlabelled

    def plan(self, epoch: int, layout: Layout, consumed: int) -> BucketWorkerPlan:  # type: ignore[override]
        plan = self.epoch_plan(epoch)
        return bucket_worker_plan(plan, self._epoch[1], layout, consumed)

    def batches(self, plan: BucketWorkerPlan, epoch: int) -> Iterator[Batch]:  # type: ignore[override]
        """The worker's batches in order, each from its samples as the runs bring them."""
        epoch_plan = self.epoch_plan(epoch)
        if epoch_plan.unlabelled and plan.batches and plan.batches[0] == 0:
            log.warning(
                "epoch %d: %d samples have no bucket (no_bucket)", epoch, epoch_plan.unlabelled
            )
        for k, raws in zip(plan.batches, self.batch_samples(plan, epoch_plan), strict=True):
            self.want = self.labels.size(int(epoch_plan.bucket[k]))
            yield self.send(raws, epoch)
        if self.off_bucket:
            log.warning("%d images were not their bucket's size (off_bucket)", self.off_bucket)

    def batch_samples(self, plan: BucketWorkerPlan, epoch: BucketEpoch) -> Iterator[list]:
        """[(position, raw sample or None)] of each planned batch; samples read before their
        batch wait in a byte-bounded store (media on disk past its limit)."""
        reader = self.read_positions(plan.segments)
        wanted = np.unique(np.concatenate([epoch.batch(k) for k in plan.batches] or [[]]))
        pending = SampleStore(self.shuffle_buffer_bytes)
        try:
            for k in plan.batches:
                positions = [int(p) for p in epoch.batch(k)]
                for position in positions:
                    while position not in pending:
                        found, sample = next(reader)
                        at = np.searchsorted(wanted, found)
                        if at < len(wanted) and wanted[at] == found:  # not a read-past gap
                            pending.put(found, sample)
                yield [(position, pending.pop(position)) for position in positions]
        finally:
            pending.close()

    def decode(self, sample: dict[str, Any]) -> tuple[torch.Tensor, str] | None:
        item = super().decode(sample)
        if item is not None and self.want and tuple(item[0].shape[-2:]) != self.want:
            self.off_bucket += 1
            return None  # replaced by another image of the batch (same bucket)
        return item

    def collate(self, raws: list, previous: Batch | None, epoch: int, out: Any = None) -> Batch:
        """The square loader's batch plus each place's caption and conditioning."""
        batch = super().collate(raws, previous, epoch, out)
        size = self.want or tuple(batch.images.shape[-2:])
        by_key = {raw["__key__"]: raw for _, raw in raws if raw is not None}
        before: dict[str, tuple[str, list[int]]] = {}
        if previous is not None and previous.texts is not None:
            rows = previous.conditions.tolist()
            pairs = list(zip(previous.texts, rows, strict=True))
            before = dict(zip(previous.used or previous.keys, pairs, strict=True))
        texts, conditions = [], []
        for key in batch.used or batch.keys:
            raw = by_key.get(key)
            text, row = before.get(key, ("", conditioning(None, size)))
            if raw is not None:
                text, row = caption(raw), conditioning(raw, size)
            texts.append(text)
            conditions.append(row)
        return batch._replace(texts=texts, conditions=torch.tensor(conditions, dtype=torch.long))


def caption(raw: dict[str, Any]) -> str:
    return raw["txt"].decode("utf-8", "replace") if "txt" in raw else ""


class BucketedLoader:
    """What an SD training script iterates: `Batch`es of one bucket each (images uint8
    [B, 3, H, W]: `finish` maps them to [-1, 1]; `texts`; `conditions` for SDXL).

    `set_epoch(e)` before each epoch's iteration; `resume_at(e, consumed)` first to continue
    epoch e after the rank's `consumed` batches (what a checkpoint keeps); `len()` is this
    rank's batches in the current epoch, the same on every rank."""

    def __init__(self, dataset: BucketDataset, workers: int, pin_memory: bool = False) -> None:
        self.dataset = dataset
        self.loader = make_loader(dataset, workers, pin_memory=pin_memory)

    @property
    def buckets(self) -> tuple[str, ...]:
        return self.dataset.labels.names

    def set_epoch(self, epoch: int, epochs: int | None = 1) -> None:
        self.dataset.set_epoch(epoch, epochs)

    def resume_at(self, epoch: int, consumed_batches: int) -> None:
        self.dataset.resume_at(epoch, consumed_batches)

    def finish(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 images (on any device) -> float in [-1, 1]."""
        return self.dataset.transform.finish(images)

    def __len__(self) -> int:
        return self.dataset.batches_per_epoch()

    def __iter__(self) -> Iterator[Batch]:
        return iter(self.loader)


def bucketed_loader(
    manifest: str | Manifest | Sequence[tuple[Manifest, float]],
    batch_size: int,
    *,
    rank: int = 0,
    world: int = 1,
    workers: int = 2,
    tokenizer: Callable[[list[str]], torch.Tensor] | None = None,
    storage_options: dict[str, Any] | None = None,
    pin_memory: bool = False,
    **options: Any,
) -> BucketedLoader:
    """A bucketed loader over a build's manifest (a path or URL, a Manifest, or weighted
    Manifests). `options` are ShardDataset's: seed, shuffle_buffer, shuffle_buffer_bytes,
    step_batches, decode_threads, cache=(folder, byte limit), verify, finish_in_workers."""
    if isinstance(manifest, str):
        manifest = read_manifest(manifest, storage_options)
    dataset = BucketDataset(
        *(manifest, batch_size, tokenizer),
        **(options | {"rank": rank, "world": world, "storage_options": storage_options}),
    )
    return BucketedLoader(dataset, workers, pin_memory)


def loader_from_config(
    data: Any,
    rank: int = 0,
    world: int = 1,
    tokenizer: Callable[[list[str]], torch.Tensor] | None = None,
    storage_options: dict[str, Any] | None = None,
    step_batches: int = 1,
) -> BucketedLoader:
    """`bucketed_loader` from a train config's `data` section (trainer.config.DataConfig,
    with `batching: bucketed`): its manifest and mix, batch size, workers, seed, shuffle,
    cache and verify options."""
    if data.batching != "bucketed":
        raise ManifestError("data.batching: set it to bucketed for the bucketed loader")
    sources = [(data.manifest, data.weight)] + [(m.manifest, m.weight) for m in data.mix]
    manifests = [(read_manifest(url, storage_options), weight) for url, weight in sources]
    cache = None
    if data.cache_dir:
        cache = (data.cache_dir, data.cache_limit_bytes or 100 * 10**9)
    return bucketed_loader(
        *(manifests, data.batch_size),
        **{"rank": rank, "world": world, "workers": data.workers, "tokenizer": tokenizer},
        storage_options=storage_options,
        seed=data.seed,
        shuffle_buffer=data.shuffle_buffer,
        shuffle_buffer_bytes=data.shuffle_buffer_limit,
        step_batches=step_batches,
        decode_threads=data.decode_threads,
        cache=cache,
        verify=data.verify_shards,
    )

"""How a training run gets its data: the sources (data.manifest and data.mix), the
ShardDataset for this rank and its loader."""

from __future__ import annotations

from typing import Any

from mmcurate.core.manifest import Manifest
from mmcurate.trainer.config import TrainConfig
from mmcurate.trainer.data.dataset import ImageTransform, ShardDataset, make_loader
from mmcurate.trainer.data.manifest import read_manifest
from mmcurate.trainer.data.resplit import ResplitDataset
from mmcurate.trainer.data.ring import Transport, transport
from mmcurate.trainer.dist.world import Dist

DEFAULT_CACHE_LIMIT = 100 * 10**9  # when cache_dir is set without cache_limit


def read_sources(cfg: TrainConfig) -> list[tuple[Manifest, float]]:
    """`data.manifest` with `data.weight`, then every `data.mix` entry."""
    entries = [(cfg.data.manifest, cfg.data.weight)]
    entries += [(entry.manifest, entry.weight) for entry in cfg.data.mix]
    return [(read_manifest(url, cfg.storage_options), weight) for url, weight in entries]


def make_dataset(
    cfg: TrainConfig,
    sources: list[tuple[Manifest, float]],
    place: Dist,
    preprocess: Any,
    tokenizer: Any,
) -> ShardDataset:
    cache = None
    if cfg.data.cache_dir:
        cache = (cfg.data.cache_dir, cfg.data.cache_limit_bytes or DEFAULT_CACHE_LIMIT)
    return ResplitDataset(  # a ShardDataset that can re-split a resumed epoch
        sources,
        ImageTransform(preprocess),
        tokenizer,
        batch_size=cfg.data.batch_size,
        seed=cfg.data.seed,
        shuffle_buffer=cfg.data.shuffle_buffer,
        shuffle_buffer_bytes=cfg.data.shuffle_buffer_limit,
        rank=place.rank,
        world=place.world,
        step_batches=cfg.optim.accum_freq,
        device_decode=cfg.data.gpu_decode,
        decode_threads=cfg.data.decode_threads,
        finish_in_workers=place.device.type != "cuda",
        storage_options=cfg.storage_options,
        cache=cache,
        verify=cfg.data.verify_shards,
    )


def training_transport(cfg: TrainConfig, device_type: str) -> Transport:
    """The loader's transport for a run on `device_type` ("cpu" or "cuda"): a pure function
    of the config, so a CPU test checks the very choice a GPU run makes (trainer/data/ring.py)."""
    data = cfg.data
    return transport(device_type, data.workers, cfg.optim.accum_freq, data.gpu_decode)


def make_training_loader(cfg: TrainConfig, dataset: ShardDataset, place: Dist) -> Any:
    """The same loader on the CPU and on CUDA: the loader's own workers and their
    shared-memory rings (a DataLoader only for data.gpu_decode or no workers). On CUDA,
    DevicePrefetcher copies each view to the device on a side stream (trainer/data/prefetch.py)."""
    how = training_transport(cfg, place.device.type)
    return make_loader(dataset, cfg.data.workers, pin_memory=how.pin_memory, hold=how.hold)

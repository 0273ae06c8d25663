"""`mmcurate.video_loader`: batches of random temporal windows of a build's video clips, one
bucket (frame size) per batch, for an outside training script (docs/recipes.md). What it
guarantees and how: trainer/data/video_dataset.py (the dataset its workers run) and
trainer/data/video_epochs.py (the workers, kept across epochs)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mmcurate.core.manifest import Manifest
from mmcurate.trainer.data.manifest import read_manifest
from mmcurate.trainer.data.plan import mixed
from mmcurate.trainer.data.video_clips import (
    read_index,
    warm_imports,
)
from mmcurate.trainer.data.video_dataset import VideoDataset
from mmcurate.trainer.data.video_epochs import PREFETCH_BYTES, VideoLoader, prefetch_batches
from mmcurate.trainer.data.video_windows import (
    decode_threads,
    parse_schedule,
)


def video_loader(
    manifest: str | Manifest | Sequence[tuple[Manifest, float]],
    batch_size: int,
    frames: int,
    *,
    seed: int = 0,
    rank: int = 0,
    world: int = 1,
    workers: int = 2,
    storage_options: dict[str, Any] | None = None,
    cache: tuple[str, int] | None = None,
    verify: bool = True,
    schedule: Sequence[dict[str, Any]] | None = None,
    prefetch_bytes: int = PREFETCH_BYTES,
    epochs: int | None = None,
    **options: Any,
) -> VideoLoader:
    """A window loader over a build's manifest (a path or URL, a Manifest, or weighted
    Manifests). `schedule`: [{"step", "size" ("WxH" or "360p"), "frames"}] (progressive
    resolution, module docstring). `prefetch_bytes`: batches each worker may have ready
    ahead of the step, in bytes (video_epochs.prefetch_batches). `epochs`: the run's
    epochs, when known (the workers then stop after the last). `options` are
    ShardDataset's: shuffle_buffer (in clips), shuffle_buffer_bytes (clips waiting in
    memory, per worker), step_batches."""
    if isinstance(manifest, str):
        manifest = read_manifest(manifest, storage_options)
    phases = parse_schedule(schedule, frames)
    warm_imports()
    shards, _ = mixed(manifest)
    index = read_index(shards, storage_options, cache, verify)
    dataset = VideoDataset(
        *(manifest, batch_size, frames, index, phases),
        **(options | {"seed": seed, "rank": rank, "world": world}),
        threads=decode_threads(workers),
        **{"storage_options": storage_options, "cache": cache, "verify": verify},
    )
    return VideoLoader(dataset, workers, prefetch_batches(dataset, prefetch_bytes), epochs)

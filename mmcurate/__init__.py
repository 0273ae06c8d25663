"""mmcurate: prepare multimodal training data on Ray, and stream it into training.

The public Python API is what this module exports (`__all__`); everything under
`mmcurate.core`, `mmcurate.pipeline`, `mmcurate.stages` and `mmcurate.trainer` is internal and
may change between releases. Each function does what the command of the same name does, with
the same config files (a path, or the same tree as a dict) and `--set` overrides:

    import mmcurate
    result = mmcurate.build({"source": {...}, "stages": [...], "output": {"path": "out"}})
    manifest = mmcurate.read_manifest(result["manifest"])
    summary = mmcurate.train("configs/train_clip.yaml", overrides=["run.max_steps=10"])

Heavy imports (torch, Ray) happen on first call, not on `import mmcurate`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
_ROOT = _HERE.parent
# A source checkout run without installing (a Ray job's `--working-dir .` on a cluster that
# has only that folder): the parts live beside this folder, not in it; find them there.
if not (_HERE / "core").is_dir() and (_ROOT / "pipeline" / "cli.py").is_file():
    __path__.append(str(_ROOT))  # noqa: F821 (a package's own __path__)

Config = Mapping[str, Any] | str | os.PathLike

__all__ = [
    "build",
    "train",
    "evaluate",
    "read_manifest",
    "image_loader",
    "bucketed_loader",
    "video_loader",
    "ConfigError",
]


def __getattr__(name: str) -> Any:
    if name == "ConfigError":
        from mmcurate.core.config_io import ConfigError

        return ConfigError
    raise AttributeError(f"module 'mmcurate' has no attribute {name!r}")


def build(
    config: Config, overrides: Sequence[str] = (), *, progress: bool = False
) -> dict[str, Any]:
    """Build (or resume) a dataset, as `mmcurate build CONFIG`: returns `{"output",
    "manifest", "samples", "shards"}`. A bad config raises ConfigError (one line) before
    anything runs; on one machine the build runs on the same local runtime as the command."""
    from mmcurate.core.redaction import redact_text
    from mmcurate.pipeline.build import run_build
    from mmcurate.pipeline.config import load_build_config
    from mmcurate.pipeline.runtime.session import prestart

    cfg = load_build_config(_tree_or_path(config), list(overrides))
    runtime = prestart(cfg)
    try:
        manifest = run_build(cfg, progress=progress, runtime=runtime)
    finally:
        runtime.close()
    output = cfg.output.path
    return {
        "output": redact_text(output),
        "manifest": output.rstrip("/") + "/manifest.json",
        "samples": manifest["samples"],
        "shards": len(manifest["shards"]),
    }


def train(config: Config, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Train on a build's shards, as `mmcurate train CONFIG` (one process; torchrun and
    `launch.mode: ray` go through the command): returns the run's summary."""
    from mmcurate.trainer.config import load_train_config
    from mmcurate.trainer.train import train as run_training

    return run_training(load_train_config(_tree_or_path(config), list(overrides)))


def evaluate(config: Config, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Zero-shot and retrieval metrics, as `mmcurate eval CONFIG` (clip_benchmark's names)."""
    from mmcurate.trainer.eval.config import load_eval_config
    from mmcurate.trainer.eval.evaluate import evaluate as run_eval

    return run_eval(load_eval_config(_tree_or_path(config), list(overrides)), progress=False)


def read_manifest(url: str, storage_options: dict[str, Any] | None = None) -> Any:
    """A build's manifest.json (a path or fsspec URL; the folder's manifest.json when given
    the folder): its shards with their sizes and sha256."""
    from mmcurate.trainer.data.manifest import read_manifest as read

    return read(url, storage_options)


def image_loader(
    manifest: str | Any,
    batch_size: int,
    *,
    transform: Callable[[Any], Any],
    tokenizer: Callable[[list[str]], Any],
    rank: int = 0,
    world: int = 1,
    workers: int = 2,
    seed: int = 0,
    storage_options: dict[str, Any] | None = None,
    **options: Any,
) -> Any:
    """Image-text batches of a build for your own training loop: an iterable of `Batch`
    (`images` uint8 [B, 3, H, W] after `transform`'s steps before ToTensor, `tokens`,
    `keys`), one rank's share of an epoch, every rank the same number of batches; call
    `.dataset.set_epoch(n)` between epochs. `transform`: open_clip's train preprocess (or any
    torchvision Compose); `tokenizer`: open_clip's. `options`: shuffle_buffer, cache=(folder,
    byte limit), verify, decode_threads."""
    from mmcurate.trainer.data.dataset import ShardDataset, make_loader
    from mmcurate.trainer.data.transform import ImageTransform

    if isinstance(manifest, str):
        manifest = read_manifest(manifest, storage_options)
    dataset = ShardDataset(
        manifest,
        ImageTransform(transform),
        tokenizer,
        batch_size,
        seed=seed,
        rank=rank,
        world=world,
        storage_options=storage_options,
        finish_in_workers=True,
        **options,
    )
    return make_loader(dataset, workers)


def bucketed_loader(manifest: str | Any, batch_size: int, **options: Any) -> Any:
    """Aspect-bucketed batches for Stable Diffusion training (a build with `aspect_buckets`):
    each batch one bucket's size, with SDXL's size and crop conditioning; see
    docs/recipes.md. Options as `mmcurate.trainer.data.buckets.bucketed_loader`."""
    from mmcurate.trainer.data.buckets import bucketed_loader as make

    return make(manifest, batch_size, **options)


def video_loader(
    manifest: str | Any,
    batch_size: int,
    frames: int,
    *,
    seed: int = 0,
    rank: int = 0,
    world: int = 1,
    workers: int = 2,
    storage_options: dict[str, Any] | None = None,
    **options: Any,
) -> Any:
    """Random windows of `frames` frames of a video build's clips for your own training loop:
    each batch a dict of `video` (uint8 [B, T, C, H, W], one bucket per batch), `txt`,
    `__key__`, `bucket` ("WxH") and `frame_start`; one rank's share of an epoch per
    iteration, every rank the same number of batches. `set_epoch(n)`, `state_dict()`,
    `load_state_dict(state)` (an exact mid-epoch resume). `options`: cache=(folder, byte
    limit), verify, schedule=[{"step", "size" ("WxH" or "360p"), "frames"}] (progressive
    resolution: from `step` on, each bucket at about that many pixels and that many frames),
    shuffle_buffer, shuffle_buffer_bytes (clips waiting in a worker, in memory, before they
    wait in files), step_batches (trainer/data/video_loader.py)."""
    from mmcurate.trainer.data.video_loader import video_loader as make

    return make(
        *(manifest, batch_size, frames),
        **{"seed": seed, "rank": rank, "world": world, "workers": workers},
        storage_options=storage_options,
        **options,
    )


def _tree_or_path(config: Config) -> Any:
    """A config tree or a path, as the loaders take them."""
    if isinstance(config, Mapping):
        return dict(config)  # load_yaml copies it: overrides never change the caller's
    return Path(config)

"""The CUDA trainer takes the same loader as the CPU trainer: the loader's own workers and
their shared-memory rings (issue 23). Checked on the CPU, without touching CUDA: the loader
train.py builds for a run on "cuda" is built here the way train.py builds it, and compared
with the one for "cpu"; then the CUDA configuration's loader is run (its workers do not use
CUDA) and its batches are the uint8 ring views that trainer/data/prefetch.py copies to the GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from mmcurate.trainer.config import TrainConfig
from mmcurate.trainer.data.dataset import ShardDataset
from mmcurate.trainer.data.prefetch import DevicePrefetcher
from mmcurate.trainer.data.ring import DEVICE_HOLD, RingLoader
from mmcurate.trainer.dist.world import Dist
from mmcurate.trainer.models import build_model
from mmcurate.trainer.train_data import (
    make_dataset,
    make_training_loader,
    read_sources,
    training_transport,
)

from tests.kit_shards import write_uneven_shards

SIZES = (5, 11, 16)  # 32 samples: 8 batches of 4 on one rank


def config(folder: Path, **data: Any) -> TrainConfig:
    body = {"manifest": str(folder / "manifest.json"), "batch_size": 4, "workers": 2, **data}
    return TrainConfig.model_validate(
        {"data": body, "optim": {"accum_freq": 2}, "run": {"output": str(folder / "run")}}
    )


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("ringcuda")
    write_uneven_shards(folder, SIZES, prefix="c")
    return folder


@pytest.fixture(scope="module")
def parts(shards) -> tuple[Any, Any]:
    _, preprocess, tokenizer = build_model(config(shards).model, torch.device("cpu"))
    return preprocess, tokenizer


def training_loader(cfg: TrainConfig, device: str, parts: tuple[Any, Any]) -> Any:
    """The loader as train.py builds it for a run on `device` (nothing here touches CUDA)."""
    place = Dist(device=torch.device(device))
    dataset = make_dataset(cfg, read_sources(cfg), place, *parts)
    return make_training_loader(cfg, dataset, place)


def shape_of(obj: Any) -> dict[str, type]:
    return {name: type(value) for name, value in vars(obj).items()}


def test_the_cuda_run_builds_the_cpu_runs_ring_loader(shards, parts):
    cfg = config(shards)
    cpu, cuda = training_loader(cfg, "cpu", parts), training_loader(cfg, "cuda", parts)
    assert type(cpu) is type(cuda) is RingLoader
    assert type(cpu.dataset) is type(cuda.dataset)
    assert isinstance(cpu.dataset, ShardDataset)  # trainer/data/resplit.py's subclass, on both
    assert shape_of(cpu) == shape_of(cuda) and shape_of(cpu.dataset) == shape_of(cuda.dataset)
    assert (cpu.workers, cpu.depth) == (cuda.workers, cuda.depth) == (2, cpu.depth)
    # The CPU trains on the views and keeps a step (accum_freq 2) plus the next; CUDA keeps
    # device copies and holds the views whose copies may still run.
    assert (cpu.hold, cuda.hold) == (3, DEVICE_HOLD)
    assert training_transport(cfg, "cuda").rings and training_transport(cfg, "cpu").rings
    # Normalization: in the CPU run's workers, on the device in the CUDA run.
    assert cpu.dataset.finish_in_workers and not cuda.dataset.finish_in_workers
    assert not cuda.dataset.device_decode


def test_gpu_decode_and_no_workers_keep_the_pinned_dataloader(shards):
    """nvJPEG batches are lists of encoded JPEGs of varying sizes: they cannot go through
    fixed slots, so data.gpu_decode keeps a DataLoader with pinned memory; so does workers 0."""
    for cfg in (config(shards, gpu_decode=True), config(shards, workers=0)):
        how = training_transport(cfg, "cuda")
        assert not how.rings and how.hold is None and how.pin_memory
        assert not training_transport(cfg, "cpu").pin_memory


def test_the_cuda_runs_loader_yields_uint8_ring_views_and_resumes_exactly(shards, parts):
    """Run on the CPU, the CUDA run's loader yields uint8 batches that are views into a ring
    (a shared storage holding several batches: what trainer/data/prefetch.py registers with CUDA
    and copies from), finished to normalized float by the device step; a loader resumed after
    3 batches yields exactly the rest."""
    cfg = config(shards)
    torch.manual_seed(0)
    loader = training_loader(cfg, "cuda", parts)
    transform = loader.dataset.transform
    full = []
    for batch in loader:
        storage = batch.images.untyped_storage()
        assert batch.images.dtype == torch.uint8 and storage.is_shared()
        assert storage.nbytes() >= (loader.depth + loader.hold) * batch.images.nbytes
        full.append(batch.keys)
        images = next(iter(DevicePrefetcher([batch], torch.device("cpu"), transform))).images
        assert images.dtype == torch.float32 and images.min() < 0 < images.max()  # normalized
    assert len(full) == 8 and len({key for keys in full for key in keys}) == 32

    resumed = training_loader(cfg, "cuda", parts)
    resumed.dataset.resume_at(0, 3)
    assert [batch.keys for batch in resumed] == full[3:]

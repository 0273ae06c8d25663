"""Shared fixtures: a session Ray (2 CPUs, loopback), a session SeaweedFS S3, tiny data sets."""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from mmcurate.pipeline.runtime.loopback import loopback_only_env

# Nothing a test starts may send traffic off loopback. Ray reads some of these when it is
# imported, so they are set before any test imports it: Ray advertises 127.0.0.1 instead of
# the machine's outside address (see DESIGN.md), sends no usage stats, and its cloud probes
# (169.254.169.254, metadata.google.internal) go to a dead loopback proxy; botocore never asks
# the EC2 metadata service. Library code must never set them. Subprocesses inherit them.
os.environ.update(loopback_only_env())


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """torch on one thread for a module's tests (small models: threads only contend here)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """One local 2-CPU Ray for the whole test session, quiet and without progress bars."""
    import ray
    import ray.data

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        logging_level=logging.WARNING,
        ignore_reinit_error=True,
    )
    ray.data.DataContext.get_current().enable_progress_bars = False
    # Ray Data configures its own logger (INFO to the console) on import.
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """A SeaweedFS S3 server on 127.0.0.1 for the session (runtime.objectstore.LocalS3)."""
    from mmcurate.pipeline.runtime.objectstore import LocalS3

    with LocalS3(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server


@pytest.fixture
def s3_bucket(s3) -> str:
    """A fresh, empty bucket on the session S3 server; returns its name."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    s3.make_bucket(name)
    return name


@pytest.fixture
def image_folder(tmp_path: Path) -> Callable[..., Path]:
    """Factory: `image_folder(n=20, seed=0, exact_copies=0, broken=0) -> Path` of jpg/txt pairs."""
    from mmcurate.pipeline.demo_data import make_demo_images

    counter = iter(range(1_000_000))

    def make(n: int = 20, seed: int = 0, exact_copies: int = 0, broken: int = 0) -> Path:
        folder = tmp_path / f"images-{next(counter)}"
        make_demo_images(folder, n=n, exact_copies=exact_copies, broken=broken, seed=seed)
        return folder

    return make


@pytest.fixture
def tar_shards(tmp_path: Path) -> Callable[..., Path]:
    """Factory: `tar_shards(n_shards=2, per_shard=10, seed=0) -> Path` of WebDataset shards."""
    from mmcurate.pipeline.demo_data import write_tar_shards

    counter = iter(range(1_000_000))

    def make(n_shards: int = 2, per_shard: int = 10, seed: int = 0) -> Path:
        folder = tmp_path / f"shards-{next(counter)}"
        write_tar_shards(folder, n_shards=n_shards, per_shard=per_shard, seed=seed)
        return folder

    return make

"""`launch.mode: ray`: run the same training loop as ranks of a Ray Train TorchTrainer.

Ray Train starts `launch.workers` processes across the cluster, forms the torch process group
(gloo on CPU, NCCL on GPU) and sets RANK / LOCAL_RANK / WORLD_SIZE, so each worker simply runs
`train()`, exactly as under torchrun. Rank 0 writes metrics and checkpoints to `run.output`:
on a multi-node cluster, make it an object-store URL (s3://...) or a shared filesystem.

`launch.max_failures`: when a worker is lost (its process killed, its node or GPU gone) Ray
Train restarts the whole group, up to that many times. We report no checkpoints to Ray Train:
the restarted workers resume from the newest one in `run.output` themselves, as a torchrun
restart does. A small actor (`Attempts`) counts each rank's starts, so a worker knows it is a
restart (trainer/distributed.restart_count) and rank 0 sends the `restart` alert.
"""

from __future__ import annotations

import json
import os
from functools import partial
from typing import Any

from mmcurate.core.storage import filesystem, join
from mmcurate.trainer.config import TrainConfig
from mmcurate.trainer.dist.world import RESTARTS_ENV
from mmcurate.trainer.health.checks import FAULTS_ENV
from mmcurate.trainer.outputs import is_remote


class Attempts:
    """How many times each rank started (a Ray actor of no CPU, one per launch)."""

    def __init__(self) -> None:
        self.starts: dict[int, int] = {}

    def start(self, rank: int) -> int:
        """This rank's earlier starts: 0 on the first attempt."""
        self.starts[rank] = self.starts.get(rank, 0) + 1
        return self.starts[rank] - 1


def train_worker(
    config: dict[str, Any],
    storage_options: dict[str, Any],
    webhook: str | None = None,
    attempts: Any = None,
    env: dict[str, str] | None = None,
) -> None:
    """One Ray Train worker: rank 0 writes `<run.output>/summary.json`. The secrets (storage
    options, the alerts webhook URL) come apart from `config`: Ray Train keeps its loop config
    in its run records, where secrets must never be. `env`: the driver's test hook, if set."""
    import ray
    import ray.train
    from mmcurate.trainer.train import train

    os.environ.update(env or {})
    if attempts is not None:
        rank = ray.train.get_context().get_world_rank()
        os.environ[RESTARTS_ENV] = str(ray.get(attempts.start.remote(rank)))
    train(worker_config(config, storage_options, webhook))


def loop_config(cfg: TrainConfig) -> dict[str, Any]:
    """Ray Train's `train_loop_config`: the config without its secrets (storage_options and
    alerts.webhook travel through the worker function's `partial` instead)."""
    secrets: dict[str, Any] = {"storage_options": True, "alerts": {"webhook"}}
    return {"cfg": cfg.model_dump(mode="json", exclude=secrets)}


def worker_config(
    config: dict[str, Any], storage_options: dict[str, Any], webhook: str | None
) -> TrainConfig:
    """A worker's config: `loop_config`'s with the secrets put back."""
    tree = config["cfg"] | {"storage_options": storage_options}
    tree["alerts"] = tree.get("alerts", {}) | {"webhook": webhook}
    return TrainConfig.model_validate(tree)


def launch_ray(cfg: TrainConfig) -> dict[str, Any]:
    """Train on the Ray cluster this process is connected to (or a local one); returns rank
    0's summary."""
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    if not ray.is_initialized():
        ray.init()
    gpus = cfg.launch.gpus_per_worker
    if gpus is None:
        gpus = 1 if ray.cluster_resources().get("GPU", 0) > 0 else 0
    resources = {"CPU": cfg.launch.cpus_per_worker} | ({"GPU": gpus} if gpus else {})
    storage, storage_filesystem = ray_storage(cfg)
    attempts = ray.remote(num_cpus=0)(Attempts).remote()
    hook = {FAULTS_ENV: os.environ[FAULTS_ENV]} if FAULTS_ENV in os.environ else None
    secrets = {"storage_options": cfg.storage_options, "webhook": cfg.alerts.webhook}
    trainer = TorchTrainer(
        partial(train_worker, **secrets, attempts=attempts, env=hook),
        train_loop_config=loop_config(cfg),
        scaling_config=ScalingConfig(
            num_workers=cfg.launch.workers, use_gpu=bool(gpus), resources_per_worker=resources
        ),
        run_config=RunConfig(
            name="mmcurate-train",
            storage_path=storage,
            storage_filesystem=storage_filesystem,
            failure_config=FailureConfig(max_failures=cfg.launch.max_failures),
        ),
    )
    trainer.fit()
    fs, path = filesystem(join(cfg.run.output, "summary.json"), cfg.storage_options)
    return json.loads(fs.cat_file(path))


def ray_storage(cfg: TrainConfig) -> tuple[str, Any]:
    """Where Ray Train keeps its own run records (we report no checkpoints to it):
    `<run.output>/ray`, on a local disk or on the store through fsspec (so that
    storage_options, an endpoint for one, apply)."""
    url = join(cfg.run.output, "ray")
    if not is_remote(url):
        return url, None
    import pyarrow.fs

    fs, path = filesystem(url, cfg.storage_options)
    return path, pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(fs))

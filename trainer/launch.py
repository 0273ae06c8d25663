"""`launch.mode: ray`: run the same training loop as ranks of a Ray Train TorchTrainer.

Ray Train starts `launch.workers` processes across the cluster, forms the torch process group
(gloo on CPU, NCCL on GPU) and sets RANK / LOCAL_RANK / WORLD_SIZE, so each worker simply runs
`train()`, exactly as under torchrun. Rank 0 writes metrics and checkpoints to `run.output` on
its node: on a multi-node cluster, point it at a shared filesystem.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainer.config import TrainConfig


def train_worker(config: dict[str, Any]) -> None:
    """One Ray Train worker: rank 0 writes `<run.output>/summary.json`."""
    from trainer.train import train

    train(TrainConfig.model_validate(config["cfg"]))


def launch_ray(cfg: TrainConfig) -> dict[str, Any]:
    """Train on the Ray cluster this process is connected to (or a local one); returns rank
    0's summary."""
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    if not ray.is_initialized():
        ray.init()
    gpus = cfg.launch.gpus_per_worker
    if gpus is None:
        gpus = 1 if ray.cluster_resources().get("GPU", 0) > 0 else 0
    resources = {"CPU": cfg.launch.cpus_per_worker} | ({"GPU": gpus} if gpus else {})
    trainer = TorchTrainer(
        train_worker,
        train_loop_config={"cfg": cfg.model_dump(mode="json")},
        scaling_config=ScalingConfig(
            num_workers=cfg.launch.workers, use_gpu=bool(gpus), resources_per_worker=resources
        ),
        run_config=RunConfig(
            name="mmcurate-train", storage_path=str(Path(cfg.run.output).resolve() / "ray")
        ),
    )
    trainer.fit()
    return json.loads((Path(cfg.run.output) / "summary.json").read_text())

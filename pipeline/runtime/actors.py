"""Actor pools for model stages: the model loads once per actor, on a GPU (or CPU if asked).

A stage that can use one (clip_score) gets a `RemoteEncoder` in each partition task: the task
decodes and transforms images on its own CPU (`prepare`), and only uint8 pixels and captions
go to an actor (`encode`), round-robin over the pool from a per-partition offset.

Pool size and placement (per stage): `num_gpus` per actor (None: 1 when the cluster has GPUs,
else 0); with GPUs, `concurrency` actors (None: as many as the GPUs allow). Without GPUs the
model runs inside the tasks, unless `concurrency` asks for that many CPU actors (one CPU each;
this bounds how many copies of a big model a machine holds).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
from mmcurate.core.config_io import ConfigError
from mmcurate.stages.base import Stage

log = logging.getLogger("mmcurate.actors")


class ModelActor:
    def __init__(
        self,
        name: str,
        pretrained: str | None,
        device: str,
        precision: str,
        loader: Callable[[str], Any] | None = None,
    ) -> None:
        if loader is not None:  # the stage's own model (recaption's captioner), given a device
            self.model = loader(device)
            return
        from mmcurate.stages.lib.clip_model import ClipModel  # here: builds without a model skip it

        self.model = ClipModel(name, pretrained, device, precision)

    def transform(self) -> tuple[Any, int]:
        return getattr(self.model, "pil_transform", None), getattr(self.model, "input_side", 0)

    def encode(self, pixels: np.ndarray, texts: list[str] | None) -> tuple:
        return self.model.encode(pixels, texts)

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self.model, method)(*args)


class RemoteEncoder:
    """Prepare here, encode in the pool's actors (what `clip_score` calls its encoder)."""

    def __init__(self, actors: list, transform: Any, side: int) -> None:
        self.actors = actors
        self.transform = transform
        self.side = side
        self.turn = 0

    def starting_at(self, offset: int) -> RemoteEncoder:
        """This pool's handle for one partition: its first call goes to actor `offset`, so
        concurrent partitions spread over the actors."""
        handle = RemoteEncoder(self.actors, self.transform, self.side)
        handle.turn = offset
        return handle

    def prepare(self, images: list[bytes]) -> tuple[list, list]:
        from mmcurate.stages.lib.clip_model import prepare_images

        return prepare_images(images, self.transform, self.side)

    def encode(self, pixels: np.ndarray, texts: list[str] | None) -> tuple:
        import ray

        actor = self.actors[self.turn % len(self.actors)]
        self.turn += 1
        return ray.get(actor.encode.remote(pixels, texts))

    def call(self, method: str, *args: Any) -> Any:
        """Any method of the actors' model (recaption's `caption`, `texts`), round-robin."""
        import ray

        actor = self.actors[self.turn % len(self.actors)]
        self.turn += 1
        return ray.get(actor.call.remote(method, *args))


def pool_shape(stage: Stage, cluster_gpus: float) -> tuple[float, int] | None:
    """(GPUs per actor, actors) for a model stage, or None to run the model in the tasks."""
    opts = stage.options
    gpus = opts.num_gpus if opts.num_gpus is not None else (1.0 if cluster_gpus else 0.0)
    if gpus > 0 and cluster_gpus <= 0:
        raise ConfigError(
            f"stages.{stage.index}.num_gpus: {gpus:g} per actor, but the Ray cluster has no GPU"
        )
    if gpus > 0:
        return gpus, opts.concurrency or max(1, int(cluster_gpus // gpus))
    return (0.0, opts.concurrency) if opts.concurrency else None


START_S = 900  # for every actor of a pool to load its model


def check_devices(stages: list[Stage], gpus: bool, where: str) -> None:
    """`device: cuda` where there is no GPU fails the build in one line, before any work
    (it failed every task with a traceback from torch)."""
    for stage in stages:
        if getattr(stage.options, "device", None) == "cuda" and not gpus:
            raise ConfigError(f"stages.{stage.index}.device: cuda, but {where} has no GPU")


def start_pools(stages: list[Stage], local: bool) -> dict[int, RemoteEncoder]:
    """Start the actor pools the stages ask for; returns an encoder per stage index. A pool
    that cannot be placed or loaded fails the build in one line, and stops what it started.
    On the local runtime (`local`) there are none (it is chosen only when no stage wants a
    pool)."""
    from mmcurate.pipeline.runtime.session import gpus_present

    if local:
        check_devices(stages, gpus_present(), "this machine")
        return {}
    import ray

    cluster_gpus = float(ray.cluster_resources().get("GPU", 0))
    check_devices(stages, cluster_gpus > 0, "the Ray cluster")
    node_gpus = max((n["Resources"].get("GPU", 0) for n in ray.nodes() if n["Alive"]), default=0)
    encoders: dict[int, RemoteEncoder] = {}
    try:
        for stage in stages:
            shape = pool_shape(stage, cluster_gpus) if stage.uses_model_pool else None
            if shape is not None:
                check_fits(stage, *shape, cluster_gpus, node_gpus)
                encoders[stage.index] = start_pool(stage, *shape)
    except BaseException:
        stop_pools(encoders)
        raise
    return encoders


def check_fits(stage: Stage, gpus: float, count: int, cluster: float, node: float) -> None:
    import ray

    where = f"stages.{stage.index}"
    if gpus > node:
        raise ConfigError(
            f"{where}.num_gpus: {gpus:g} per actor, but no node has more than {node:g}"
        )
    cpus = float(ray.cluster_resources().get("CPU", 0))
    if gpus == 0 and count >= cpus:
        raise ConfigError(
            f"{where}.concurrency: {count} CPU actors leave none of the cluster's {cpus:g} CPUs "
            "for the partition tasks"
        )
    if gpus * count > cluster:
        raise ConfigError(
            f"{where}.concurrency: {count} actors x {gpus:g} GPU exceed the cluster's {cluster:g}"
        )


def start_pool(stage: Stage, gpus: float, count: int) -> RemoteEncoder:
    import ray

    opts = stage.options
    device = "cuda" if gpus > 0 else "cpu"
    actor_class = ray.remote(ModelActor).options(
        num_gpus=gpus, num_cpus=0 if gpus else 1, resources=opts.resources or None
    )
    loader = stage.pool_loader() if hasattr(stage, "pool_loader") else None
    pretrained = getattr(opts, "pretrained", None)
    actors = [
        actor_class.remote(opts.model, pretrained, device, opts.precision, loader)
        for _ in range(count)
    ]
    encoder = RemoteEncoder(actors, None, 0)
    try:
        transforms = ray.get([a.transform.remote() for a in actors], timeout=START_S)
    except ray.exceptions.GetTimeoutError:
        stop_pools({0: encoder})
        raise ConfigError(
            f"stages.{stage.index}: {count} model actors did not start in {START_S}s "
            "(not enough CPUs or GPUs free?)"
        ) from None
    except BaseException:
        stop_pools({0: encoder})
        raise
    encoder.transform, encoder.side = transforms[0]
    log.info("%s: %d actors, %g GPU each", stage.name, count, gpus)
    return encoder


def stop_pools(encoders: dict[int, RemoteEncoder]) -> None:
    if not encoders:
        return
    import ray

    for encoder in encoders.values():
        for actor in encoder.actors:
            ray.kill(actor)

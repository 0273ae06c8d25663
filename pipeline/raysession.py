"""The only place that starts or joins a runtime (Ray, or the local pool), and the one helper
that fans work out on it.

`ray.runtime` picks it (docs/configuration.md): `auto` runs on warm local worker processes
(`pipeline/localpool.py`) when the build stays on one machine: no `ray.address`, no
RAY_ADDRESS, Ray not already initialized in this process, no custom `ray.resources`, no model
stage that wants an actor pool; anything else runs on Ray. `prestart(cfg)` starts the runtime
as early as the config is known (the CLI calls it before planning), `connect` joins it.
Ray is imported only when Ray is the runtime.
"""

from __future__ import annotations

import glob
import logging
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from tqdm import tqdm

from core.config_io import ConfigError
from core.mapreduce import RayRunner, Runner
from pipeline.config import RayConfig

if TYPE_CHECKING:
    from pipeline.config import BuildConfig
    from pipeline.localpool import LocalPool

log = logging.getLogger("mmcurate.runtime")

_POOL: list[LocalPool] = []  # the local runtime, when it is the one started


def ray_running() -> bool:
    """Whether Ray is initialized in this process (without importing it when it is not)."""
    return "ray" in sys.modules and sys.modules["ray"].is_initialized()


def gpus_present() -> bool:
    """Whether this machine shows an NVIDIA GPU to its processes (Ray would schedule on it)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return False
    return bool(glob.glob("/dev/nvidia[0-9]*"))


def wants_ray(cfg: BuildConfig) -> str | None:
    """Why this build needs Ray (a cluster, custom resources, an actor pool), or None."""
    if cfg.ray.address or os.environ.get("RAY_ADDRESS"):
        return "ray.address (or RAY_ADDRESS) names a cluster"
    if cfg.ray.resources:
        return "ray.resources asks for custom resources"
    from stages.registry import build_stages

    for stage in build_stages(cfg.stages):
        opts = stage.options
        if stage.uses_model_pool and (
            opts.concurrency or opts.resources or (opts.num_gpus != 0 and gpus_present())
        ):
            return f"stages.{stage.index} ({stage.name}) runs its model in an actor pool"
    return None


def choose_runtime(cfg: BuildConfig, in_ray: bool | None = None) -> str:
    """`ray` or `local` for this build (see the module docstring); a `local` that cannot be
    honoured is a ConfigError. `in_ray`: whether Ray runs in this process (None: look)."""
    reason = wants_ray(cfg)
    if cfg.ray.runtime == "local" and reason is not None:
        raise ConfigError(f"ray.runtime: local, but {reason}; use ray.runtime: ray or auto")
    if cfg.ray.runtime == "auto":
        running = ray_running() if in_ray is None else in_ray
        return "ray" if reason is not None or running else "local"
    return cfg.ray.runtime


def prestart(cfg: BuildConfig) -> str:
    """Start the build's runtime now, while the driver still plans: the local pool's workers
    fork at once (they inherit the imported stages). Returns the runtime's name."""
    kind = choose_runtime(cfg)
    if kind == "local" and not _POOL:
        from pipeline.localpool import LocalPool

        warm_imports()
        _POOL.append(LocalPool(cfg.ray.num_cpus or os.cpu_count() or 1))
    return kind


def warm_imports() -> None:
    """What every task imports, loaded once before the workers fork (they inherit it):
    pyarrow loads pandas (~0.27 s) on its first array, in every process that makes one
    (the build command's own process skips that: `core.pandas_probe`)."""
    import pyarrow as pa

    pa.array([0])


def connect(cfg: RayConfig) -> None:
    """Use the prestarted local pool if there is one (or start it for `runtime: local`); else
    join `ray.address` or RAY_ADDRESS if set, else start a local Ray; reuse one if running.
    Without `prestart`, `auto` means Ray (connect cannot see the stages)."""
    if _POOL:
        return
    if cfg.runtime == "local":
        from pipeline.localpool import LocalPool

        _POOL.append(LocalPool(cfg.num_cpus or os.cpu_count() or 1))
        return
    import ray

    if not ray.is_initialized():
        address = cfg.address or os.environ.get("RAY_ADDRESS")
        if address:
            ray.init(address=address, logging_level=logging.WARNING)
        else:
            ray.init(num_cpus=cfg.num_cpus, include_dashboard=False, logging_level=logging.WARNING)


def shutdown() -> None:
    """Stop the local pool's workers (idle once a build returns: nothing is lost)."""
    while _POOL:
        _POOL.pop().close()


def local_pool() -> LocalPool | None:
    return _POOL[0] if _POOL else None


def runner() -> Runner:
    """What global stages and shard planning fan out on: the local pool's runner when the
    local runtime is up, else Ray's."""
    if _POOL:
        from pipeline.localpool import PoolRunner

        return PoolRunner(_POOL[0])
    return RayRunner()


T = TypeVar("T")
R = TypeVar("R")


def run_tasks(
    items: list[T],
    fn: Callable[[T], R],
    label: str,
    progress: bool = False,
    resources: dict[str, float] | None = None,
) -> list[R]:
    """Run `fn(item)` for each item as a task (one CPU each); return the results in order.

    On the local pool, or as plain Ray tasks rather than a Ray Data `map_batches`: measured
    here, Ray Data's streaming executor held this one-partition-per-task workload to fewer
    concurrent tasks than CPUs (BENCHMARKS.md). Items and `fn` are plain objects; tasks write
    their own outputs to storage, and only what the driver reads comes back. `resources`:
    custom Ray resources each task asks for besides its CPU (e.g. a node pool's label).
    """
    with tqdm(total=len(items), desc=label, unit="task", disable=not progress) as bar:
        if _POOL:
            return _POOL[0].run(items, fn, bar.update)
        return _ray_tasks(items, fn, bar, resources)


_REMOTE: list[Any] = []


def _remote_fn() -> Any:
    """The Ray task that runs one item (defined on first use: Ray is imported only then)."""
    if not _REMOTE:
        import ray

        _REMOTE.append(ray.remote(num_cpus=1, max_retries=3)(_run_one))
    return _REMOTE[0]


def _run_one(fn: Callable[[Any], Any], item: Any) -> Any:
    return fn(item)


def _ray_tasks(
    items: list[Any], fn: Callable, bar: tqdm, resources: dict[str, float] | None
) -> list[Any]:
    """A bounded window keeps the scheduler's queue and the driver's memory small."""
    import ray

    window = max(2, int(ray.available_resources().get("CPU", 1)) * 2)
    fn_ref = ray.put(fn)
    remote = _remote_fn().options(resources=resources) if resources else _remote_fn()
    pending: dict[int, Any] = {}
    results: list[Any] = [None] * len(items)
    for index, item in enumerate(items):
        pending[index] = remote.remote(fn_ref, item)
        if len(pending) >= window:
            collect_one(pending, results)
            bar.update()
    while pending:
        collect_one(pending, results)
        bar.update()
    return results


def collect_one(pending: dict[int, Any], results: list) -> None:
    """Wait for any one pending task and store its result at its index."""
    import ray

    index_of = {ref: index for index, ref in pending.items()}
    done, _ = ray.wait(list(pending.values()), num_returns=1)
    index = index_of[done[0]]
    results[index] = ray.get(pending.pop(index))

"""The only place that starts or joins a runtime (Ray, or the local pool), and the one helper
that fans work out on it.

`ray.runtime` picks it (docs/configuration.md): `auto` runs on warm local worker processes
(`pipeline/runtime/localpool.py`) when the build stays on one machine: no `ray.address`, no
RAY_ADDRESS, Ray not already initialized in this process, no custom `ray.resources`, no model
stage that wants an actor pool; anything else runs on Ray. `prestart(cfg)` starts the runtime
as early as the config is known (the CLI calls it before planning) and returns it as a
`Runtime` value, which the build passes down (no module state chooses where tasks run);
`connect` makes one for a build that was not given one. Ray is imported only when Ray is the
runtime.
"""

from __future__ import annotations

import glob
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from mmcurate.core.config_io import ConfigError
from mmcurate.core.mapreduce import RayRunner, Runner
from mmcurate.pipeline.config import RayConfig
from mmcurate.pipeline.runtime.task_fanout import (
    collect_one,
    pool_tasks,
    ray_tasks,
    ray_tasks_shown,
    task_options,
)
from tqdm import tqdm

if TYPE_CHECKING:
    from mmcurate.pipeline.config import BuildConfig
    from mmcurate.pipeline.runtime.localpool import LocalPool

log = logging.getLogger("mmcurate.runtime")
T = TypeVar("T")
R = TypeVar("R")


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
    from mmcurate.stages.registry import build_stages

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


class Runtime:
    """Where a build's tasks run: the local pool (`pool`), or Ray (`pool` None). One value
    made by `prestart` or `connect` and passed down the build; `close` stops the pool."""

    def __init__(self, pool: LocalPool | None = None) -> None:
        self.pool = pool

    @property
    def kind(self) -> str:
        return "local" if self.pool is not None else "ray"

    def runner(self, task_bytes: int) -> Runner:
        """What global stages and shard planning fan out on: the local pool's runner, or
        Ray's with about `task_bytes` held by each call."""
        if self.pool is not None:
            from mmcurate.pipeline.runtime.localpool import PoolRunner

            return PoolRunner(self.pool)
        return WindowRunner(task_bytes)

    def run_tasks(self, items: list[T], fn: Callable[[T], R], label: str, **how: Any) -> list[R]:
        """`run_tasks` on this runtime (its keyword arguments)."""
        return run_tasks(items, fn, label, pool=self.pool, **how)

    def task_memory(self, cfg: BuildConfig) -> int:
        """Bytes a partition task declares (`fitted_memory`; the local pool declares none)."""
        return partition_memory(cfg) if self.pool is not None else fitted_memory(cfg)

    def close(self) -> None:
        """Stop the local pool's workers (idle once a build returns: nothing is lost); a Ray
        this process joined or started stays up for the next build, as `ray.init` leaves it."""
        if self.pool is not None:
            self.pool.close()
            self.pool = None


def prestart(cfg: BuildConfig) -> Runtime:
    """Start the build's runtime now, while the driver still plans: the local pool's workers
    fork at once (they inherit the imported stages). Ray is joined later, by `connect`."""
    if choose_runtime(cfg) == "local":
        from mmcurate.pipeline.runtime.localpool import LocalPool

        warm_imports()
        # One worker forks now, warm while the driver plans; the rest as tasks need them
        # (min(CPUs, tasks): a one-partition build never forks one per core).
        return Runtime(LocalPool(cfg.ray.num_cpus or os.cpu_count() or 1, start=1))
    return Runtime()


def warm_imports() -> None:
    """What every task imports, loaded once before the workers fork (they inherit it):
    pyarrow loads pandas (~0.27 s) on its first array, in every process that makes one
    (the build command's own process skips that: `core.pandas_probe`)."""
    import pyarrow as pa

    pa.array([0])


def connect(cfg: RayConfig, runtime: Runtime | None = None) -> Runtime:
    """The runtime to run on: `runtime` when it is the local pool; a new local pool for
    `runtime: local`; else Ray: join `ray.address` or RAY_ADDRESS if set, else start a local
    Ray, reusing one already running. Without `prestart`, `auto` means Ray (connect cannot
    see the stages)."""
    if runtime is not None and runtime.pool is not None:
        return runtime
    if cfg.runtime == "local":
        from mmcurate.pipeline.runtime.localpool import LocalPool

        return Runtime(LocalPool(cfg.num_cpus or os.cpu_count() or 1, start=0))
    import ray

    if not ray.is_initialized():
        address = cfg.address or os.environ.get("RAY_ADDRESS")
        if address:
            ray.init(address=address, logging_level=logging.WARNING)
        else:
            ray.init(num_cpus=cfg.num_cpus, include_dashboard=False, logging_level=logging.WARNING)
    return runtime or Runtime()


class WindowRunner(RayRunner):
    """Ray's runner whose `run` keeps a bounded window of tasks in flight instead of
    submitting every call at once. Its calls (phase B rounds, kept tables, the commit's
    groups) each hold one signature group, capped by rows and by bytes (pipeline/output/groups.py),
    so the window, the cluster's CPUs but no more than its memory holds at `task_bytes` each,
    bounds what they hold together. Results in call order, as RayRunner's."""

    def __init__(self, task_bytes: int) -> None:
        self.task_bytes = task_bytes

    def window(self) -> int:
        import ray

        memory = int(ray.cluster_resources().get("memory", 0))
        return max(1, min(self.parallelism, memory // self.task_bytes))

    def task_memory(self) -> int:
        """Bytes each call declares to Ray, so a node takes no more calls than its memory
        holds: `task_bytes`, lowered to the largest node's memory (more would never run)."""
        largest = node_memory()
        return min(self.task_bytes, largest) if largest else self.task_bytes

    def run(self, fn: Callable[..., Any], calls: Sequence[tuple]) -> list[Any]:
        import ray

        task = ray.remote(num_cpus=1, max_retries=3, memory=self.task_memory())(_call_with)
        fn_ref, window = ray.put(fn), self.window()
        pending: dict[int, Any] = {}
        results: list[Any] = [None] * len(calls)
        for index, call in enumerate(calls):
            pending[index] = task.remote(fn_ref, *call)
            if len(pending) >= window:
                collect_one(pending, results)
        while pending:
            collect_one(pending, results)
        return results


def _call_with(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


WORKER_BYTES = 512 << 20  # a task worker before its data: interpreter, pyarrow, PIL, numpy
CHUNK_COPIES = 3  # a chunk held as read, as the stages' output and as the tar write's buffer


def partition_memory(cfg: BuildConfig) -> int:
    """Bytes a partition task declares to Ray: `ray.task_memory`, else CHUNK_COPIES x
    `source.chunk_bytes` + WORKER_BYTES (a partition task holds about three chunks at once;
    docs/configuration.md). A model stage run inside the task adds its model: set it then."""
    if cfg.ray.task_memory:
        return cfg.ray.task_memory
    return CHUNK_COPIES * cfg.source.chunk_bytes + WORKER_BYTES


def node_memory() -> int:
    """The most memory (bytes) any live Ray node offers tasks."""
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    return int(max((n["Resources"].get("memory", 0) for n in nodes), default=0))


def fitted_memory(cfg: BuildConfig) -> int:
    """`partition_memory`, checked against a local Ray (a task asking for more than any node
    has would wait forever): the default is lowered to fit, an explicit `ray.task_memory`
    that cannot fit fails in one line. On a cluster it is asked as is (an autoscaler may add
    bigger nodes)."""
    wanted = partition_memory(cfg)
    if cfg.ray.address or os.environ.get("RAY_ADDRESS"):
        return wanted
    largest = node_memory()
    if wanted <= largest or not largest:
        return wanted
    if cfg.ray.task_memory:
        raise ConfigError(
            f"ray.task_memory: {wanted} bytes per task, but this Ray's largest node offers "
            f"{largest}; lower it or run on a cluster with bigger nodes"
        )
    return largest


def run_tasks(
    items: list[T],
    fn: Callable[[T], R],
    label: str,
    progress: bool = False,
    resources: dict[str, float] | None = None,
    memory: int | None = None,
    on_result: Callable[[int, R], None] | None = None,
    pool: LocalPool | None = None,
) -> list[R]:
    """Run `fn(item)` for each item as a task (one CPU each) on `pool`, or on Ray without
    one; return the results in order.

    On the local pool, or as plain Ray tasks rather than a Ray Data `map_batches`: measured
    here, Ray Data's streaming executor held this one-partition-per-task workload to fewer
    concurrent tasks than CPUs (docs/benchmarks/ingest.md). Items and `fn` are plain objects;
    tasks write their own outputs to storage, and only what the driver reads comes back.
    `resources`: custom Ray resources each task asks for besides its CPU (e.g. a node pool's label).
    `memory`: bytes each Ray task declares (Ray then places no more tasks on a node than its
    memory holds; the local pool ignores it). `on_result(index, result)` runs here, in the
    driver, as each task's result arrives (phase C retires candidates with it). With
    `progress`, the bar's postfix shows what running tasks have done so far (samples, seconds
    of video: core/progress.py), refreshed about once a second.
    """
    with tqdm(total=len(items), desc=label, unit="task", disable=not progress) as bar:

        def arrived(index: int, result: Any) -> None:
            bar.update()
            if on_result is not None:
                on_result(index, result)

        if pool is not None:
            return pool_tasks(pool, items, fn, arrived, bar if progress else None)
        options = task_options(resources, memory)
        if not progress:
            return ray_tasks(items, fn, arrived, options)
        return ray_tasks_shown(items, fn, arrived, options, bar)

"""The only place that starts or joins a runtime (Ray, or the local pool), and the one helper
that fans work out on it.

`ray.runtime` picks it (docs/configuration.md): `auto` runs on warm local worker processes
(`pipeline/runtime/localpool.py`) when the build stays on one machine: no `ray.address`, no
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
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from mmcurate.core import progress as task_progress
from mmcurate.core.config_io import ConfigError
from mmcurate.core.mapreduce import RayRunner, Runner
from mmcurate.pipeline.config import RayConfig
from tqdm import tqdm

if TYPE_CHECKING:
    from mmcurate.pipeline.config import BuildConfig
    from mmcurate.pipeline.runtime.localpool import LocalPool

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


def prestart(cfg: BuildConfig) -> str:
    """Start the build's runtime now, while the driver still plans: the local pool's workers
    fork at once (they inherit the imported stages). Returns the runtime's name."""
    kind = choose_runtime(cfg)
    if kind == "local" and not _POOL:
        from mmcurate.pipeline.runtime.localpool import LocalPool

        warm_imports()
        # One worker forks now, warm while the driver plans; the rest as tasks need them
        # (min(CPUs, tasks): a one-partition build never forks one per core).
        _POOL.append(LocalPool(cfg.ray.num_cpus or os.cpu_count() or 1, start=1))
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
        from mmcurate.pipeline.runtime.localpool import LocalPool

        _POOL.append(LocalPool(cfg.num_cpus or os.cpu_count() or 1, start=0))
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


def runner(task_bytes: int) -> Runner:
    """What global stages and shard planning fan out on: the local pool's runner when the
    local runtime is up, else Ray's, with about `task_bytes` held by each call."""
    if _POOL:
        from mmcurate.pipeline.runtime.localpool import PoolRunner

        return PoolRunner(_POOL[0])
    return WindowRunner(task_bytes)


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
    if _POOL or cfg.ray.address or os.environ.get("RAY_ADDRESS"):
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


T = TypeVar("T")
R = TypeVar("R")


def run_tasks(
    items: list[T],
    fn: Callable[[T], R],
    label: str,
    progress: bool = False,
    resources: dict[str, float] | None = None,
    memory: int | None = None,
    on_result: Callable[[int, R], None] | None = None,
) -> list[R]:
    """Run `fn(item)` for each item as a task (one CPU each); return the results in order.

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

        if _POOL:
            return _pool_tasks(_POOL[0], items, fn, arrived, bar if progress else None)
        options = task_options(resources, memory)
        if not progress:
            return _ray_tasks(items, fn, arrived, options)
        return _ray_tasks_shown(items, fn, arrived, options, bar)


def _pool_tasks(
    pool: LocalPool, items: list, fn: Callable, arrived: Callable, bar: tqdm | None
) -> list[Any]:
    """On the local pool; with a bar, its postfix sums the workers' shared counters."""
    if bar is None:
        return pool.run(items, fn, on_result=arrived)
    start = pool.counters.totals()
    meter = task_progress.Meter(bar.set_postfix_str, lambda: pool.counters.since(start))
    results = pool.run(items, fn, on_result=arrived, tick=meter.tick)
    meter.refresh()  # the run's totals, as the bar closes
    return results


def _ray_tasks_shown(
    items: list, fn: Callable, arrived: Callable, options: dict[str, Any], bar: tqdm
) -> list[Any]:
    """As Ray tasks that report to a tally actor as they run and return their totals with
    their results: the postfix is the finished tasks' totals plus the running ones' so far."""
    import ray

    tally = ray.remote(num_cpus=0)(task_progress.Tally).remote()
    reader, done = TallyReader(tally), [0.0] * len(task_progress.UNITS)
    meter = task_progress.Meter(bar.set_postfix_str, lambda: reader.read(done))

    def settled(index: int, value: tuple[Any, list[float]]) -> None:
        done[:] = task_progress.add(done, value[1])
        tally.finish.remote(index)  # before the driver's next read: calls from here are in order
        arrived(index, value[0])

    try:
        results = _ray_tasks(items, fn, settled, options, tally, meter.tick)
    finally:
        ray.kill(tally)
    meter.read = lambda: done
    meter.refresh()  # the finished tasks' totals, exact, as the bar closes
    return [value for value, _ in results]


class TallyReader:
    """The tally's live counts, never blocking the driver: one request in flight at a time."""

    def __init__(self, tally: Any) -> None:
        self.tally, self.asked, self.live = tally, None, None

    def read(self, done: list[float]) -> list[float] | None:
        import ray

        if self.asked is not None and ray.wait([self.asked], timeout=0)[0]:
            try:
                self.live = ray.get(self.asked)
            except ray.exceptions.RayError:  # a lost actor: no live counts, never a failed build
                self.live = None
            self.asked = None
        if self.asked is None:
            self.asked = self.tally.live.remote()
        return done if self.live is None else task_progress.add(done, self.live)


_REMOTE: list[Any] = []


def _remote_fn() -> Any:
    """The Ray task that runs one item (defined on first use: Ray is imported only then)."""
    if not _REMOTE:
        import ray

        _REMOTE.append(ray.remote(num_cpus=1, max_retries=3)(_run_one))
    return _REMOTE[0]


def _run_one(fn: Callable[[Any], Any], item: Any, tally: Any = None, key: int = 0) -> Any:
    """fn(item); with a tally actor, (result, what it reported: core/progress.py), counts sent
    to the tally about once a second as it runs (never waited on: no blocked task)."""
    if tally is None:
        return fn(item)
    sink = task_progress.Batched(lambda counts: tally.add.remote(key, counts)).every_interval()
    with task_progress.channel(sink):
        result = fn(item)
    return result, sink.total


def task_options(resources: dict[str, float] | None, memory: int | None) -> dict[str, Any]:
    """Ray `.options()` for a task that asks for custom resources and memory (none: {})."""
    options: dict[str, Any] = {"resources": resources} if resources else {}
    return options | ({"memory": memory} if memory else {})


def _ray_tasks(
    items: list[Any],
    fn: Callable,
    arrived: Callable[[int, Any], None],
    options: dict[str, Any],
    tally: Any = None,
    tick: Callable[[], None] | None = None,
) -> list[Any]:
    """A bounded window keeps the scheduler's queue and the driver's memory small. `tally`: the
    actor tasks report to (results then carry counts); `tick`: called every INTERVAL_S or so."""
    import ray

    window = max(2, int(ray.available_resources().get("CPU", 1)) * 2)
    fn_ref = ray.put(fn)
    remote = _remote_fn().options(**options) if options else _remote_fn()
    pending: dict[int, Any] = {}
    results: list[Any] = [None] * len(items)
    timeout = None if tick is None else task_progress.INTERVAL_S

    def collect() -> None:
        got = collect_one(pending, results, timeout)
        if tick is not None:
            tick()
        if got is not None:
            arrived(*got)

    for index, item in enumerate(items):
        pending[index] = remote.remote(fn_ref, item, *(() if tally is None else (tally, index)))
        while len(pending) >= window:
            collect()
    while pending:
        collect()
    return results


def collect_one(
    pending: dict[int, Any], results: list, timeout: float | None = None
) -> tuple[int, Any] | None:
    """Wait for any one pending task (at most `timeout` s: None when none finished by then)
    and store its result at its index; returns both."""
    import ray

    index_of = {ref: index for index, ref in pending.items()}
    done, _ = ray.wait(list(pending.values()), num_returns=1, timeout=timeout)
    if not done:
        return None
    index = index_of[done[0]]
    results[index] = ray.get(pending.pop(index))
    return index, results[index]

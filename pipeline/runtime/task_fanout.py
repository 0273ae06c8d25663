"""How `run_tasks` fans out (pipeline/runtime/session.py): on the local pool, or as Ray tasks
in a bounded window, with a progress bar whose postfix sums what running tasks reported
(core/progress.py). Ray is imported only inside the Ray paths."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mmcurate.core import progress as task_progress
from tqdm import tqdm

if TYPE_CHECKING:
    from mmcurate.pipeline.runtime.localpool import LocalPool


def pool_tasks(
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


def ray_tasks_shown(
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
        results = ray_tasks(items, fn, settled, options, tally, meter.tick)
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


def ray_tasks(
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

"""The local runtime: warm worker processes forked for builds on one machine.

Forked after the driver has imported the build's modules (stages, PIL, pyarrow): a worker
starts in milliseconds with everything a task needs already loaded, where a fresh local Ray
costs seconds to start (docs/benchmarks/fixed_cost.md). Every worker is forked by the pool's
zygote, itself forked when the pool is made, before the driver loads a model: never by the
driver later, whose thread pools (torch's OpenMP) deadlock a forked child (zygote.py). The
contract is Ray's: results in input order, an exception in a task fails the run, and a task
whose worker process dies is run again on a fresh worker (up to `MAX_RETRIES` times, Ray's
`max_retries`), so a crashed worker never fails the build. In a process that already runs Ray
(a test session, a notebook) the workers are spawned instead: forking there is unsafe
(`start_method`).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing
import os
import pickle
import signal
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from multiprocessing.connection import Connection, wait
from typing import Any

from mmcurate.core.atomic import pid_gone
from mmcurate.core.mapreduce import MapFn, ReduceFn, check_partitions
from mmcurate.core.progress import INTERVAL_S, Counters, channel
from mmcurate.pipeline.runtime.zygote import Zygote

log = logging.getLogger("mmcurate.localpool")

MAX_RETRIES = 3  # runs of a task after its worker died, as Ray's max_retries


class WorkerCrashed(RuntimeError):
    """A task's worker process died on every try."""


def dumps(value: Any, fresh: bool = False) -> bytes:
    """Plain pickle; closures and lambdas (which Ray ships with cloudpickle) fall back to it.
    `fresh`: for workers that never saw this process's `__main__` (spawned, or spawned once
    a zygote gone): what refers to it (a notebook's functions) goes by value, with cloudpickle."""
    try:
        data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        if not (fresh and b"__main__" in data):
            return data
    except (pickle.PicklingError, AttributeError, TypeError):
        pass
    from ray import cloudpickle

    return cloudpickle.dumps(value)


class _Worker:
    """One worker process and the driver's end of its socket: forked by the pool's zygote, or
    spawned where this process runs Ray (`start_method`)."""

    def __init__(self, zygote: Zygote | None, counters: Counters) -> None:
        self.method = "fork" if zygote is not None else "spawn"
        self.process: multiprocessing.process.BaseProcess | None = None
        self.pid: int | None = None
        if self.method == "fork":
            self.pid, self.conn = zygote.fork_worker()
        else:
            context = multiprocessing.get_context("spawn")
            self.conn, child = context.Pipe()
            args = (child, [], counters)  # the counters travel as the process starts
            self.process = context.Process(target=_serve, args=args, name="mmcurate-worker")
            self.process.start()
            child.close()
        self.fn_token: int | None = None  # the function this worker holds
        self.index: int | None = None  # the task it runs

    @property
    def waitables(self) -> list[Any]:
        """What becomes ready when a task finishes or the worker dies (a zygote's worker
        closes its socket as it dies; a spawned one also has its process sentinel)."""
        return [self.conn] + ([self.process.sentinel] if self.process is not None else [])

    def alive(self) -> bool:
        if self.process is not None:
            return self.process.is_alive()
        try:
            os.kill(self.pid, 0)  # the zygote reaps its children: a dead worker's pid is gone
        except ProcessLookupError:
            return False
        return not self.conn.closed

    def stop(self, kill: bool = False) -> None:
        """Close its socket: an idle worker exits on EOF. `kill`: also kill it now (it may be
        busy; a worker known dead is never killed, its pid may already be another's)."""
        try:
            self.conn.close()
        finally:
            if self.process is not None:
                if self.process.is_alive():
                    self.process.kill()  # idle or finished: nothing to lose
                self.process.join(timeout=5)
            elif kill and self.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                wait_gone(self.pid)


def wait_gone(pid: int, timeout_s: float = 10.0) -> None:
    """Return once a killed worker has exited (at most `timeout_s`): a SIGKILL is delivered
    asynchronously, and the sweep that follows a failed run removes a dead worker's spill
    folder only (a still-exiting worker looks alive to it)."""
    deadline = time.monotonic() + timeout_s
    while not pid_gone(pid) and time.monotonic() < deadline:
        time.sleep(0.01)


@contextlib.contextmanager
def single_threaded_opencv() -> Iterator[None]:
    """OpenCV's own thread pool off in what forks meanwhile (the zygote, so every worker; each
    runs one task per core anyway): a forked worker that enters a pool the driver started (a
    notebook that used cv2 before `mmcurate.build`) waits forever on threads the fork did not
    copy. The driver's own setting is put back."""
    cv2 = sys.modules.get("cv2")
    if cv2 is None or not hasattr(cv2, "setNumThreads"):
        yield
        return
    threads = cv2.getNumThreads()
    cv2.setNumThreads(1)
    try:
        yield
    finally:
        cv2.setNumThreads(threads)


def single_threaded_torch() -> None:
    """One torch thread in a worker whose driver had imported torch (the environment variable
    above is read only when torch starts): torch then runs its ops inline, never entering an
    OpenMP pool that a driver which had used torch (a notebook) left behind in the fork."""
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "set_num_threads"):
        torch.set_num_threads(1)


def start_method() -> str:
    """Fork (the zygote, then workers from it), for workers warm in milliseconds; but spawn
    where this process runs Ray: a fork copies the locks of Ray's gRPC threads held, and the
    driver's next GCS call can hang (ray-project/ray#59661; seen here as
    `ray.available_resources()` never returning)."""
    ray = sys.modules.get("ray")
    return "spawn" if ray is not None and ray.is_initialized() else "fork"


class LocalPool:
    """Up to `workers` processes, `start` of them started now (default: all); `run(items, fn)`
    runs fn(item) on them, starting more only while a run has more tasks than live workers:
    a build of one partition never forks a worker per core."""

    def __init__(self, workers: int, start: int | None = None) -> None:
        self.limit = max(1, workers)
        # What tasks have done so far, a row per worker slot: made before the zygote forks, so
        # every worker has it (core/progress.py); the driver reads `counters.totals()`.
        self.counters = Counters(self.limit)
        # Forked now, while this process is clean: every worker is forked from it, never from
        # this process once it may have started thread pools (zygote.py).
        serve = partial(_serve, counters=self.counters)
        with single_threaded_opencv():
            self.zygote = Zygote(serve) if start_method() == "fork" else None
        self.workers: list[_Worker] = []
        self.grow(self.limit if start is None else start)
        self.retried = 0  # tasks run again after their worker died
        self._token = 0
        atexit.register(self.close)

    @property
    def size(self) -> int:
        return len(self.workers)

    def grow(self, tasks: int) -> None:
        """Live workers up to min(limit, tasks)."""
        while len(self.workers) < min(self.limit, tasks):
            self.workers.append(self._new_worker())

    def _new_worker(self) -> _Worker:
        """From the zygote; spawned if the zygote is gone (killed: a spawn is slow but safe)."""
        if self.zygote is not None:
            try:
                return _Worker(self.zygote, self.counters)
            except (OSError, EOFError, ValueError):
                log.warning("the local pool's zygote is gone; workers are spawned from now on")
                self.zygote = None
        return _Worker(None, self.counters)

    def close(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.workers = []
        if self.zygote is not None:
            self.zygote.close()
            self.zygote = None

    def run(
        self,
        items: Sequence[Any],
        fn: Callable[[Any], Any],
        done: Callable[[], None] | None = None,
        on_result: Callable[[int, Any], None] | None = None,
        tick: Callable[[], None] | None = None,
    ) -> list[Any]:
        """fn(item) for each item on the workers; results in input order. `done` is called
        after each task (a progress bar's update), `on_result(index, result)` too; `tick`
        at least every INTERVAL_S while tasks run (a bar's in-task counters)."""
        self.grow(len(items))
        self._token += 1
        spawned = self.zygote is None or any(w.method != "fork" for w in self.workers)
        token, blob = self._token, dumps(fn, fresh=spawned)
        queue = deque(range(len(items)))
        tries = [0] * len(items)
        results: list[Any] = [None] * len(items)
        while queue or self._busy():
            self._dispatch(queue, items, token, blob)
            collected = self._collect(None if tick is None else INTERVAL_S)
            if tick is not None:
                tick()
            for index, ok, value in collected:
                if ok is None:  # its worker died: run it again on a fresh one
                    tries[index] += 1
                    if tries[index] > MAX_RETRIES:
                        self._stop_busy()
                        raise WorkerCrashed(f"a task's worker died {tries[index]} times")
                    self.retried += 1
                    queue.appendleft(index)
                    continue
                if not ok:
                    self._stop_busy()  # their results belong to this failed run
                    raise value
                results[index] = value
                if done is not None:
                    done()
                if on_result is not None:
                    on_result(index, value)
        return results

    def _busy(self) -> list[_Worker]:
        return [w for w in self.workers if w.index is not None]

    def _dispatch(self, queue: deque, items: Sequence[Any], token: int, blob: bytes) -> None:
        """Hand queued tasks to idle workers; a worker that died idle is replaced."""
        for slot, worker in enumerate(list(self.workers)):
            if worker.index is not None or not queue:
                continue
            index = queue.popleft()
            send = blob if worker.fn_token != token else None
            try:  # slot: its row of the progress counters (a replacement takes the same)
                worker.conn.send_bytes(dumps((token, send, slot, items[index])))
            except OSError:
                queue.appendleft(index)
                self._replace(worker)  # the fresh one gets a task on the next pass
                continue
            worker.fn_token, worker.index = token, index

    def _collect(self, timeout: float | None = None) -> list[tuple[int, bool | None, Any]]:
        """Wait for at least one busy worker (at most `timeout` s); (index, ok, value) per
        finished task, ok None when the worker died (it is replaced)."""
        busy = self._busy()
        if not busy:
            return []
        ready = set(wait([item for w in busy for item in w.waitables], timeout))
        out = []
        for worker in busy:
            if ready.isdisjoint(worker.waitables):
                continue
            index, worker.index = worker.index, None
            try:
                ok, value = pickle.loads(worker.conn.recv_bytes())
            except (EOFError, OSError):
                log.warning("a worker process died (pid %s); its task runs again", worker.pid)
                self._replace(worker)
                out.append((index, None, None))
                continue
            # Why broad: a result or exception that does not unpickle fails the task, in one line.
            except Exception as err:  # noqa: BLE001
                ok, value = False, RuntimeError(f"task result could not be read: {err}")
            out.append((index, ok, value))
        return out

    def _replace(self, worker: _Worker, kill: bool = False) -> None:
        worker.stop(kill)
        self.workers[self.workers.index(worker)] = self._new_worker()

    def _stop_busy(self) -> None:
        for worker in self._busy():
            worker.index = None
            self._replace(worker, kill=True)


def _serve(conn: Connection, inherited: list[Connection], counters: Counters | None = None) -> None:
    """A worker's loop: tasks in, (ok, result or exception) out, until the pipe closes."""
    for other in inherited:
        other.close()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # one CPU per task, as Ray's workers
    single_threaded_torch()
    fns: dict[int, Callable[[Any], Any]] = {}
    while True:
        try:
            message = conn.recv_bytes()
        except (EOFError, OSError):
            os._exit(0)  # the driver is gone or done
        reply = _run_task(message, fns, counters)
        try:
            try:
                data = dumps(reply)
            except (pickle.PicklingError, AttributeError, TypeError) as err:
                data = dumps((False, RuntimeError(f"task result not picklable: {err}")))
            conn.send_bytes(data)
        except OSError:
            os._exit(0)  # the driver is gone


def _run_task(
    message: bytes, fns: dict[int, Callable[[Any], Any]], counters: Counters | None = None
) -> tuple[bool, Any]:
    """(True, result) or (False, error). Unpickling the task is part of it: a function or
    item this process cannot load fails the task, as on Ray, instead of killing the worker.
    What the task reports as done goes to its slot's row of `counters` (core/progress.py)."""
    try:
        token, blob, slot, item = pickle.loads(message)
        if blob is not None:
            fns.clear()
            fns[token] = pickle.loads(blob)
        with channel(None if counters is None else counters.row(slot)):
            return True, fns[token](item)
    # Why broad: any task error goes back to the driver, which raises it (as Ray does).
    except Exception as err:  # noqa: BLE001
        err.add_note(f"in a local worker:\n{traceback.format_exc()}")
        return False, err


class PoolRunner:
    """`core.mapreduce.Runner` over a LocalPool: what RayRunner does, on the warm workers.
    Payloads travel through pipes (no object store): meant for builds one machine holds."""

    def __init__(self, pool: LocalPool) -> None:
        self.pool = pool

    @property
    def parallelism(self) -> int:
        return self.pool.limit  # what it may grow to: plans do not depend on what ran before

    def share(self, value: Any) -> Any:
        return value

    def run(self, fn: Callable[..., Any], calls: Sequence[tuple]) -> list[Any]:
        return self.pool.run([(fn, call) for call in calls], _call)

    def map_reduce(
        self, blocks: Sequence[Any], map_fn: MapFn, reduce_fn: ReduceFn, partitions: int
    ) -> list[Any]:
        mapped = self.pool.run([(map_fn, block, partitions) for block in blocks], _map)
        calls = [(reduce_fn, [m[p] for m in mapped]) for p in range(partitions)]
        return self.pool.run(calls, _reduce)


def _call(job: tuple) -> Any:
    fn, args = job
    return fn(*args)


def _map(job: tuple) -> Sequence[Any]:
    map_fn, block, partitions = job
    return check_partitions(map_fn(block), partitions)


def _reduce(job: tuple) -> Any:
    reduce_fn, payloads = job
    return reduce_fn(payloads)

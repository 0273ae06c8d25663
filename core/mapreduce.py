"""Hash-partitioned map-reduce for the global stages (phase B), in-process or on Ray.

A global stage splits its signature columns into blocks. `map_fn(block)` returns one payload
per partition (rows routed by a hash of their group key); `reduce_fn(payloads)` gets every
block's payload for one partition and returns a small result (edges, decisions). So a group-by
never needs the whole dataset in one process: a reduce holds about 1/partitions of the routed
rows, and no image bytes move at all (signatures only).

Plain Ray tasks with object refs rather than Ray Data's `groupby`: the payloads are numpy arrays
(hashes, row ids, embeddings) that Ray passes zero-copy through its object store. One Hamming
table over 1M hashes as a Ray Data `groupby().map_groups()` took 137x as long as the same work
as one task here (bench/raydata_groupby.py, docs/benchmarks/dedupe.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

MapFn = Callable[[Any], Sequence[Any]]
ReduceFn = Callable[[list[Any]], Any]


class Runner(Protocol):
    """Runs tasks: `run` calls fn(*args) per call; `map_reduce` one hash-partitioned round.
    Results come back in call (or partition) order. `share(value)` returns a handle that tasks
    take as an argument without the value being copied per task."""

    def share(self, value: Any) -> Any: ...

    def run(self, fn: Callable[..., Any], calls: Sequence[tuple]) -> list[Any]: ...

    def map_reduce(
        self, blocks: Sequence[Any], map_fn: MapFn, reduce_fn: ReduceFn, partitions: int
    ) -> list[Any]: ...

    @property
    def parallelism(self) -> int: ...


class LocalRunner:
    """Everything in this process: for tests, small inputs and code without Ray."""

    parallelism = 1

    def share(self, value: Any) -> Any:
        return value

    def run(self, fn: Callable[..., Any], calls: Sequence[tuple]) -> list[Any]:
        return [fn(*call) for call in calls]

    def map_reduce(
        self, blocks: Sequence[Any], map_fn: MapFn, reduce_fn: ReduceFn, partitions: int
    ) -> list[Any]:
        mapped = [check_partitions(map_fn(block), partitions) for block in blocks]
        return [reduce_fn([m[p] for m in mapped]) for p in range(partitions)]


class RayRunner:
    """Map and reduce as Ray tasks (one CPU each); payloads stay in the object store."""

    @property
    def parallelism(self) -> int:
        import ray

        return max(1, int(ray.cluster_resources().get("CPU", 1)))

    def share(self, value: Any) -> Any:
        import ray

        return ray.put(value)

    def run(self, fn: Callable[..., Any], calls: Sequence[tuple]) -> list[Any]:
        import ray

        task = ray.remote(num_cpus=1, max_retries=3)(_call)
        fn_ref = ray.put(fn)
        return ray.get([task.remote(fn_ref, *call) for call in calls])

    def map_reduce(
        self, blocks: Sequence[Any], map_fn: MapFn, reduce_fn: ReduceFn, partitions: int
    ) -> list[Any]:
        import ray

        mapper = ray.remote(num_cpus=1, max_retries=3)(_map_task)
        reducer = ray.remote(num_cpus=1, max_retries=3)(_reduce_task)
        map_ref, reduce_ref = ray.put(map_fn), ray.put(reduce_fn)
        mapped = []
        for block in blocks:
            refs = mapper.options(num_returns=partitions).remote(map_ref, block, partitions)
            mapped.append([refs] if partitions == 1 else refs)
        reduced = [reducer.remote(reduce_ref, *[m[p] for m in mapped]) for p in range(partitions)]
        return ray.get(reduced)


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


def _map_task(map_fn: MapFn, block: Any, partitions: int) -> Any:
    out = check_partitions(map_fn(block), partitions)
    return out[0] if partitions == 1 else tuple(out)


def _reduce_task(reduce_fn: ReduceFn, *payloads: Any) -> Any:
    return reduce_fn(list(payloads))


def check_partitions(payloads: Sequence[Any], partitions: int) -> Sequence[Any]:
    if len(payloads) != partitions:
        raise ValueError(f"map returned {len(payloads)} payloads for {partitions} partitions")
    return payloads


def partitions_for(total_bytes: int, runner: Runner, target_bytes: int = 256 << 20) -> int:
    """Enough partitions that each reduce holds about `target_bytes`, and at least one per CPU
    when there is real work (so every CPU has a reduce to run)."""
    needed = -(-total_bytes // target_bytes)
    if total_bytes < (8 << 20):
        return max(1, needed)
    return max(needed, runner.parallelism)


def split_range(n: int, block_rows: int) -> list[tuple[int, int]]:
    """[start, stop) row ranges of at most `block_rows` covering 0..n."""
    return [(start, min(n, start + block_rows)) for start in range(0, n, max(1, block_rows))]

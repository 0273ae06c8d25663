"""The local runtime (warm forked workers): Ray's contract (order, errors, retries after a
worker dies), the same output bytes as Ray, and which runtime `ray.runtime: auto` picks."""

import json
import os
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from mmcurate.core.config_io import ConfigError
from mmcurate.core.mapreduce import LocalRunner
from mmcurate.pipeline.build import run_build
from mmcurate.pipeline.config import BuildConfig
from mmcurate.pipeline.runtime.localpool import LocalPool, PoolRunner, WorkerCrashed
from mmcurate.pipeline.runtime.session import choose_runtime

from tests.http_corpus import Corpus, photo_bytes

REPO = Path(__file__).resolve().parents[2]


def square(x: int) -> int:
    return x * x


def fail_on_three(x: int) -> int:
    if x == 3:
        raise KeyError("three")
    return x


def die_once(marker: str, x: int) -> int:
    """Kills its own worker the first time it runs on x == 2 (a crash mid-task)."""
    if x == 2 and not os.path.exists(marker):
        Path(marker).touch()
        os.kill(os.getpid(), signal.SIGKILL)
    return x * 10


def always_die(x: int) -> int:
    os.kill(os.getpid(), signal.SIGKILL)
    return x


def by_parity(block: list[int]) -> list[list[int]]:
    return [[v for v in block if v % 2 == 0], [v for v in block if v % 2 == 1]]


def total(payloads: list[list[int]]) -> int:
    return sum(sum(p) for p in payloads)


@pytest.fixture(scope="module")
def pool():
    with_pool = LocalPool(2)
    yield with_pool
    with_pool.close()


def test_results_in_order_and_errors_raised_as_themselves(pool):
    assert pool.run(list(range(7)), square) == [x * x for x in range(7)]
    with pytest.raises(KeyError, match="three"):
        pool.run(list(range(6)), fail_on_three)
    assert pool.run([5, 6], square) == [25, 36]  # a failed run leaves no stale results


def test_a_dead_worker_is_replaced_and_its_task_rerun(pool, tmp_path):
    before = pool.retried
    fn = partial(die_once, str(tmp_path / "died"))
    assert pool.run(list(range(5)), fn) == [0, 10, 20, 30, 40]
    assert pool.retried == before + 1
    assert all(w.alive() for w in pool.workers)
    with pytest.raises(WorkerCrashed):
        pool.run([1], always_die)  # dies on every try: fails after Ray's 3 retries


def test_a_pool_started_where_ray_runs_is_spawned_and_works(ray_session, tmp_path, monkeypatch):
    """Forking a process whose Ray gRPC threads hold locks can hang its next GCS call."""
    spawned = LocalPool(2)
    try:
        assert all(w.method == "spawn" and w.process.pid for w in spawned.workers)
        fn = partial(die_once, str(tmp_path / "died"))
        assert spawned.run(list(range(4)), fn) == [0, 10, 20, 30]
        assert spawned.retried == 1 and all(w.method == "spawn" for w in spawned.workers)
        # A function of the driver's __main__ (a notebook's) goes by value: a spawned worker's
        # __main__ is not the driver's, so a reference to it would not load there.
        namespace: dict = {"__name__": "__main__"}
        exec("def mmcurate_triple(x):\n    return 3 * x\n", namespace)
        monkeypatch.setattr(
            sys.modules["__main__"], "mmcurate_triple", namespace["mmcurate_triple"], raising=False
        )
        assert spawned.run([1, 2], namespace["mmcurate_triple"]) == [3, 6]
    finally:
        spawned.close()
    import ray

    assert ray.available_resources().get("CPU", 0) > 0  # the driver's GCS still answers


def cannot_load() -> None:
    raise ValueError("this task cannot be unpickled here")


class Unloadable:
    def __reduce__(self) -> tuple:
        return cannot_load, ()


def test_a_task_that_cannot_be_unpickled_fails_as_itself(pool):
    with pytest.raises(ValueError, match="cannot be unpickled"):
        pool.run([1, Unloadable()], square)
    assert pool.run([3], square) == [9]  # the worker lived on


def test_pool_runner_matches_the_in_process_runner(pool):
    blocks = [[1, 2, 3], [4, 5], [6]]
    assert PoolRunner(pool).map_reduce(blocks, by_parity, total, 2) == LocalRunner().map_reduce(
        blocks, by_parity, total, 2
    )
    assert PoolRunner(pool).run(pow, [(2, 3), (3, 2)]) == [8, 9]
    assert PoolRunner(pool).parallelism == 2


def config(**ray: object) -> BuildConfig:
    return BuildConfig.model_validate(
        {"source": {"kind": "images", "path": "/tmp/in"}, "output": {"path": "/tmp/out"}}
        | {"ray": ray}
    )


def test_auto_picks_local_on_one_machine_and_ray_for_a_cluster(monkeypatch):
    # in_ray=False: the choice as a fresh `mmcurate build` process makes it, whatever other
    # tests left running in this one
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert choose_runtime(config(), in_ray=False) == "local"
    assert choose_runtime(config(runtime="ray"), in_ray=False) == "ray"
    assert choose_runtime(config(address="ray://head:10001"), in_ray=False) == "ray"
    assert choose_runtime(config(resources={"ingest": 1}), in_ray=False) == "ray"
    pooled = config().model_copy(update={"stages": [{"name": "clip_score", "concurrency": 1}]})
    assert choose_runtime(pooled, in_ray=False) == "ray"  # a model actor pool
    in_tasks = config().model_copy(update={"stages": [{"name": "clip_score", "num_gpus": 0}]})
    assert choose_runtime(in_tasks, in_ray=False) == "local"  # the model runs inside the tasks
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    assert choose_runtime(config(), in_ray=False) == "ray"
    with pytest.raises(ConfigError, match="ray.runtime: local, but ray.address"):
        choose_runtime(config(runtime="local"))


def test_auto_keeps_an_initialized_ray(ray_session, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert choose_runtime(config()) == "ray"
    assert choose_runtime(config(runtime="local")) == "local"  # asked for explicitly


@pytest.fixture(scope="module")
def slow_urls(tmp_path_factory):
    """12 URLs answered after 0.3 s each; 3 per partition: a build busy for seconds."""
    server = Corpus().start()
    server.serve("/img/good", photo_bytes())
    urls = [f"{server.base}/slow/{i}.jpg" for i in range(12)]
    path = tmp_path_factory.mktemp("urls") / "urls.parquet"
    pq.write_table(pa.table({"url": urls, "caption": [f"photo {i}" for i in range(12)]}), path)
    yield path
    server.stop()


def tree(urls: Path, out: Path, runtime: str) -> dict:
    return {
        "source": {"kind": "urls", "path": str(urls), "files_per_task": 3},
        "stages": [
            {"name": "download", "allow_private_addresses": True, "threads": 1},
            {"name": "decode_image", "resize": {"size": 32}},
        ],
        "output": {"path": str(out), "shard_max_samples": 10},
        "ray": {"runtime": runtime, "num_cpus": 2},
    }


def build(urls: Path, out: Path) -> subprocess.Popen:
    """`mmcurate build` as a user runs it (the CLI prestarts the pool), in the background."""
    config = out.parent / f"{out.name}.yaml"
    config.write_text(yaml.safe_dump(tree(urls, out, "auto")))
    cmd = [sys.executable, "-m", "mmcurate", "build", str(config), "--no-progress"]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def children(pid: int) -> list[int]:
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry))
        except OSError:
            continue
    return found


def finished(proc: subprocess.Popen) -> str:
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()[-2000:]
    return err.decode()


def shard_bytes(out: Path) -> dict[str, bytes]:
    names = [s["name"] for s in json.loads((out / "manifest.json").read_text())["shards"]]
    return {n: (out / n).read_bytes() for n in names}


def test_local_and_ray_write_the_same_bytes_and_a_killed_worker_loses_nothing(
    ray_session, slow_urls, tmp_path
):
    """A CLI build on the local pool whose worker is killed mid-build, and the same build on
    the session Ray: the same shard bytes."""
    local = build(slow_urls, tmp_path / "local")
    done = tmp_path / "local" / "_work" / "signatures"
    deadline = time.monotonic() + 120
    while len(list(done.glob("part-*.parquet"))) < 1:  # the pool is at work
        assert time.monotonic() < deadline
        time.sleep(0.05)
    # The driver's child is the pool's zygote; the workers are its children.
    victim = [worker for zygote in children(local.pid) for worker in children(zygote)][0]
    os.kill(victim, signal.SIGKILL)  # by pid, mid-build
    run_build(BuildConfig.model_validate(tree(slow_urls, tmp_path / "ray", "ray")), False)
    log = finished(local)
    assert "a worker process died" in log
    local_shards, ray_shards = shard_bytes(tmp_path / "local"), shard_bytes(tmp_path / "ray")
    assert local_shards == ray_shards and len(local_shards) == 2  # 12 samples, 10 per shard
    manifests = [json.loads((tmp_path / d / "manifest.json").read_text()) for d in ("local", "ray")]
    assert manifests[0]["shards"] == manifests[1]["shards"]
    assert manifests[0]["samples"] == 12


def test_a_local_build_never_loads_ray(tmp_path):
    """Every job a local build hands its workers pickles plainly: a closure would fall back
    to cloudpickle, which loads Ray (~0.8 s) in the driver and again in a worker. Covered: a
    URL list that is staged (one row group, 4 partitions), dedupe's decide phase, the shards.
    Observed from outside with `python -X importtime` (forked workers print theirs too)."""
    server = Corpus().start()
    try:
        names = ["astronaut", "coffee", "chelsea", "astronaut"]  # one exact copy
        urls = [server.serve(f"/{i}.jpg", photo_bytes(n)) for i, n in enumerate(names * 3)]
        path = tmp_path / "urls.parquet"
        pq.write_table(pa.table({"url": urls, "caption": [f"photo {i}" for i in range(12)]}), path)
        cfg = tree(path, tmp_path / "out", "local")
        cfg["stages"] += [{"name": "exact_dedupe"}, {"name": "near_dedupe", "radius": 8}]
        config = tmp_path / "build.yaml"
        config.write_text(yaml.safe_dump(cfg))
        cmd = [sys.executable, "-X", "importtime", "-m", "mmcurate", "build", str(config)]
        done = subprocess.run(cmd + ["--no-progress"], cwd=REPO, capture_output=True, text=True)
    finally:
        server.stop()
    assert done.returncode == 0, done.stderr[-2000:]
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["samples"] == 3  # three distinct photos kept
    assert (tmp_path / "out" / "_work").exists() is False
    imported = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()]
    assert "staging 1 URL list file(s) as parquet" in done.stderr  # staging ran, in a task
    assert not [name for name in imported if name == "ray" or name.startswith("ray.")]


def test_an_image_folder_build_command_never_imports_pandas(tmp_path):
    """pyarrow imports pandas (~0.27 s) on its first Python list only to ask whether it is a
    pandas object; the build command's own process skips that probe, and a small build's
    decide phase has nothing to route. Observed from outside, workers included."""
    folder = tmp_path / "in"
    folder.mkdir()
    for i, name in enumerate(["astronaut", "coffee", "chelsea"] * 2):
        (folder / f"{name}{i}.jpg").write_bytes(photo_bytes(name))
        (folder / f"{name}{i}.txt").write_text(f"a photo of {name}")
    cfg = {
        "source": {"kind": "images", "path": str(folder), "files_per_task": 2},
        "stages": [{"name": "decode_image", "resize": {"size": 32}}, {"name": "exact_dedupe"}],
        "output": {"path": str(tmp_path / "out")},
        "ray": {"runtime": "local", "num_cpus": 2},
    }
    config = tmp_path / "build.yaml"
    config.write_text(yaml.safe_dump(cfg))
    cmd = [sys.executable, "-X", "importtime", "-m", "mmcurate", "build", str(config)]
    done = subprocess.run(cmd + ["--no-progress"], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["samples"] == 3
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}
    assert "pyarrow.parquet" in imported  # importtime saw the build's imports
    assert not [name for name in imported if name.startswith("pandas.")]  # only the probe's try


def test_the_skipped_pandas_probe_leaves_pandas_usable():
    """After the skipped probe pyarrow still converts lists; the first call that needs pandas
    imports it, and from then on pyarrow reads pandas objects as pandas (NaN as null)."""
    script = """
import sys
from mmcurate.core.pandas_probe import skip_pandas_probe
skip_pandas_probe()
import pyarrow as pa
assert "pandas" not in sys.modules
assert pa.table({"a": [1, None]}).to_pydict() == {"a": [1, None]}
assert "pandas" not in sys.modules
frame = pa.table({"a": [1.5, None]}).to_pandas()
import pandas as pd
assert isinstance(frame, pd.DataFrame) and frame["a"].isna().tolist() == [False, True]
assert pa.array(pd.Series([1.0, float("nan")])).null_count == 1
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True)
    assert done.stdout.strip() == "ok", done.stderr[-2000:]


def test_nanosecond_columns_give_the_same_json_in_the_build_command(tmp_path):
    """A URL list's nanosecond timestamp and duration columns reach the sample JSON as pyarrow
    renders them with pandas (the build command skipped pandas until it met them)."""
    server = Corpus().start()
    try:
        urls = [server.serve(f"/{i}.jpg", photo_bytes("coffee")) for i in range(2)]
        path = tmp_path / "urls.parquet"
        table = pa.table(
            {
                "url": urls,
                "caption": ["a", "b"],
                "seen": pa.array([1_000_000_001, 2_000_000_000], pa.timestamp("ns")),
                "age": pa.array([1_000_000_000, 5], pa.duration("ns")),
            }
        )
        pq.write_table(table, path)
        config = tmp_path / "build.yaml"
        config.write_text(yaml.safe_dump(tree(path, tmp_path / "out", "local")))
        cmd = [sys.executable, "-m", "mmcurate", "build", str(config), "--no-progress"]
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    finally:
        server.stop()
    assert done.returncode == 0, done.stderr[-2000:]
    rows = pq.read_table(tmp_path / "out" / "shard-000000.parquet").to_pylist()
    expected = [json.loads(json.dumps(r, default=str)) for r in table.drop(["url"]).to_pylist()]
    got = {(r["seen"], r["age"]) for r in rows}
    assert got == {(e["seen"], e["age"]) for e in expected}
    assert ("1970-01-01 00:00:01.000000001", "0 days 00:00:01") in got

"""Faults: a killed worker and a killed driver must not lose or duplicate a sample."""

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from mmcurate.pipeline.build import run_build
from mmcurate.pipeline.config import BuildConfig

from tests.http_corpus import Corpus, photo_bytes
from tests.kit_builds import kill_build_after, wait_for

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def slow_urls(tmp_path):
    """60 URLs on a loopback server that answers each after 0.3 s; 3 URLs per partition."""
    server = Corpus().start()
    server.serve("/img/good", photo_bytes())
    urls = [f"{server.base}/slow/{i}.jpg" for i in range(60)]
    path = tmp_path / "urls.parquet"
    pq.write_table(
        pa.table({"url": urls, "caption": [f"photo number {i}" for i in range(60)]}), path
    )
    yield path
    server.stop()


def tree(urls, out) -> dict:
    return {
        "source": {"kind": "urls", "path": str(urls), "files_per_task": 3},
        "stages": [
            {"name": "download", "allow_private_addresses": True, "threads": 1},
            {"name": "decode_image", "resize": {"size": 32}},
        ],
        "output": {"path": str(out), "shard_max_samples": 16},
    }


def task_worker_pids() -> list[int]:
    """Ray workers currently running a partition task (Ray titles them `ray::_run_one`)."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if f.read().startswith(b"ray::_run_one"):
                    pids.append(int(entry))
        except (OSError, ValueError):
            continue
    return pids


def shard_keys(out: Path) -> list[list[str]]:
    manifest = json.loads((out / "manifest.json").read_text())
    table = pq.read_table(out / "signatures").to_pylist()
    return [sorted(r["key"] for r in table if r["shard"] == s["name"]) for s in manifest["shards"]]


@pytest.mark.slow
def test_killed_worker_loses_and_duplicates_nothing(ray_session, slow_urls, tmp_path):
    clean = run_build(BuildConfig.model_validate(tree(slow_urls, tmp_path / "clean")), False)
    result = {}
    build = threading.Thread(
        target=lambda: result.update(
            manifest=run_build(BuildConfig.model_validate(tree(slow_urls, tmp_path / "out")), False)
        )
    )
    build.start()
    wait_for(task_worker_pids)
    victim = task_worker_pids()[0]
    os.kill(victim, signal.SIGKILL)  # by pid, mid-task
    build.join(timeout=300)
    assert not os.path.exists(f"/proc/{victim}")
    assert result["manifest"]["shards"] == clean["shards"]  # same samples, bytes, order
    assert shard_keys(tmp_path / "out") == shard_keys(tmp_path / "clean")


@pytest.mark.slow
def test_killed_driver_resumes_without_redoing_work(ray_session, slow_urls, tmp_path, caplog):
    clean = run_build(BuildConfig.model_validate(tree(slow_urls, tmp_path / "clean")), False)
    out = tmp_path / "out"
    finished = kill_build_after(tree(slow_urls, out), out, partitions=4)
    assert 4 <= finished < 20

    with caplog.at_level(logging.INFO, logger="mmcurate.build"):
        resumed = run_build(BuildConfig.model_validate(tree(slow_urls, out)), False)
    skipped = [r.args[0] for r in caplog.records if r.msg.startswith("resuming")]
    assert skipped and skipped[0] >= finished  # finished partitions were not run again
    assert resumed["shards"] == clean["shards"]
    assert shard_keys(out) == shard_keys(tmp_path / "clean")


def test_different_config_on_unfinished_output_is_refused(tmp_path, image_folder):
    folder = image_folder(n=6)
    out = tmp_path / "out"
    base = {"source": {"kind": "images", "path": str(folder)}, "output": {"path": str(out)}}
    (out / "_work").mkdir(parents=True)
    marker = json.dumps({"tool": "mmcurate", "build_id": "f" * 64, "files": []})
    (out / "_work" / "build.json").write_text(marker)
    from mmcurate.core.config_io import ConfigError

    with pytest.raises(ConfigError, match="unfinished build of another config"):
        run_build(BuildConfig.model_validate(base), False)  # refused before Ray starts
    assert (out / "_work" / "build.json").read_text() == marker


@pytest.mark.slow
def test_object_store_restart_mid_build(ray_session, slow_urls, tmp_path):
    from mmcurate.pipeline.runtime.objectstore import LocalS3

    clean = run_build(BuildConfig.model_validate(tree(slow_urls, tmp_path / "clean")), False)
    with LocalS3(tmp_path / "s3") as store:
        store.make_bucket("faults")
        fs = store.filesystem()
        spec = tree(slow_urls, "s3://faults/out") | {"storage_options": store.storage_options}
        result = {}
        build = threading.Thread(
            target=lambda: result.update(
                manifest=run_build(BuildConfig.model_validate(spec), False)
            )
        )
        build.start()

        def some_partitions_done() -> bool:
            fs.invalidate_cache()
            return len(fs.glob("faults/out/_work/signatures/part-*.parquet")) >= 3

        wait_for(some_partitions_done)
        store.restart()  # stop by pid, start again on the same ports and data
        build.join(timeout=300)
        assert result["manifest"]["shards"] == clean["shards"]  # nothing lost or duplicated
        names = [s["name"] for s in clean["shards"]]
        assert sorted(p.rpartition("/")[2] for p in fs.glob("faults/out/shard-*.tar")) == names


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ancestors(pid: int) -> set[int]:
    found = set()
    while pid > 1:
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            break
        found.add(pid)
    return found


def start_node(args: list[str], env: dict, log: Path) -> subprocess.Popen:
    """`ray start ... --block` as a child in its own process group, on loopback, free ports."""
    ports = [
        f"--dashboard-agent-listen-port={free_port()}",
        f"--dashboard-agent-grpc-port={free_port()}",
        f"--metrics-export-port={free_port()}",
        f"--runtime-env-agent-port={free_port()}",
        "--node-ip-address=127.0.0.1",
    ]
    cmd = [str(Path(sys.executable).parent / "ray"), "start", "--block", *args, *ports]
    return subprocess.Popen(
        cmd, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
    )


def stop_node(node: subprocess.Popen) -> None:
    if node.poll() is None:
        # `ray start` alone: it drains the node through its GCS, then stops what it started
        # (~2 s). SIGTERM to its whole group killed the GCS too, and the drain waited 30 s.
        node.send_signal(signal.SIGTERM)
        try:
            node.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(node.pid, signal.SIGKILL)
            node.wait()


@pytest.mark.slow
def test_node_removed_mid_build(ray_session, slow_urls, tmp_path):
    clean = run_build(BuildConfig.model_validate(tree(slow_urls, tmp_path / "clean")), False)
    # Multi-node needs cluster mode on; every node and the driver still get 127.0.0.1.
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": "b" * 64,
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1",
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "2",  # a stopped node goes (default: 30 s)
    }
    env.pop("RAY_ADDRESS", None)
    temp = tempfile.mkdtemp(prefix="rc-", dir="/tmp")  # short: unix socket paths
    gcs = f"127.0.0.1:{free_port()}"
    head = start_node(
        [
            "--head",
            f"--port={gcs.split(':')[1]}",
            "--num-cpus=1",
            "--include-dashboard=false",
            f"--temp-dir={temp}",
            "--disable-usage-stats",
        ],
        env,
        tmp_path / "head.log",
    )
    worker = None
    try:
        time.sleep(3)
        worker = start_node([f"--address={gcs}", "--num-cpus=1"], env, tmp_path / "worker.log")
        config = tmp_path / "build.yaml"
        config.write_text(yaml.safe_dump(tree(slow_urls, tmp_path / "out")))
        driver = subprocess.Popen(
            [sys.executable, "-m", "mmcurate", "build", str(config), "--no-progress"],
            cwd=REPO,
            env={**env, "RAY_ADDRESS": gcs},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

        def worker_node_busy() -> bool:  # a partition task runs under the worker node
            return any(worker.pid in ancestors(pid) for pid in task_worker_pids())

        wait_for(worker_node_busy, timeout_s=180)
        os.killpg(worker.pid, signal.SIGKILL)  # the node vanishes with a task in flight
        worker.wait()
        _, err = driver.communicate(timeout=300)
        assert driver.returncode == 0, err.decode()[-3000:]
    finally:
        for node in (worker, head):
            if node is not None:
                stop_node(node)
        shutil.rmtree(temp, ignore_errors=True)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["shards"] == clean["shards"]

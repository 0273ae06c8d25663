"""LocalS3: a real SeaweedFS on loopback, reached through fsspec/s3fs."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import fsspec
import pytest
from mmcurate.pipeline.runtime.loopback import LOOPBACK_PROXY
from mmcurate.pipeline.runtime.objectstore import LocalS3, ObjectStoreError
from mmcurate.pipeline.runtime.objectstore_probe import disk_too_full, probe_filesystem


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _listening_addresses(pid: int) -> list[tuple[str, int]]:
    """(hex local address, port) of every listening TCP socket the process holds."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # fd closed while we looked
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A = LISTEN
                address, port = local.split(":")
                found.append((address, int(port, 16)))
    return found


def test_start_stop_really_exits(tmp_path):
    server = LocalS3(tmp_path / "store").start()
    pid = server.pid
    assert pid is not None and _pid_alive(pid)
    assert server.endpoint_url.startswith("http://127.0.0.1:")
    server.stop()
    assert server.pid is None
    assert not _pid_alive(pid)
    server.stop()  # idempotent


def test_restart_on_same_dir_keeps_objects(tmp_path):
    with LocalS3(tmp_path / "store") as first:
        first.make_bucket("keep")
        first.filesystem().pipe("keep/a.bin", b"persisted")
    with LocalS3(tmp_path / "store") as second:
        assert second.filesystem().cat("keep/a.bin") == b"persisted"


def test_failed_start_kills_the_process(tmp_path):
    launched = []

    class FailingS3(LocalS3):
        def _wait_ready(self):
            launched.append(self.process.pid)
            raise ObjectStoreError("simulated: never ready")

    server = FailingS3(tmp_path / "store")
    with pytest.raises(ObjectStoreError, match="never ready"):
        server.start()
    assert server.process is None
    assert len(launched) == 1  # not a cause a fresh start could help: reported at once
    assert not _pid_alive(launched[0])


def test_timeout_error_names_the_log(tmp_path):
    server = LocalS3(tmp_path / "store", start_timeout_s=0.0)
    with pytest.raises(ObjectStoreError, match="weed.log"):
        server.start()
    assert server.process is None


@pytest.mark.parametrize("writes_to", ["refused", "silent"])
def test_a_server_that_never_takes_a_write_is_not_ready(tmp_path, writes_to):
    """Readiness is a real write, not a listing: with writes refused, or hanging on a server
    that accepts connections and never answers, the start fails in one line naming the cause
    and the log (rather than waiting out every retry), and every launched process is gone."""
    launched = []
    silent = socket.create_server(("127.0.0.1", 0))  # listens, never accepts or answers
    endpoint = {"refused": LOOPBACK_PROXY, "silent": f"http://127.0.0.1:{silent.getsockname()[1]}"}

    class NoWrites(LocalS3):
        def _probe_filesystem(self):
            launched.append(self.process.pid)
            client = {"endpoint_url": endpoint[writes_to], "region_name": "us-east-1"}
            return probe_filesystem({**self.storage_options, "client_kwargs": client})

    server = NoWrites(tmp_path / "store", start_timeout_s=2.0)
    try:
        with pytest.raises(ObjectStoreError, match="did not take a first write.*weed.log"):
            server.start(attempts=2)
    finally:
        silent.close()
    assert len(launched) == 2 and server.process is None
    assert not any(_pid_alive(pid) for pid in launched)


def test_a_disk_too_full_for_seaweedfs_fails_the_start_at_once(tmp_path, monkeypatch):
    """With less free disk than the volume server's floor, SeaweedFS would start and then
    hang every PUT: the start refuses in one line instead, before launching anything."""
    assert disk_too_full(tmp_path, fraction=0.0) is None
    assert f"{tmp_path} has" in disk_too_full(tmp_path, fraction=1.0)
    monkeypatch.setattr(
        "mmcurate.pipeline.runtime.objectstore_probe.MIN_FREE_FRACTION", 1.0
    )  # any disk
    server = LocalS3(tmp_path / "store")
    with pytest.raises(ObjectStoreError, match=r"needs 100\.0% of the disk free.*GiB free"):
        server.start()
    assert server.process is None and not (tmp_path / "store" / "weed.log").exists()


def test_the_readiness_probe_leaves_no_bucket_behind(s3):
    assert not any("ready-probe" in name for name in s3.filesystem().ls(""))


def test_put_get_list_through_fsspec(s3, s3_bucket):
    fs = fsspec.filesystem("s3", **s3.storage_options)
    fs.pipe(f"{s3_bucket}/dir/one.txt", b"one")
    fs.pipe(f"{s3_bucket}/dir/two.bin", bytes(range(256)) * 100)
    assert sorted(fs.ls(f"{s3_bucket}/dir")) == [
        f"{s3_bucket}/dir/one.txt",
        f"{s3_bucket}/dir/two.bin",
    ]
    assert fs.cat(f"{s3_bucket}/dir/one.txt") == b"one"
    with fsspec.open(f"s3://{s3_bucket}/dir/two.bin", "rb", **s3.storage_options) as f:
        assert f.read() == bytes(range(256)) * 100


def test_wrong_credentials_are_refused(s3, s3_bucket):
    options = {**s3.storage_options, "secret": "not-the-secret"}
    fs = fsspec.filesystem("s3", skip_instance_cache=True, **options)
    with pytest.raises(PermissionError):
        fs.pipe(f"{s3_bucket}/x.txt", b"x")


def test_subprocess_reaches_it_with_env(s3, s3_bucket):
    s3.filesystem().pipe(f"{s3_bucket}/hello.txt", b"hello from seaweedfs")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(s3.env())
    code = f"import fsspec; print(fsspec.open('s3://{s3_bucket}/hello.txt').open().read())"
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "hello from seaweedfs" in result.stdout


def test_listens_on_loopback_only(s3):
    addresses = _listening_addresses(s3.pid)
    assert addresses, "found no listening sockets for the weed process"
    ports = {port for _, port in addresses}
    assert s3.ports["s3"] in ports
    assert {address for address, _ in addresses} == {"0100007F"}  # 127.0.0.1, no IPv6


def test_short_bucket_name_is_rejected(s3):
    with pytest.raises(ValueError, match="3\\+ characters"):
        s3.make_bucket("ab")

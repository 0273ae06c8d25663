"""A local Ray under `loopback_only_env` sends nothing off loopback, watched with strace.

Ray's dashboard probes 169.254.169.254 and metadata.google.internal at every start to name
the cloud (even with usage stats off), and `ray start` reports "usage stats disabled" to
usage-stats.ray.io. The test runs `ray start --head`, a driver and one task under
`strace -f` and checks every address any of their processes connected or sent to.
"""

import ipaddress
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from mmcurate.pipeline.runtime.loopback import loopback_only_env

# The traced program: a head node with its own ports (a session Ray may be running), a driver
# that runs one task, and a wait until the dashboard's usage-stats module has finished its
# cloud detection (it logs the line below right after). Everything stopped by pid.
CHILD = r"""
import os, signal, subprocess, sys, time
from pathlib import Path
import ray

temp, port, *more = sys.argv[1:]
agent, agent_grpc, metrics, runtime_env, dashboard, client = more
cmd = [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", "--num-cpus=1",
       f"--port={port}", "--node-ip-address=127.0.0.1", "--dashboard-host=127.0.0.1",
       f"--dashboard-port={dashboard}", f"--ray-client-server-port={client}",
       f"--dashboard-agent-listen-port={agent}", f"--dashboard-agent-grpc-port={agent_grpc}",
       f"--metrics-export-port={metrics}", f"--runtime-env-agent-port={runtime_env}",
       f"--temp-dir={temp}"]
head = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL)
log = Path(temp) / "session_latest" / "logs" / "dashboard.log"
try:
    deadline = time.monotonic() + 180
    while True:
        try:
            ray.init(address=f"127.0.0.1:{port}", logging_level="ERROR")
            break
        except (ConnectionError, RuntimeError):
            if time.monotonic() > deadline or head.poll() is not None:
                raise
            time.sleep(1)
    print("task", ray.get(ray.remote(lambda: 41 + 1).remote()), flush=True)
    while time.monotonic() < deadline:
        if log.exists() and "Usage reporting is disabled" in log.read_text(errors="replace"):
            print("cloud detection done", flush=True)
            break
        time.sleep(1)
    time.sleep(3)  # the "disabled" report to usage-stats.ray.io follows the log line
finally:
    ray.shutdown()
    head.send_signal(signal.SIGTERM)  # `ray start` alone: it stops what it started (~2 s)
    try:
        head.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(head.pid, signal.SIGKILL)
        head.wait()
"""
ADDRESS = re.compile(r'inet_addr\("([^"]+)"\)|inet_pton\(AF_INET6,\s*"([^"]+)"')


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def destinations(trace: str) -> list[str]:
    """Every IPv4/IPv6 address in connect/sendto/sendmsg calls of a `strace -f` log. A call
    on an inet socket whose address this cannot read fails the test rather than pass it."""
    found: list[str] = []
    for line in trace.splitlines():
        if "sa_family=AF_INET" not in line:
            continue  # unix sockets, netlink, resumed halves of calls
        addresses = [v4 or v6 for v4, v6 in ADDRESS.findall(line)]
        assert addresses, f"unparsed strace line: {line}"
        found += addresses
    return found


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def test_destinations_parser_reads_strace_lines():
    trace = (
        "12 connect(5, {sa_family=AF_INET, sin_port=htons(80), "
        'sin_addr=inet_addr("169.254.169.254")}, 16) = -1 EINPROGRESS\n'
        "13 connect(8, {sa_family=AF_INET6, sin6_port=htons(1), sin6_flowinfo=htonl(0), "
        'inet_pton(AF_INET6, "::ffff:127.0.0.1", &sin6_addr), sin6_scope_id=0}, 28) = 0\n'
        '14 connect(3, {sa_family=AF_UNIX, sun_path="/tmp/x.sock"}, 110) = 0\n'
    )
    found = destinations(trace)
    assert found == ["169.254.169.254", "::ffff:127.0.0.1"]
    assert [is_loopback(a) for a in found] == [False, True]
    assert not is_loopback("10.255.255.53") and is_loopback("::1")


@pytest.mark.slow
def test_local_ray_sends_nothing_off_loopback(tmp_path):
    strace = shutil.which("strace")
    assert strace, "this test needs strace (apt-get install strace)"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    trace = tmp_path / "trace.txt"
    temp = tempfile.mkdtemp(prefix="rayprobe-", dir="/tmp")  # short: unix socket paths
    env = {**os.environ, **loopback_only_env(), "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    ports = [str(free_port()) for _ in range(7)]
    cmd = [strace, "-f", "-qq", "-s", "32", "-e", "signal=none", "-o", str(trace)]
    cmd += ["-e", "trace=connect,sendto,sendmsg,sendmmsg", sys.executable, str(script), temp]
    try:
        result = subprocess.run(
            [*cmd, *ports], env=env, capture_output=True, text=True, timeout=500, cwd=tmp_path
        )
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "task 42" in result.stdout and "cloud detection done" in result.stdout, result.stdout
    found = destinations(Path(trace).read_text())
    assert any(is_loopback(a) for a in found)  # the trace saw Ray's own traffic: not empty
    assert sorted({a for a in found if not is_loopback(a)}) == []

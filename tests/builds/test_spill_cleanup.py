"""Spill folders a build leaves behind (issue 45 item 15): one of a process killed with -9 on
this host is removed by the next sweep at once (a rerun clears it), not an hour later; one of
another host or pid namespace, whose pid only looks dead here, still waits its hour; and a
build that fails leaves none, not even the empty folders of the workers stopped mid-task."""

from __future__ import annotations

import http.server
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from mmcurate.core.spill import SPILL_PREFIX, host_tag, sweep_folders

ROOT = Path(__file__).resolve().parents[2]
CHILD = """
import os, sys, time
from mmcurate.core.spill import spill_bytes, spill_folder
folder = spill_folder(sys.argv[1])
spill_bytes(os.urandom(1 << 20), folder)
print(folder, flush=True)
time.sleep(600)
"""


def killed_with_data(parent: Path) -> Path:
    """The spill folder (holding 1 MiB) of a process killed with -9 on this host."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(parent)], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    folder = Path(child.stdout.readline().strip())
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    child.stdout.close()
    assert folder.is_dir() and sum(f.stat().st_size for f in folder.iterdir()) == 1 << 20
    return folder


def spill_folders(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(SPILL_PREFIX))


def test_a_killed_process_folder_is_swept_at_once(tmp_path):
    dead = killed_with_data(tmp_path)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        live = tmp_path / f"{SPILL_PREFIX}{sleeper.pid}-h{host_tag()}-live"
        elsewhere = tmp_path / f"{SPILL_PREFIX}{dead.name.split('-')[2]}-hdeadbeef-other"
        untagged = tmp_path / f"{SPILL_PREFIX}{dead.name.split('-')[2]}-0123456789ab"
        for folder in (live, elsewhere, untagged):
            folder.mkdir()
        sweep_folders(str(tmp_path))
        # another namespace's, or an older untagged name: their pid may run elsewhere
        assert spill_folders(tmp_path) == sorted(p.name for p in (live, elsewhere, untagged))
        os.utime(untagged, (0, 0))  # untouched for long: swept as before
        sweep_folders(str(tmp_path))
        assert spill_folders(tmp_path) == sorted(p.name for p in (live, elsewhere))
    finally:
        sleeper.kill()
        sleeper.wait()


def test_an_exited_unreaped_process_folder_is_swept(tmp_path):
    """A worker killed a moment ago may still be a zombie (its parent has not reaped it):
    it runs no more, so its folder goes."""
    code = "import sys; from mmcurate.core.spill import spill_folder as f; print(f(sys.argv[1]))"
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    folder = Path(child.stdout.readline().strip())
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, left unreaped
    try:
        sweep_folders(str(tmp_path))
        assert not folder.exists()
    finally:
        child.wait()
        child.stdout.close()


def build(config: Path, temp: Path) -> subprocess.CompletedProcess:
    """`mmcurate build` in a fresh process whose temp folder is `temp`."""
    return subprocess.run(
        [sys.executable, "-m", "mmcurate", "build", str(config)],
        capture_output=True,
        text=True,
        env=os.environ | {"TMPDIR": str(temp)},
        cwd=ROOT,
        timeout=300,
    )


def test_a_rerun_clears_what_a_killed_run_left(tmp_path, image_folder):
    temp = tmp_path / "tmp"
    temp.mkdir()
    killed_with_data(temp)
    config = tmp_path / "build.yaml"
    config.write_text(
        f"source: {{kind: images, path: '{image_folder(n=4)}'}}\n"
        f"output: {{path: '{tmp_path / 'out'}'}}\n"
        "ray: {runtime: local, num_cpus: 1}\n"
    )
    done = build(config, temp)
    assert done.returncode == 0, done.stderr[-2000:]
    assert spill_folders(temp) == []


class Routes(http.server.BaseHTTPRequestHandler):
    """`/change`: rewrites the URL list (a later partition then reads other rows than were
    planned, and its task fails) and answers 404; `/hold`: answers once `release` is set."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/hold":
            self.server.release.wait(60)
        else:
            self.server.list_file.write_text("url,caption\n")
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def routes(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Routes)
    server.release, server.list_file = threading.Event(), tmp_path / "list.csv"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", server.list_file
    server.release.set()
    server.shutdown()
    server.server_close()


def test_a_failed_build_leaves_no_spill_folder(tmp_path, routes):
    """Partition 0 changes the list under partition 2, partition 1 is still downloading when
    partition 2 fails: its worker is stopped mid-task, before it could remove its folder."""
    base, list_file = routes
    urls = [f"{base}/change", f"{base}/hold", f"{base}/x"]
    list_file.write_text("url,caption\n" + "".join(f"{u},c\n" for u in urls))
    temp = tmp_path / "tmp"
    temp.mkdir()
    config = tmp_path / "build.yaml"
    config.write_text(
        f"source: {{kind: urls, path: '{list_file}', files_per_task: 1}}\n"
        "stages: [{name: download, allow_private_addresses: true, retries: 0}]\n"
        f"output: {{path: '{tmp_path / 'out'}'}}\n"
        "ray: {runtime: local, num_cpus: 2}\n"
    )
    done = build(config, temp)
    assert done.returncode != 0 and "planned" in done.stderr, done.stderr[-2000:]
    assert spill_folders(temp) == []

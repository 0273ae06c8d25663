"""`ray job submit --working-dir .` against a local head with Ray's token auth on."""

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_dashboard(url: str, token: str, head: subprocess.Popen, timeout_s=120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if head.poll() is not None:
            raise RuntimeError(f"ray head exited with {head.returncode}")
        try:
            request = urllib.request.Request(
                f"{url}/api/version", headers={"Authorization": f"Bearer {token}"}
            )
            with urllib.request.urlopen(request, timeout=2):
                return
        except OSError:
            time.sleep(1)
    raise TimeoutError("ray dashboard did not come up")


def bare_python(folder: Path) -> Path:
    """A venv whose Python sees this one's packages (Ray, torch, ...) but not mmcurate: a
    `.pth` line adds the site-packages folder, and .pth files inside it (the editable install's
    finder) are not run from there. A cluster's nodes that have only the dependencies."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    site = next((folder / "lib").glob("python3*/site-packages"))
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    python = folder / "bin" / "python"
    probe = subprocess.run(
        [str(python), "-c", "import ray, mmcurate"], cwd="/", capture_output=True
    )
    assert b"No module named 'mmcurate'" in probe.stderr  # Ray imports, mmcurate does not
    return python


@pytest.fixture
def ray_head(tmp_path, s3):
    """A `ray start --head --block` child with token auth, its workers given the session S3's
    endpoint and keys (as a cluster's nodes have theirs); stopped by its pid. Its Python has
    the dependencies but not mmcurate: jobs run it from their working directory alone."""
    python = bare_python(tmp_path / "bare-venv")
    token = secrets.token_hex(32)
    (tmp_path / "home").mkdir()
    env = {
        **os.environ,
        **s3.env(),
        "HOME": str(tmp_path / "home"),  # the jobs' ~/.cache (training's log mirrors)
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": token,
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "2",  # the stopped head goes (default: 30 s)
        "PATH": f"{python.parent}{os.pathsep}{BIN}{os.pathsep}{os.environ['PATH']}",
    }
    env.pop("RAY_ADDRESS", None)
    temp_dir = tempfile.mkdtemp(prefix="rayjob-", dir="/tmp")  # short: unix socket paths
    dash = free_port()
    cmd = [
        *(str(python), "-c", "import sys; from ray.scripts.scripts import main; sys.exit(main())"),
        "start",
        "--head",
        "--block",
        "--num-cpus=2",
        f"--port={free_port()}",
        "--node-ip-address=127.0.0.1",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dash}",
        f"--ray-client-server-port={free_port()}",
        # Fixed defaults (52365, ...) are taken by the session Ray of other tests.
        f"--dashboard-agent-listen-port={free_port()}",
        f"--dashboard-agent-grpc-port={free_port()}",
        f"--metrics-export-port={free_port()}",
        f"--runtime-env-agent-port={free_port()}",
        f"--temp-dir={temp_dir}",
        "--disable-usage-stats",
    ]
    log = open(tmp_path / "head.log", "wb")
    head = subprocess.Popen(
        cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{dash}"
    try:
        wait_for_dashboard(url, token, head)
        yield url, env
    finally:
        # `ray start` alone (by its pid): it drains the node through its GCS, then stops what it
        # started (~2 s). SIGTERM to its whole group killed the GCS too; the drain waited 30 s.
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


def submit(url, env, *args, attempts=30):
    """`ray job submit`; the head's job agent registers a little after the dashboard answers."""
    cmd = [str(BIN / "ray"), "job", "submit", f"--address={url}", "--working-dir", ".", "--"]
    for _ in range(attempts):
        result = subprocess.run(
            [*cmd, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
        )
        if "No available agent" not in result.stderr + result.stdout:
            return result
        time.sleep(2)
    return result


@pytest.mark.slow
def test_ray_job_submit_with_token_auth(ray_session, ray_head, image_folder, tmp_path, s3):
    """A build, then training on its shards with Ray Train, as jobs; with the session Ray of
    the other tests running too, as in CI. The training run writes to S3, as a cluster
    without a shared filesystem needs."""
    url, env = ray_head
    images = image_folder(n=30, exact_copies=2, broken=1)
    out = tmp_path / "job-out"
    result = submit(
        url,
        env,
        "python",
        "-m",
        "mmcurate",
        "build",
        "configs/demo.yaml",
        f"--set=source.path={images}",
        f"--set=output.path={out}",
        "--no-progress",
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    stats = json.loads((out / "stats.json").read_text())
    dropped = {s["name"]: s["dropped"] for s in stats["stages"]}
    assert dropped["decode_image"] == {"decode_error": 1}
    assert dropped["exact_dedupe"] == {"duplicate_exact": 2}
    assert (
        manifest["samples"] == stats["samples_out"] == 30 - sum(dropped["caption_filter"].values())
    )

    # The same cluster trains on those shards: two Ray Train ranks (launch.mode: ray).
    bucket = s3.make_bucket("ray-job-runs")
    run = f"{bucket}/train-run"
    trained = submit(
        url,
        env,
        *("python", "-m", "mmcurate.trainer", "configs/train_clip.yaml"),
        *(f"--set=data.manifest={out / 'manifest.json'}", f"--set=run.output={run}"),
        *("--set=data.batch_size=4", "--set=data.workers=0", "--set=run.max_steps=3"),
        *("--set=launch.mode=ray", "--set=launch.workers=2", "--set=run.sample_log=true"),
    )
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    fs = s3.filesystem()
    root = run.removeprefix("s3://")
    summary = json.loads(fs.cat_file(f"{root}/summary.json"))
    assert summary["world"] == 2 and summary["steps"] == 3 and summary["samples"] == 3 * 2 * 4
    assert summary["checkpoint"] == f"{run}/checkpoints/step-3.pt" and fs.isfile(
        f"{root}/checkpoints/step-3.pt"
    )
    ray_records = fs.find(f"{root}/ray/mmcurate-train")  # Ray Train's own, beside the run
    assert ray_records, fs.find(root)
    metrics = fs.cat_file(f"{root}/metrics.jsonl").splitlines()
    assert [json.loads(x)["step"] for x in metrics] == [1, 3]  # log_every 10, and the end
    for rank in (0, 1):  # each rank uploads its own sample log
        lines = fs.cat_file(f"{root}/samples/rank-{rank}.jsonl").splitlines()
        assert [json.loads(x)["step"] for x in lines] == [1, 2, 3]

    wrong_token = {**env, "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    refused = submit(url, wrong_token, "python", "-c", "print('should not run')")
    assert refused.returncode != 0  # the head checks the token, not just the client
    assert "should not run" not in refused.stdout

"""Bench: URL list -> download -> resize to 256 px (keep_ratio, jpg) -> shards.

mmcurate against img2dataset, same URL list, same output size, same machine, one run:
the photos are served on loopback by nginx (Debian's package; one worker process), and each
tool runs as the command a user would type. Reported per tool: images/s over the command's
whole wall time, peak memory of the whole process tree (sampled from /proc), and the ratio.
Both tools also run on the first `--small` URLs; (N - small) / (T_N - T_small) is each tool's
marginal rate: its throughput once its fixed start-up cost (Ray's is ~8 s here) is paid.

    apt-get install -y nginx            # once
    .venv/bin/python bench/ingest.py [--n 5000] [--rounds 2]

img2dataset is installed by this script into its own venv (bench/.venv-img2dataset).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
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
from bytecode import compile_all
from mmcurate.pipeline.runtime.loopback import loopback_only_env
from photos import make_photos

REPO = Path(__file__).resolve().parents[1]
I2D_VENV = REPO / "bench" / ".venv-img2dataset"
NGINX_CONF = """
daemon off; worker_processes 1; pid {root}/nginx.pid; error_log {root}/error.log;
events {{ worker_connections 1024; }}
http {{
  access_log off; sendfile on; tcp_nopush on; keepalive_requests 100000;
  client_body_temp_path {root}/tmp; proxy_temp_path {root}/tmp; fastcgi_temp_path {root}/tmp;
  uwsgi_temp_path {root}/tmp; scgi_temp_path {root}/tmp;
  types {{ image/jpeg jpg; }}
  server {{ listen 127.0.0.1:{port}; root {photos}; }}
}}
"""


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_nginx(root: Path, photos: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    (root / "tmp").mkdir(parents=True, exist_ok=True)
    conf = root / "nginx.conf"
    conf.write_text(NGINX_CONF.format(root=root, port=port, photos=photos))
    proc = subprocess.Popen(["nginx", "-c", str(conf), "-p", str(root)])
    time.sleep(1.0)
    if proc.poll() is not None:
        raise RuntimeError("nginx did not start; see " + str(root / "error.log"))
    return proc, port


def ensure_img2dataset() -> Path:
    exe = I2D_VENV / "bin" / "img2dataset"
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", str(I2D_VENV)], check=True)
        subprocess.run([str(I2D_VENV / "bin" / "pip"), "install", "-q", "img2dataset"], check=True)
    return exe


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
        rss[int(entry)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    total, stack = 0, [pid]
    while stack:
        current = stack.pop()
        total += rss.get(current, 0)
        stack.extend(children.get(current, []))
    return total


def timed(cmd: list[str], env: dict | None = None) -> tuple[float, int]:
    """Run a command; returns (wall seconds, peak RSS of its process tree)."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    peak = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, tree_rss(proc.pid))
            stop.wait(0.2)

    sampler = threading.Thread(target=sample)
    sampler.start()
    _, err = proc.communicate()
    stop.set()
    sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed: {err.decode()[-2000:]}")
    return time.perf_counter() - started, peak


def run_img2dataset(exe: Path, urls: Path, out: Path) -> tuple[float, int]:
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "NO_ALBUMENTATIONS_UPDATE": "1"}
    return timed(
        [
            str(exe),
            "--url_list",
            str(urls),
            "--input_format",
            "parquet",
            "--url_col",
            "url",
            "--caption_col",
            "caption",
            "--output_format",
            "webdataset",
            "--output_folder",
            str(out),
            "--processes_count",
            str(os.cpu_count()),
            "--thread_count",
            "32",
            "--image_size",
            "256",
            "--resize_mode",
            "keep_ratio",
            "--encode_format",
            "jpg",
            "--encode_quality",
            "95",
            "--number_sample_per_shard",
            "1000",
            "--timeout",
            "10",
            "--retries",
            "0",
            "--enable_wandb",
            "False",
        ],
        env,
    )


def run_mmcurate(urls: Path, out: Path, files_per_task: int, runtime: str) -> tuple[float, int]:
    shutil.rmtree(out, ignore_errors=True)
    config = REPO / "configs" / "laion_ingest.yaml"
    env = {**os.environ, **loopback_only_env()}  # Ray on 127.0.0.1, nothing off loopback
    return timed(
        [
            str(REPO / ".venv" / "bin" / "mmcurate"),
            "build",
            str(config),
            f"--set=source.path={urls}",
            f"--set=output.path={out}",
            "--no-progress",
            f"--set=source.files_per_task={files_per_task}",
            "--set=stages.0.allow_private_addresses=true",
            "--set=output.shard_max_samples=1000",
            f"--set=ray.runtime={runtime}",
        ],
        env,
    )


def count_i2d(out: Path) -> int:
    stats = [json.loads(p.read_text()) for p in out.glob("*_stats.json")]
    return sum(s["successes"] for s in stats)


def one_round(exe: Path, urls: Path, small: Path, root: Path, args: argparse.Namespace) -> dict:
    """Each tool on the full list and on a small one: end-to-end and marginal rates."""
    load_before = loadavg()
    i2d_s, i2d_mem = run_img2dataset(exe, urls, root / "out-i2d")
    i2d_n = count_i2d(root / "out-i2d")
    mm_s, mm_mem = run_mmcurate(urls, root / "out-mm", args.files_per_task, args.runtime)
    mm_n = json.loads((root / "out-mm" / "manifest.json").read_text())["samples"]
    i2d_small_s, _ = run_img2dataset(exe, small, root / "out-i2d")
    i2d_small_n = count_i2d(root / "out-i2d")
    mm_small_s, _ = run_mmcurate(small, root / "out-mm", args.files_per_task, args.runtime)
    mm_small_n = json.loads((root / "out-mm" / "manifest.json").read_text())["samples"]
    i2d_marginal = (i2d_n - i2d_small_n) / (i2d_s - i2d_small_s)
    mm_marginal = (mm_n - mm_small_n) / (mm_s - mm_small_s)
    ceiling = pool_ceiling(root / "photos", args.ceiling) if args.ceiling else {}
    if ceiling:  # the end-to-end ratio a tool at the pool's rate would get
        ceiling["ratio_ceiling"] = round(ceiling["pool_img_s"] / (i2d_n / i2d_s), 3)
    return ceiling | {
        "img2dataset_img_s": round(i2d_n / i2d_s, 1),
        "mmcurate_img_s": round(mm_n / mm_s, 1),
        "ratio_end_to_end": round((mm_n / mm_s) / (i2d_n / i2d_s), 3),
        "img2dataset_marginal_img_s": round(i2d_marginal, 1),
        "mmcurate_marginal_img_s": round(mm_marginal, 1),
        "ratio_marginal": round(mm_marginal / i2d_marginal, 3),
        "img2dataset_s": round(i2d_s, 2),
        "mmcurate_s": round(mm_s, 2),
        "img2dataset_small_s": round(i2d_small_s, 2),
        "mmcurate_small_s": round(mm_small_s, 2),
        "img2dataset_images": i2d_n,
        "mmcurate_images": mm_n,
        "img2dataset_peak_rss_mb": i2d_mem // 2**20,
        "mmcurate_peak_rss_mb": mm_mem // 2**20,
        "runtime": args.runtime,
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
    }


def pool_ceiling(photos: Path, n: int) -> dict:
    """mmcurate's bare image work (decode, SIMD resize, encode; no download, no files) on both
    cores, on `n` of the photos: the most any tool doing this work this way could reach on the
    machine right now."""
    from image_work import pool_rates

    paths = sorted(str(p) for p in photos.glob("*.jpg"))[: n // 2]
    return {"pool_img_s": pool_rates(paths, counts=(2,))["2_processes_img_s"]}


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--files-per-task", type=int, default=500)
    parser.add_argument("--small", type=int, default=500, help="list size for fixed costs")
    parser.add_argument("--root", help="work folder to keep and reuse (its photos when N match)")
    parser.add_argument("--runtime", default="auto", help="mmcurate's ray.runtime (auto|ray|local)")
    parser.add_argument(
        "--ceiling", type=int, default=0, help="also time the bare image work on N photos"
    )
    args = parser.parse_args()
    if shutil.which("nginx") is None:
        sys.exit("bench/ingest.py needs nginx on PATH: apt-get install -y nginx")
    exe = ensure_img2dataset()
    compile_all()  # img2dataset's venv has its bytecode (pip wrote it); ours too
    root = Path(args.root or tempfile.mkdtemp(prefix="mmcurate-ingest-"))
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)  # nginx workers run unprivileged and must read the photos
    if len(list((root / "photos").glob("*.jpg"))) != args.n:
        shutil.rmtree(root / "photos", ignore_errors=True)
        make_photos(root / "photos", args.n, captions=False)
    nginx, port = start_nginx(root / "nginx", root / "photos")
    try:
        urls = root / "urls.parquet"
        names = sorted(p.name for p in (root / "photos").glob("*.jpg"))
        pq.write_table(
            pa.table(
                {
                    "url": [f"http://127.0.0.1:{port}/{n}" for n in names],
                    "caption": [f"photo {n}" for n in names],
                }
            ),
            urls,
        )
        small = root / "urls-small.parquet"
        pq.write_table(pq.read_table(urls).slice(0, args.small), small)
        rounds = []
        for _ in range(args.rounds):  # alternate, so neither tool always runs on a warm cache
            rounds.append(one_round(exe, urls, small, root, args))
            print(json.dumps(rounds[-1]), flush=True)
    finally:
        nginx.send_signal(signal.SIGTERM)
        nginx.wait(timeout=10)
    print(
        json.dumps(
            {
                "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
                "images": args.n,
                "rounds": rounds,
            },
            indent=2,
        )
    )
    if not args.root:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

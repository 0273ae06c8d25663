"""Bench: `mmcurate retry` after a build whose server failed 20% of its requests (503).

N small distinct JPEGs (plus 2% byte copies listed after their originals) are served by a
loopback HTTP server; a parquet URL list holds them. The build runs while every fifth image
answers 503; then the server is healthy and `mmcurate retry OUTPUT` runs as a whole process.
The reference, measured in the same run, is what a user without `retry` does: the build
again from scratch with the healthy server. Reported: wall time of each, their ratio, the
shards rewritten and added, and that both hold the same kept samples.

    .venv/bin/python bench/retry.py [--n 2000] [--out /tmp/mmcurate-bench-retry]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from PIL import Image

REPO = Path(__file__).resolve().parents[1]


class Server(ThreadingHTTPServer):
    daemon_threads = True
    bodies: dict[str, bytes]
    failing: frozenset[str] = frozenset()  # every fifth image (not the copies)
    broken: bool = True


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        body = self.server.bodies.get(self.path)  # robots.txt, ai.txt, ...: 404 (absent)
        failing = self.server.broken and self.path in self.server.failing
        code = 503 if failing else 200 if body is not None else 404
        body = body if code == 200 else b"no"
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def photo(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (32, 32, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=90)
    return out.getvalue()


def config(source: Path, out: Path) -> dict:
    return {
        "source": {"kind": "urls", "path": str(source), "files_per_task": 250},
        "stages": [
            {"name": "download", "allow_private_addresses": True, "retries": 0},
            {"name": "exact_dedupe"},
        ],
        "output": {"path": str(out), "shard_max_samples": 200},
        "ray": {"runtime": "local", "num_cpus": 2},
    }


def timed(command: list[str]) -> float:
    started = time.perf_counter()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    subprocess.run(command, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def kept(out: Path) -> set[str]:
    rows = pq.read_table(out / "signatures", columns=["key", "drop_reason"]).to_pylist()
    return {r["key"] for r in rows if r["drop_reason"] is None}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--out", default="/tmp/mmcurate-bench-retry")
    args = parser.parse_args()
    work = Path(args.out)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    server = Server(("127.0.0.1", 0), Handler)
    server.bodies = {f"/img/{i}.jpg": photo(i) for i in range(args.n)}
    copies = {f"/img/copy-{i}.jpg": server.bodies[f"/img/{i}.jpg"] for i in range(0, args.n, 50)}
    server.bodies |= copies
    server.failing = frozenset(f"/img/{i}.jpg" for i in range(0, args.n, 5))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    urls = [base + path for path in server.bodies]
    source = work / "urls.parquet"
    pq.write_table(pa.table({"url": urls, "caption": ["a photo"] * len(urls)}), source)
    mmcurate = [sys.executable, "-m", "mmcurate"]
    for name in ("out", "reference"):
        (work / f"{name}.yaml").write_text(yaml.safe_dump(config(source, work / name)))
    build_s = timed([*mmcurate, "build", str(work / "out.yaml"), "--no-progress"])
    server.broken = False
    retry_s = timed([*mmcurate, "retry", str(work / "out"), "--no-progress"])
    rebuild_s = timed([*mmcurate, "build", str(work / "reference.yaml"), "--no-progress"])
    record = json.loads((work / "out" / "manifest.json").read_text())["maintenance"][-1]
    result = {
        "samples": len(urls),
        "build_with_failures_s": round(build_s, 2),
        "retry_s": round(retry_s, 2),
        "rebuild_s": round(rebuild_s, 2),
        "rebuild_over_retry": round(rebuild_s / retry_s, 2),
        "fetched": record["fetched"],
        "added": record["added"],
        "shards_rewritten": len(record["shards_rewritten"]),
        "shards_added": len(record["shards_added"]),
        "same_kept_set": kept(work / "out") == kept(work / "reference"),
    }
    print(json.dumps(result, indent=2))
    server.shutdown()


if __name__ == "__main__":
    main()

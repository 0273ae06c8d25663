"""Peak memory of a URL-list build whose images are big (issue 45 item 2): `download` +
`decode_image` over ROWS rows pointing at IMAGES noise PNGs of about MB megabytes each, served
on loopback by a thread of this process. Prints the peak PSS of the process tree (this
process, the local pool's workers) and of its largest single process, as JSON; compare with
docs/scale.md's per-task bound (3 x source.chunk_bytes + 512 MiB, 896 MiB with the defaults).

    .venv/bin/python bench/url_memory.py --rows 512 --images 8 --mb 18 --num-cpus 2

Run it against another tree (`git archive HEAD | tar -x -C /tmp/old`) with PYTHONPATH=/tmp/old
for a before/after pair. Extra source options: `--source chunk_bytes=33554432`.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))  # last: a PYTHONPATH tree wins

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

MiB = 1 << 20


def noise_pngs(folder: Path, count: int, mb: float) -> list[Path]:
    """PNGs of random pixels (incompressible: the file is about the pixel bytes)."""
    import numpy as np
    from PIL import Image

    side = int((mb * 1e6 / 3) ** 0.5)
    rng = np.random.default_rng(0)
    paths = []
    for i in range(count):
        path = folder / f"img{i}.png"
        pixels = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(path, compress_level=1)
        paths.append(path)
    return paths


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def serve(folder: Path) -> http.server.ThreadingHTTPServer:
    handler = functools.partial(Quiet, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class PeakWatch:
    """Largest PSS of the process tree, and of one process in it, sampled every `interval`."""

    def __init__(self, interval: float = 0.05) -> None:
        self.interval, self.tree, self.one = interval, 0, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.watch, daemon=True)

    def watch(self) -> None:
        from bench.memwatch import pss_bytes, tree

        while not self.stop.is_set():
            sizes = [pss_bytes(pid) for pid in tree(os.getpid())]
            self.tree, self.one = max(self.tree, sum(sizes)), max(self.one, max(sizes))
            self.stop.wait(self.interval)

    def __enter__(self) -> PeakWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def parse_value(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--images", type=int, default=8)
    ap.add_argument("--mb", type=float, default=18.0)
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--timeout-s", type=float, default=10.0, help="download's timeout_s")
    ap.add_argument("--source", action="append", default=[], help="KEY=VALUE source option")
    args = ap.parse_args()
    from mmcurate.pipeline.build import run_build
    from mmcurate.pipeline.config import BuildConfig

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "www").mkdir()
        paths = noise_pngs(root / "www", args.images, args.mb)
        server = serve(root / "www")
        base = f"http://127.0.0.1:{server.server_address[1]}"
        rows = [f"{base}/{paths[i % len(paths)].name},photo {i}" for i in range(args.rows)]
        (root / "list.csv").write_text("url,caption\n" + "\n".join(rows) + "\n")
        extra = dict(item.split("=", 1) for item in args.source)
        cfg = {
            "source": {"kind": "urls", "path": str(root / "list.csv")}
            | {k: parse_value(v) for k, v in extra.items()},
            "stages": [
                {
                    "name": "download",
                    "allow_private_addresses": True,
                    "max_bytes": 1 << 30,
                    "timeout_s": args.timeout_s,
                },
                {"name": "decode_image", "resize": {"size": 256}},
            ],
            "output": {"path": str(root / "out")},
            "ray": {"runtime": "local", "num_cpus": args.num_cpus},
        }
        started = time.perf_counter()
        try:
            with PeakWatch() as peak:
                manifest = run_build(BuildConfig.model_validate(cfg), progress=False)
        finally:
            server.shutdown()
        result = {
            "rows": args.rows,
            "image_bytes": [p.stat().st_size for p in paths],
            "samples": manifest["samples"],
            "seconds": round(time.perf_counter() - started, 1),
            "tree_peak_mib": round(peak.tree / MiB),
            "largest_process_peak_mib": round(peak.one / MiB),
            "source": cfg["source"],
        }
    print(json.dumps(result))


if __name__ == "__main__":
    main()

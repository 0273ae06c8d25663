"""A URL list's task keeps to the same memory bound as the other sources (issue 45 item 2):
`download` streams a body above `source.spill_bytes` to the task's spill folder, a chunk holds
at most `source.chunk_bytes` of downloaded bodies in memory (the rest spilled too), stages
downstream read the spilled files, and each file is gone once its sample no longer holds it.

Images are noise PNGs (incompressible: the file is about the pixel bytes) served from a folder
by a loopback server of this process."""

from __future__ import annotations

import functools
import gc
import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from mmcurate.core.spill import Spilled, set_task_folder, spill_folder
from mmcurate.stages.registry import build_stages
from PIL import Image

MiB = 1 << 20
ROOT = Path(__file__).resolve().parents[2]


def noise_png(path: Path, side: int, seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, compress_level=1)
    return path.read_bytes()


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """(base URL, folder) of a loopback server over a folder of tmp_path."""
    folder = tmp_path / "www"
    folder.mkdir()
    handler = functools.partial(Quiet, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", folder
    server.shutdown()
    server.server_close()


def batch_of(urls: list[str]) -> dict[str, list]:
    size = len(urls)
    return {"__key__": [f"{i:04d}" for i in range(size)], "url": urls, "json": [None] * size} | {
        "__drop__": [None] * size,
        "__drop_stage__": [None] * size,
    }


def test_download_spills_big_bodies_and_counts_them_toward_the_chunk(served, tmp_path):
    base, www = served
    big = noise_png(www / "big.png", 300, 0)  # ~270 KB: above spill_bytes
    small = noise_png(www / "small.png", 120, 1)  # ~43 KB: under it
    folder = spill_folder(str(tmp_path))
    set_task_folder(folder, spill_bytes=100_000, chunk_bytes=150_000)
    try:
        download, decode = build_stages(
            [
                {"name": "download", "allow_private_addresses": True, "threads": 4},
                {"name": "decode_image", "resize": {"size": 32}},
            ]
        )
        urls = [f"{base}/big.png"] * 2 + [f"{base}/small.png"] * 6
        batch = download(batch_of(urls))
        values = batch["png"]
        assert batch["__drop__"] == [None] * 8
        assert all(isinstance(v, Spilled) for v in values[:2])  # over spill_bytes
        assert [Path(v.path).parent for v in values[:2]] == [Path(folder)] * 2
        assert [v.read() for v in values[:2]] == [big, big]
        held = [v for v in values[2:] if isinstance(v, bytes)]
        assert held and sum(map(len, held)) <= 150_000  # the chunk's bytes in memory
        assert len(held) < 6  # the rest went to disk, each read back as it was served
        assert [v if isinstance(v, bytes) else v.read() for v in values[2:]] == [small] * 6
        digests = [json.loads(meta)["sha256"] for meta in batch["json"]]
        assert digests == [hashlib.sha256(d).hexdigest() for d in [big] * 2 + [small] * 6]
        decoded = decode(batch)  # reads the spilled ones from disk
        assert decoded["__drop__"] == [None] * 8
        assert all(isinstance(v, bytes) for v in decoded["jpg"])
        del batch, values, decoded, held
        gc.collect()
        assert os.listdir(folder) == []  # replaced by the decoded image: each file removed
    finally:
        set_task_folder(None)


def test_a_url_list_task_stays_within_its_bound(served, tmp_path):
    """A build of 96 rows of ~2 MB PNGs in a fresh process: before, download held a whole
    chunk of bodies (64 x 2 MB) and the next one, ahead; now its peak above a warm idle stays
    within docs/scale.md's 3 x chunk_bytes plus a margin for decoding."""
    base, www = served
    for i in range(3):
        noise_png(www / f"p{i}.png", 820, i)  # ~2 MB each
    chunk = 4 * MiB

    def config(rows: int, name: str) -> dict:
        lines = [f"{base}/p{i % 3}.png,photo {i}" for i in range(rows)]
        (tmp_path / f"{name}.csv").write_text("url,caption\n" + "\n".join(lines) + "\n")
        return {
            "source": {"kind": "urls", "path": str(tmp_path / f"{name}.csv")}
            | {"chunk_bytes": chunk, "spill_bytes": MiB},
            "stages": [
                {"name": "download", "allow_private_addresses": True, "timeout_s": 120},
                {"name": "decode_image", "resize": {"size": 64}},
            ],
            "output": {"path": str(tmp_path / f"out-{name}")},
            "ray": {"runtime": "local", "num_cpus": 1},
        }

    spec = {"warm": config(4, "warm"), "build": config(96, "build")}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    temp = tmp_path / "tmp"
    temp.mkdir()
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "bounded_build.py"), str(tmp_path / "spec.json")],
        capture_output=True,
        text=True,
        env=os.environ | {"TMPDIR": str(temp)},
        cwd=ROOT,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    run = json.loads(done.stdout.strip().splitlines()[-1])
    above = run["peak"] - run["idle"]
    print(f"peak above idle, 96 rows of 2 MB PNGs: {above / MiB:.1f} MiB")
    assert above < 3 * chunk + 96 * MiB  # before: ~200 MiB
    manifest = json.loads((tmp_path / "out-build" / "manifest.json").read_text())
    assert manifest["samples"] == 96
    assert [p.name for p in temp.iterdir() if p.name.startswith("mmcurate-spill-")] == []

"""Helpers for the retry and append tests: a loopback site serving distinct small photos (some
byte-identical copies under other paths), failing chosen paths (503 or a stall past the
timeout) while `broken`, URL lists, a build, and what a finished build holds."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from mmcurate.pipeline.build import run_build
from mmcurate.pipeline.config import BuildConfig
from PIL import Image

from tests.host_server import Route, Site

TIMEOUT_S = 2.0  # generous: a loaded machine must not time out a healthy fetch


def photo(seed: int) -> bytes:
    """A distinct 24x24 JPEG per seed."""
    pixels = np.random.default_rng(seed).integers(0, 255, (24, 24, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=90)
    return out.getvalue()


class FlakySite(Site):
    """Serves /img/<n>.jpg; while `broken`, the paths in `failing` answer 503 and those in
    `stalling` answer after the client's timeout."""

    def __init__(self) -> None:
        super().__init__()
        self.broken = True
        self.failing: set[str] = set()
        self.stalling: set[str] = set()
        self.chaos = self.trouble

    def trouble(self, path: str, number: int) -> Route | None:
        if not self.broken:
            return None
        if path in self.failing:
            return Route(503, b"busy")
        if path in self.stalling:
            return Route(200, self.routes[path].body, delay_s=TIMEOUT_S * 4)
        return None


def url_list(path: Path, urls: list[str]) -> Path:
    pq.write_table(pa.table({"url": urls, "caption": [f"photo {u}" for u in urls]}), path)
    return path


def spec(source: Path, out: Path | str, options: dict | None = None) -> dict:
    return {
        "storage_options": options or {},
        "source": {"kind": "urls", "path": str(source), "files_per_task": 10},
        "stages": [
            {
                "name": "download",
                "allow_private_addresses": True,
                "retries": 0,
                "timeout_s": TIMEOUT_S,
                "host_pause_after": 1000,
            },
            {"name": "exact_dedupe"},
        ],
        "output": {"path": str(out), "shard_max_samples": 4},
        "ray": {"runtime": "local", "num_cpus": 1},
    }


def build(source: Path, out: Path | str, options: dict | None = None) -> dict:
    return run_build(BuildConfig.model_validate(spec(source, out, options)), progress=False)


def kept(out: Path) -> dict[str, str]:
    """Key -> sha256 of the kept image, read from the shards themselves."""
    import tarfile

    found = {}
    for entry in json.loads((out / "manifest.json").read_text())["shards"]:
        with tarfile.open(out / entry["name"]) as tar:
            for member in tar:
                if member.name.endswith((".jpg", ".jpeg", ".png", ".webp")):
                    data = tar.extractfile(member).read()
                    found[member.name.partition(".")[0]] = hashlib.sha256(data).hexdigest()
    return found


def shard_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("shard-*"))}


def kept_urls(out: Path) -> dict[str, str]:
    """Key -> url of every kept row in the published signatures."""
    rows = pq.read_table(out / "signatures").to_pylist()
    return {r["key"]: r["url"] for r in rows if r["drop_reason"] is None}


def assert_manifest_matches(out: Path) -> None:
    """Every shard the manifest lists is there with its size and sha256, and no other."""
    import hashlib

    manifest = json.loads((out / "manifest.json").read_text())
    names = {e["name"] for e in manifest["shards"]}
    assert names == {p.name for p in out.glob("shard-*.tar")}
    for entry in manifest["shards"]:
        data = (out / entry["name"]).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (entry["bytes"], entry["sha256"])
    assert manifest["samples"] == sum(e["samples"] for e in manifest["shards"])
    assert all((out / name).exists() for name in manifest["files"])

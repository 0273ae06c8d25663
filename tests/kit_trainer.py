"""Trainer runs for tests: torchrun launches, their logs and summaries, a small photo corpus."""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import subprocess
import sys
import tarfile
from pathlib import Path

from mmcurate.trainer.health.checks import FAULTS_ENV
from PIL import Image, ImageEnhance
from skimage import data as skdata

REPO = Path(__file__).resolve().parents[1]
PHOTOS = {
    "astronaut": "an astronaut in a white space suit in front of an american flag",
    "chelsea": "a ginger tabby cat looking to the side",
    "coffee": "a cup of coffee on a saucer seen from above",
    "rocket": "a rocket standing on the launch pad under a blue sky",
    "hubble_deep_field": "thousands of distant galaxies in the black night sky",
    "retina": "a photograph of the back of a human eye with red blood vessels",
    "coins": "old silver coins laid out in rows on a table",
    "camera": "a black and white photo of a man with a camera on a tripod",
}
SAMPLES_PER_PHOTO = 24
SHARDS = 4


def run_torchrun(config: Path, world: int, *overrides: str) -> subprocess.CompletedProcess:
    env = os.environ | {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += [f"--nproc-per-node={world}", "-m", "mmcurate.trainer", str(config)]
    for override in overrides:
        cmd += ["--set", override]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=REPO)


def printed_summaries(stdout: str) -> list[dict]:
    """Every rank prints its JSON summary; two ranks' lines may end up on one line."""
    decoder, found, at = json.JSONDecoder(), [], stdout.find("{")
    while at != -1:
        summary, end = decoder.raw_decode(stdout, at)
        found.append(summary)
        at = stdout.find("{", end)
    return found


def logged_steps(output: Path) -> dict[int, list[dict]]:
    return {
        int(path.stem.split("-")[1]): [json.loads(line) for line in path.read_text().splitlines()]
        for path in (output / "samples").glob("rank-*.jsonl")
    }


def torchrun(config: Path, ranks: int = 2, restarts: int = 0, faults: dict | None = None):
    env = os.environ | {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env |= {FAULTS_ENV: json.dumps(faults)} if faults else {}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={ranks}",
    ]
    cmd += [f"--max-restarts={restarts}", "-m", "mmcurate.trainer", str(config)]
    # The timeout only guards against a hang: on a loaded 2-core machine one try of the
    # restart test (two attempts of torchrun) took over 300 s.
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1200, cwd=REPO)


def photo(name: str) -> Image.Image:
    arr = getattr(skdata, name)()
    img = Image.fromarray(arr)
    return img.convert("RGB")


def variant(img: Image.Image, rng: random.Random) -> bytes:
    """A random crop with colour jitter, as a small JPEG."""
    w, h = img.size
    side = int(min(w, h) * rng.uniform(0.6, 1.0))
    x, y = rng.randint(0, w - side), rng.randint(0, h - side)
    out = img.crop((x, y, x + side, y + side)).resize((80, 80), Image.BICUBIC)
    out = ImageEnhance.Brightness(out).enhance(rng.uniform(0.8, 1.2))
    out = ImageEnhance.Color(out).enhance(rng.uniform(0.7, 1.3))
    buf = io.BytesIO()
    out.save(buf, format="JPEG", quality=85)
    return buf.getvalue()


def add_member(tar: tarfile.TarFile, name: str, payload: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(payload)
    tar.addfile(info, io.BytesIO(payload))


def write_shards(folder: Path) -> Path:
    """SHARDS tar shards of `<key>.jpg/.txt/.json` members and a manifest.json."""
    rng = random.Random(0)
    samples = [(name, caption) for name, caption in PHOTOS.items()] * SAMPLES_PER_PHOTO
    rng.shuffle(samples)
    images = {name: photo(name) for name in PHOTOS}
    per_shard = len(samples) // SHARDS
    entries = []
    for s in range(SHARDS):
        path = folder / f"shard-{s:06d}.tar"
        chunk = samples[s * per_shard : (s + 1) * per_shard]
        with tarfile.open(path, "w") as tar:
            for i, (name, caption) in enumerate(chunk):
                key = f"{s:03d}{i:05d}"
                add_member(tar, f"{key}.jpg", variant(images[name], rng))
                add_member(tar, f"{key}.txt", caption.encode())
                add_member(tar, f"{key}.json", json.dumps({"photo": name}).encode())
        raw = path.read_bytes()
        entries.append(
            {
                "name": path.name,
                "samples": len(chunk),
                "bytes": len(raw),
                "sha256": hashlib.sha256(raw).hexdigest(),
            }
        )
    manifest = {
        "format": "mmcurate/1",
        "samples": per_shard * SHARDS,
        "shards": entries,
        "config": {"note": "made by tests/trainer/test_trainer.py"},
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder / "manifest.json"


def tree(manifest: Path, output: Path, **run) -> dict:
    return {
        "data": {"manifest": str(manifest), "batch_size": 16, "workers": 2, "seed": 0},
        "model": {"name": "mmcurate-tiny"},
        "optim": {"lr": 1e-3, "warmup_steps": 5, "weight_decay": 0.1},
        "run": {"output": str(output), "log_every": 1, **run},
    }

"""Captioned pictures of coloured shapes: captions that describe the image, for CLIP tests."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np
from mmcurate.core.tar_writer import write_tar
from PIL import Image, ImageDraw

COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 180, 40),
    "blue": (30, 60, 220),
    "yellow": (240, 220, 30),
    "purple": (140, 40, 170),
    "white": (245, 245, 245),
}
SHAPES = ("circle", "square", "triangle", "cross")


def draw(colour: str, shape: str, rng: np.random.Generator, side: int = 64) -> bytes:
    grey = int(rng.integers(40, 120))
    image = Image.new("RGB", (side, side), (grey, grey, grey))
    pen = ImageDraw.Draw(image)
    size = int(rng.integers(side * 0.45, side * 0.8))
    x0, y0 = (int(v) for v in rng.integers(0, side - size, size=2))
    box, fill = (x0, y0, x0 + size, y0 + size), COLOURS[colour]
    if shape == "circle":
        pen.ellipse(box, fill=fill)
    elif shape == "square":
        pen.rectangle(box, fill=fill)
    elif shape == "triangle":
        pen.polygon([(x0, y0 + size), (x0 + size, y0 + size), (x0 + size // 2, y0)], fill=fill)
    else:
        third = size // 3
        pen.rectangle((x0 + third, y0, x0 + 2 * third, y0 + size), fill=fill)
        pen.rectangle((x0, y0 + third, x0 + size, y0 + 2 * third), fill=fill)
    out = io.BytesIO()
    image.save(out, "JPEG", quality=90)
    return out.getvalue()


def make_shapes(n: int, seed: int) -> list[dict]:
    """n samples {__key__, jpg, txt, label}: caption 'a <colour> <shape>'."""
    rng = np.random.default_rng(seed)
    samples = []
    for i in range(n):
        colour = str(rng.choice(list(COLOURS)))
        shape = str(rng.choice(SHAPES))
        samples.append(
            {
                "__key__": f"s{seed}_{i:05d}",
                "jpg": draw(colour, shape, rng),
                "txt": f"a {colour} {shape}",
                "label": f"{colour} {shape}",
            }
        )
    return samples


def write_shards(samples: list[dict], folder: Path, per_shard: int) -> Path:
    """WebDataset shards plus an mmcurate manifest.json; returns the manifest path."""
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for index, start in enumerate(range(0, len(samples), per_shard)):
        name = f"shard-{index:06d}.tar"
        rows = [
            {k: s[k] for k in ("__key__", "jpg", "txt")} for s in samples[start : start + per_shard]
        ]
        with open(folder / name, "wb") as f:
            write_tar(rows, f)
        data = (folder / name).read_bytes()
        entries.append(
            {
                "name": name,
                "samples": len(rows),
                "bytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
            }
        )
    manifest = {"format": "mmcurate/1", "samples": len(samples), "shards": entries}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder / "manifest.json"


def write_folder(samples: list[dict], folder: Path) -> Path:
    """As an `images` source folder: <key>.jpg + <key>.txt."""
    folder.mkdir(parents=True, exist_ok=True)
    for s in samples:
        (folder / f"{s['__key__']}.jpg").write_bytes(s["jpg"])
        (folder / f"{s['__key__']}.txt").write_text(s["txt"])
    return folder

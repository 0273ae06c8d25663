"""Benchmark inputs: distinct JPEG photos of 400-900 px made from the scikit-image photos."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from mmcurate.pipeline.demo_data import SUBJECTS, source_photo


def make_photos(folder: Path, n: int, seed: int = 0, captions: bool = True) -> int:
    """n distinct JPEGs (long side 400-900 px) with `.txt` captions; returns total bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    names = list(SUBJECTS)
    total = 0
    for i in range(n):
        name = names[i % len(names)]
        photo = source_photo(name).convert("RGB")
        w, h = photo.size
        cw, ch = int(w * rng.uniform(0.6, 1.0)), int(h * rng.uniform(0.6, 1.0))
        x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
        image = photo.crop((x, y, x + cw, y + ch))
        scale = rng.uniform(400, 900) / max(image.size)
        image = image.resize((round(image.width * scale), round(image.height * scale)))
        out = io.BytesIO()
        image.save(out, "JPEG", quality=int(rng.integers(85, 96)))
        (folder / f"img{i:06d}.jpg").write_bytes(out.getvalue())
        if captions:
            (folder / f"img{i:06d}.txt").write_text(f"a photo of {SUBJECTS[name]}")
        total += len(out.getvalue())
    return total

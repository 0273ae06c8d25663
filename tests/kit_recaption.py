"""recaption test pieces: a batch of photos, stages run in order, CLIP scores, a build, the CLI."""

import subprocess
import sys
from pathlib import Path

import numpy as np
from mmcurate.stages.base import DROP, DROP_STAGE
from mmcurate.stages.registry import build_stages, stage_order

REPO = Path(__file__).resolve().parents[1]
CLIP = {"name": "clip_score", "model": "mmcurate-tiny", "pretrained": None}


def photo_batch(folder: Path) -> dict:
    files = sorted(p for p in folder.iterdir() if p.suffix in (".jpg", ".png"))
    n = len(files)
    return {
        "__key__": [f.stem for f in files],
        "jpg": [f.read_bytes() for f in files],
        "txt": [f.with_suffix(".txt").read_text() for f in files],
        "json": [None] * n,
        DROP: [None] * n,
        DROP_STAGE: [None] * n,
    }


def run_stages(specs: list[dict], batch: dict) -> dict:
    for stage in stage_order(build_stages(specs)):
        batch = stage(batch)
    return batch


def clip_text(captions: list[str]) -> np.ndarray:
    """The tiny CLIP's float16 text embeddings, computed here (open_clip, seeded weights)."""
    from mmcurate.stages.lib.clip_model import ClipModel

    model = ClipModel("mmcurate-tiny", None, "cpu")
    _, text = model.encode(np.zeros((0, 1, 1, 3), np.uint8), captions)
    return text.astype(np.float16)


def score(image: np.ndarray, texts: list[str]) -> list[float]:
    embeddings = clip_text(texts).astype(np.float32)
    return [round(float(np.dot(image.astype(np.float32), t)), 6) for t in embeddings]


def recaption_build(photos: Path, blip2: Path, out: Path) -> dict:
    return {
        "source": {"kind": "images", "path": str(photos), "files_per_task": 2},
        "stages": [
            {"name": "decode_image", "resize": {"size": 48}},
            {
                "name": "recaption",
                "model": str(blip2),
                "choose": "synthetic",
                "max_new_tokens": 5,
                "sample": True,
                "batch_size": 2,
            },
        ],
        "output": {"path": str(out), "shard_max_samples": 4},
    }


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mmcurate", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )

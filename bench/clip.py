"""Bench: clip_score stage throughput on CPU against a bare open_clip loop on the same images.

Input: N distinct JPEG photos, 400-900 px, with captions (bench/photos.py). Model: ViT-B-32
with random weights (no download; throughput does not depend on the weights).
- bare loop: one process, torch's default threads (all CPUs): PIL decode, the model's own
  preprocess, `encode_image` + `encode_text` in batches of 64, normalized, cosine.
- mmcurate: `run_build` with only `clip_score` (num_gpus 0: the model runs inside the
  partition tasks, one per CPU), 64 images per task; timed: the whole build, and its
  candidates phase (read, decode, score, write), on an already started Ray.

    .venv/bin/python bench/clip.py [--n 512] [--model ViT-B-32]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import tempfile
import time
from pathlib import Path

from mmcurate.pipeline.runtime.loopback import loopback_only_env

# Before Ray is imported: Ray on 127.0.0.1 and nothing sent off loopback (objectstore.py).
os.environ.update(loopback_only_env())

import open_clip  # noqa: E402
import ray  # noqa: E402
import torch  # noqa: E402
from mmcurate.pipeline.build import run_build  # noqa: E402
from mmcurate.pipeline.config import BuildConfig  # noqa: E402
from photos import make_photos  # noqa: E402
from PIL import Image  # noqa: E402


def bare_loop(folder: Path, model_name: str, batch: int = 64) -> float:
    """Seconds for the plain open_clip loop over every image in `folder`."""
    model, _, preprocess = open_clip.create_model_and_transforms(model_name, pretrained=None)
    model.eval()
    tokenizer = open_clip.get_tokenizer(model_name)
    files = sorted(folder.glob("*.jpg"))
    started = time.perf_counter()
    with torch.inference_mode():
        for start in range(0, len(files), batch):
            chunk = files[start : start + batch]
            images = torch.stack(
                [preprocess(Image.open(io.BytesIO(f.read_bytes())).convert("RGB")) for f in chunk]
            )
            texts = tokenizer([f.with_suffix(".txt").read_text() for f in chunk])
            image = torch.nn.functional.normalize(model.encode_image(images), dim=-1)
            text = torch.nn.functional.normalize(model.encode_text(texts), dim=-1)
            (image * text).sum(dim=-1).tolist()
    return time.perf_counter() - started


def stage_build(folder: Path, out: Path, model_name: str) -> tuple[float, float]:
    cfg = BuildConfig.model_validate(
        {
            "source": {"kind": "images", "path": str(folder), "files_per_task": 64},
            "stages": [
                {"name": "clip_score", "model": model_name, "pretrained": None, "num_gpus": 0}
            ],
            "output": {"path": str(out), "overwrite": True},
        }
    )
    started = time.perf_counter()
    run_build(cfg, progress=False)
    total = time.perf_counter() - started
    stats = json.loads((out / "stats.json").read_text())
    return total, stats["phases"]["candidates"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=512)
    parser.add_argument("--model", default="ViT-B-32")
    args = parser.parse_args()
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, logging_level="ERROR")
    with tempfile.TemporaryDirectory(prefix="clip-bench-") as tmp:
        folder = Path(tmp) / "photos"
        make_photos(folder, args.n)
        stage_build(folder, Path(tmp) / "warm", args.model)  # workers started, model cached
        bare = bare_loop(folder, args.model)
        total, candidates = stage_build(folder, Path(tmp) / "out", args.model)
    rates = {
        "bare_loop_img_s": args.n / bare,
        "stage_candidates_phase_img_s": args.n / candidates,
        "stage_whole_build_img_s": args.n / total,
    }
    print(json.dumps({"machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "n": args.n}))
    print(json.dumps({k: round(v, 1) for k, v in rates.items()}))
    base = rates["bare_loop_img_s"]
    print(
        json.dumps(
            {
                "candidates_phase_vs_bare": round(rates["stage_candidates_phase_img_s"] / base, 2),
                "whole_build_vs_bare": round(rates["stage_whole_build_img_s"] / base, 2),
            }
        )
    )
    ray.shutdown()


if __name__ == "__main__":
    main()

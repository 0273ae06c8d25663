"""CPU bench (issue 38): the `aesthetic_score` stage against a plain open_clip + head loop, and
what aesthetic_score adds to a build step that already runs clip_score on the same model.

Inputs: N distinct 400-900 px JPEG photos with captions (bench/photos.py), as bytes in memory.
Model: an open_clip config with random weights (default ViT-B-32; nothing is downloaded, and
throughput does not depend on the weights); head: LAION's v2 MLP (Linear dim-1024-128-64-16-1
with dropout, as published) with random weights, saved as .pth.
- plain: the loop LAION's predictor scripts run: `create_model_and_transforms`, PIL decode +
  the model's own preprocess, `encode_image` in batches, L2-normalise, the MLP head (torch).
- stage: `aesthetic_score` (device cpu) called on a batch of the same bytes: draft-mode decode,
  the model's transform to uint8, `ClipModel.encode`, the head folded to one dot product.
Both in one process, batch by batch in turns (bench/interleave.py: the order swaps every batch,
so both see the same moments of a shared CPU), at each torch thread count; images per second
(wall) and per CPU-second (this process's CPU time: "per core"). Then clip_score alone against
clip_score + aesthetic_score on the same model (the second reuses the first's embeddings): the
extra cost as a share of clip_score's time.

    .venv/bin/python bench/aesthetic.py [--images 128] [--batch 32] [--rounds 2]
        [--threads 1 2] [--model ViT-B-32]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from interleave import interleaved, summary  # noqa: E402
from PIL import Image  # noqa: E402


class MLP(torch.nn.Module):
    """LAION improved-aesthetic-predictor's head, as published (state keys layers.N.*)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(dim, 1024),
            torch.nn.Dropout(0.2),
            torch.nn.Linear(1024, 128),
            torch.nn.Dropout(0.2),
            torch.nn.Linear(128, 64),
            torch.nn.Dropout(0.1),
            torch.nn.Linear(64, 16),
            torch.nn.Linear(16, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def save_head(dim: int, path: Path) -> MLP:
    """A random v2 head (scores spread over a few units, as trained heads' do), saved."""
    torch.manual_seed(7)
    head = MLP(dim)
    with torch.no_grad():
        for p in head.parameters():
            p.mul_(4.0)
    torch.save(head.state_dict(), path)
    return head.eval()


def photo_batch(folder: Path, n: int) -> dict:
    """The stage's input columns for n photos (bytes in memory, as a task holds them)."""
    from mmcurate.stages.base import DROP, DROP_STAGE
    from photos import make_photos

    make_photos(folder, n)
    files = sorted(folder.glob("*.jpg"))
    return {
        "__key__": [f.stem for f in files],
        "jpg": [f.read_bytes() for f in files],
        "txt": [f.with_suffix(".txt").read_text() for f in files],
        "json": [None] * n,
        DROP: [None] * n,
        DROP_STAGE: [None] * n,
    }


def plain_model(name: str) -> tuple:
    """open_clip's model and preprocess, with the random weights mmcurate draws (seed 0)."""
    import open_clip
    from mmcurate.core.model_configs import register

    register()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model, _, preprocess = open_clip.create_model_and_transforms(name, pretrained=None)
    return model.eval(), preprocess


def plain_loop(model, preprocess, head: MLP, images: list[bytes], batch: int) -> list[float]:
    scores: list[float] = []
    with torch.inference_mode():
        for at in range(0, len(images), batch):
            pixels = torch.stack(
                [
                    preprocess(Image.open(io.BytesIO(b)).convert("RGB"))
                    for b in images[at : at + batch]
                ]
            )
            embedding = torch.nn.functional.normalize(model.encode_image(pixels), dim=-1)
            scores += head(embedding).squeeze(-1).tolist()
    return scores


def fresh(data: dict) -> dict:
    """A copy of the columns a stage may write into (the bytes themselves are shared)."""
    return {k: list(v) for k, v in data.items()}


def stage_specs(args, weights: Path) -> tuple[dict, dict]:
    common = {"model": args.model, "pretrained": None, "device": "cpu", "num_gpus": 0}
    common["batch_size"] = args.batch
    return {"name": "aesthetic_score", "weights": str(weights), **common}, {
        "name": "clip_score",
        **common,
    }


def run_stages(stages: list, data: dict) -> dict:
    batch = fresh(data)
    for stage in stages:
        batch = stage(batch)
    return batch


def chunks(data: dict, size: int) -> list[dict]:
    """The photos in batches of `size` (one stage call, one plain loop batch each)."""
    n = len(data["__key__"])
    return [{k: v[at : at + size] for k, v in data.items()} for at in range(0, n, size)]


def per_core(args, data: dict, model, preprocess, head: MLP, weights: Path) -> list[dict]:
    """Stage vs plain loop at each thread count; scores compared as a fairness check."""
    from mmcurate.stages.registry import build_stages

    parts = chunks(data, args.batch)
    results = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        stage = build_stages([stage_specs(args, weights)[0]])[0]
        loops = {
            "plain": lambda c: plain_loop(model, preprocess, head, c["jpg"], args.batch),
            "stage": lambda c, stage=stage: run_stages([stage], c)["aesthetic_score"],
        }
        interleaved(1, parts[:1], loops)  # warm: model load, first calls
        wall, cpu, out = interleaved(args.rounds, parts, loops)
        plain = np.concatenate(out["plain"])
        ours = np.concatenate(out["stage"]).astype(np.float64)
        result = {"part": "aesthetic_score (stage) vs plain open_clip + head", "threads": threads}
        result |= summary(args.rounds * len(data["jpg"]), wall, cpu, "img")
        # draft-mode decode moves scores a little: how far, against their spread
        result["score_max_abs_diff"] = round(float(np.abs(plain - ours).max()), 4)
        result["score_std"] = round(float(plain.std()), 4)
        result["score_corr"] = round(float(np.corrcoef(plain, ours)[0, 1]), 5)
        results.append(result)
        print(json.dumps(result), flush=True)
    return results


def shared_cost(args, data: dict, weights: Path) -> dict:
    """clip_score alone vs clip_score + aesthetic_score (same model: embeddings reused)."""
    from mmcurate.stages.registry import build_stages

    torch.set_num_threads(max(args.threads))
    aesthetic, clip = stage_specs(args, weights)
    alone = build_stages([clip])
    both = build_stages([clip, aesthetic])
    assert both[1].shared, "aesthetic_score should reuse clip_score's embeddings"
    loops = {"clip": lambda c: run_stages(alone, c), "both": lambda c: run_stages(both, c)}
    parts = chunks(data, args.batch)
    interleaved(1, parts[:1], loops)  # warm
    wall, cpu, out = interleaved(args.rounds, parts, loops)
    scored = [s for batch in out["both"] for s in batch["aesthetic_score"]]
    assert None not in scored, "every photo should be scored"
    result = {"part": "clip_score + aesthetic_score vs clip_score alone (shared embedding)"}
    result["threads"] = max(args.threads)
    result |= summary(args.rounds * len(data["jpg"]), wall, cpu, "img")
    result["extra_cost_wall"] = round((wall["both"] - wall["clip"]) / wall["clip"], 4)
    result["extra_cost_cpu"] = round((cpu["both"] - cpu["clip"]) / cpu["clip"], 4)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--model", default="ViT-B-32")
    args = parser.parse_args()
    model, preprocess = plain_model(args.model)
    dim = int(model.visual.output_dim)
    cpus = os.cpu_count()
    head_info = f"LAION v2 MLP {dim}-1024-128-64-16-1, random"
    print(json.dumps({"machine": f"{platform.machine()}, {cpus} CPUs", "model": args.model}))
    print(json.dumps({"images": args.images, "batch": args.batch, "head": head_info}))
    with tempfile.TemporaryDirectory(prefix="aesthetic-bench-") as tmp:
        weights = Path(tmp) / "head.pth"
        head = save_head(dim, weights)
        data = photo_batch(Path(tmp) / "photos", args.images)
        per_core(args, data, model, preprocess, head, weights)
        print(json.dumps(shared_cost(args, data, weights)), flush=True)


if __name__ == "__main__":
    main()

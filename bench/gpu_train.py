"""GPU check, training part: ViT-B-32 CLIP training (bf16) from shards on one GPU with
mmcurate's trainer; step time, samples/s and data_wait_frac (the share of step time spent
waiting for data). First the ring path (JPEG decode in the loader workers, uint8 batches in
their shared-memory rings, registered with CUDA and copied on a side stream) with each of
`--workers` (4, 8 and 16 by default), then `data.gpu_decode` (nvJPEG on the GPU, a
DataLoader) with the largest. Each line names the transport the run used.

    python3 bench/gpu_train.py --shards DIR [--model ViT-B-32] [--batch 256] [--workers 4 8 16]

The first logged window (compile, cuDNN autotune, worker start) is left out of the figures.
Runs on a CPU too (slowly), which is how it is checked on machines without a GPU.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
from pathlib import Path

import torch
from mmcurate.core.tario import iter_tar_samples
from mmcurate.trainer.config import TrainConfig
from mmcurate.trainer.train import train
from mmcurate.trainer.train_data import training_transport


def write_manifest(shards: Path) -> Path:
    entries = []
    for tar in sorted(shards.glob("*.tar")):
        raw = tar.read_bytes()
        with open(tar, "rb") as f:
            count = sum(1 for _ in iter_tar_samples(f))
        digest = hashlib.sha256(raw).hexdigest()
        entries.append({"name": tar.name, "samples": count, "bytes": len(raw), "sha256": digest})
    doc = {"format": "mmcurate/1", "samples": sum(e["samples"] for e in entries)}
    (shards / "manifest.json").write_text(json.dumps(doc | {"shards": entries}))
    return shards / "manifest.json"


def run(manifest: Path, args: argparse.Namespace, workers: int, gpu_decode: bool) -> dict:
    with tempfile.TemporaryDirectory() as out:
        cfg = TrainConfig.model_validate(
            {
                "data": {
                    "manifest": str(manifest),
                    "batch_size": args.batch,
                    "workers": workers,
                    "gpu_decode": gpu_decode,
                },
                "model": {"name": args.model},
                "run": {
                    "output": out,
                    "max_steps": args.steps,
                    "log_every": args.log_every,
                    "precision": "bf16",
                },
            }
        )
        how = training_transport(cfg, "cuda" if torch.cuda.is_available() else "cpu")
        train(cfg)
        rows = [
            json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().split("\n")[:-1]
        ]
    measured = [r for r in rows if r["step"] > args.log_every]  # leave out the first window
    rate = sum(r["samples_per_s"] for r in measured) / len(measured)
    return {
        "workers": workers,
        "gpu_decode": gpu_decode,
        "transport": "rings" if how.rings else "dataloader",
        "step_ms": round(1000 * args.batch / rate, 1),
        "samples_per_s": round(rate, 1),
        "data_wait_frac": round(max(r["data_wait_frac"] for r in measured), 4),
        "last_loss": round(rows[-1]["loss"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shards", type=Path, required=True)
    parser.add_argument("--model", default="ViT-B-32")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--workers", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--log-every", type=int, default=10)
    args = parser.parse_args()
    manifest = write_manifest(args.shards)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    print(f"training {args.model}, batch {args.batch}, {args.workers} workers, on {device}")
    runs = [(workers, False) for workers in args.workers] + [(max(args.workers), True)]
    for workers, gpu_decode in runs:
        print(json.dumps(run(manifest, args, workers, gpu_decode)), flush=True)


if __name__ == "__main__":
    main()

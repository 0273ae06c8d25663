"""GPU check, fsdp part (issue 41): `strategy: fsdp` (FSDP2 fully_shard on a mesh of one GPU,
bf16 mixed precision policy) for ViT-B-32: first a batch-size ladder on synthetic batches
(the largest per-GPU batch that fits: peak torch.cuda.max_memory_allocated per rung, the
first out-of-memory rung ends it), then a short training run from shards at that batch with
mmcurate's trainer, telemetry on (NVML, sampled every second off the training thread),
printing step time, samples/s and the GPU readings of the last metrics row (one JSON line
per rung, one for the run).

    python3 bench/gpu_fsdp.py --shards DIR [--batches 256 512 1024 2048 4096] [--steps 20]
    python3 bench/gpu_fsdp.py --device cpu --tiny      # the same code at tiny sizes, here

One process makes a process group of one rank (NCCL on CUDA, gloo on the CPU) so the
trainer shards the model as it does on 4 GPUs; the collectives are then trivial, the FSDP
machinery (parameter all-gather, reduce-scatter, mixed precision casts) is not.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from mmcurate.trainer.config import TrainConfig  # noqa: E402
from mmcurate.trainer.dist.fsdp import is_fsdp  # noqa: E402
from mmcurate.trainer.dist.world import Dist  # noqa: E402
from mmcurate.trainer.probe.ladder import climb, free  # noqa: E402
from mmcurate.trainer.step import build_learner  # noqa: E402


def join_alone(device: str) -> None:
    """A process group of one rank on 127.0.0.1 (what torchrun would make for one GPU)."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=0, world_size=1)


def tree(args: argparse.Namespace, manifest: str, output: str, batch: int) -> dict:
    return {
        "data": {"manifest": manifest, "batch_size": batch, "workers": args.workers},
        "model": {"name": args.model, "gradient_checkpointing": args.checkpointing},
        "strategy": "fsdp",
        "run": {"output": output, "max_steps": args.steps, "log_every": 1, "precision": "bf16"},
        "telemetry": {"enabled": True, "every_s": 1.0},
        "probe": {"batch_sizes": args.batches, "steps": 2},
    }


def ladder(args: argparse.Namespace, device: torch.device) -> int | None:
    """Each rung's JSON line; returns the largest batch that fitted (None: not one)."""
    cfg = TrainConfig.model_validate(tree(args, "unused", "unused", args.batches[0]))
    learner, (_, tokenizer) = build_learner(cfg, Dist(device=device), 1000)
    fitted: list[int] = []
    sharded = is_fsdp(learner.model)

    def report(result: dict) -> None:
        result = {
            "part": "fsdp_ladder",
            "model": args.model,
            "sharded": sharded,
        } | result
        if result["status"] == "ok":
            fitted.append(result["batch_size"])
            result["peak_memory_gib"] = round(result.pop("peak_memory_bytes") / 2**30, 2)
        print(json.dumps(result), flush=True)

    climb(learner, tokenizer, cfg.probe, report)
    free(learner)
    del learner
    return max(fitted, default=None)


def train_run(args: argparse.Namespace, batch: int, device: torch.device) -> dict:
    from gpu_train import write_manifest
    from mmcurate.trainer.train import train

    with tempfile.TemporaryDirectory() as out:
        manifest = str(write_manifest(Path(args.shards)))
        summary = train(TrainConfig.model_validate(tree(args, manifest, out, batch)))
        rows = [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    measured = rows[1:] or rows  # the first step holds start-up
    rate = sum(r["samples_per_s"] for r in measured) / len(measured)
    gpu = {k: round(v, 2) for k, v in rows[-1].items() if k.startswith("gpu/")}
    peak = max((r.get("peak_memory_gib", 0.0) for r in rows), default=0.0)
    return {
        "part": "fsdp_train",
        "model": args.model,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "batch_size": batch,
        "steps": summary["steps"],
        "step_ms": round(1000 * batch / rate, 1),
        "samples_per_s": round(rate, 1),
        "peak_memory_gib": round(peak, 2) if device.type == "cuda" else None,
        "last_loss": round(rows[-1]["loss"], 3),
        "telemetry": gpu or "unavailable (no NVML here)",
    }


def tiny_shards(folder: Path) -> None:
    from tests.kit_shards import write_uneven_shards

    write_uneven_shards(folder, sizes=(32, 32))
    (folder / "manifest.json").unlink()  # write_manifest makes it again


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", help="a folder of WebDataset shards (jpg + txt)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--tiny", action="store_true", help="mmcurate-tiny, tiny batches")
    parser.add_argument("--model", default="ViT-B-32")
    parser.add_argument("--batches", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--checkpointing", action="store_true", help="gradient checkpointing")
    args = parser.parse_args()
    if args.tiny:
        args.model, args.batches, args.steps, args.workers = "mmcurate-tiny", [4, 8], 3, 0
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda: no CUDA device here (try --device cpu --tiny)")
    join_alone(device.type)
    try:
        largest = ladder(args, device)
        if largest is None:
            raise SystemExit(f"error: not even batch {args.batches[0]} fits")
        with tempfile.TemporaryDirectory() as tmp:
            if args.shards is None:
                tiny_shards(Path(tmp))
                args.shards = tmp
            print(json.dumps(train_run(args, largest, device)), flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

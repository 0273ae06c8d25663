"""One loader worker's own CPU time per sample (read, decode, crop, finish, write into its ring
slot), in this process with one decode thread: CPU seconds, so less moved by other load than a
rate. `--tree` measures another checkout's trainer/ (e.g. a `git worktree` of an older commit).

    .venv/bin/python bench/loaders/worker_cpu.py --shards DIR [--tree PATH] [--uint8] [--batches 30]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", required=True, help="folder of shards with manifest.json")
    parser.add_argument("--tree", default=str(HERE.parents[1]), help="checkout whose trainer/")
    parser.add_argument("--uint8", action="store_true", help="uint8 batches (the CUDA path)")
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--model", default="ViT-B-32")
    args = parser.parse_args()
    sys.path[:0] = [args.tree, str(HERE)]
    import common
    import torch
    from mmcurate.trainer.data.dataset import ImageTransform, ShardDataset
    from mmcurate.trainer.data.manifest import read_manifest

    torch.set_num_threads(1)  # as in a loader worker
    preprocess, tokenizer = common.transform(args.model)
    manifest = read_manifest(str(Path(args.shards) / "manifest.json"), {})
    dataset = ShardDataset(
        manifest,
        ImageTransform(preprocess),
        tokenizer,
        batch_size=64,
        shuffle_buffer=1000,
        finish_in_workers=not args.uint8,
        decode_threads=1,
    )
    slots = 6
    free = mp.get_context("fork").Semaphore(slots)
    dataset.start_worker(0, 1, slots, free)  # as a RingLoader worker: batches into its ring
    dataset.set_epoch(0, epochs=None)
    batches = iter(dataset)
    for _ in range(3):  # the ring is made with the first batch
        next(batches)
        free.release()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(args.batches):
        next(batches)
        free.release()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    samples = args.batches * 64
    out = {"tree": args.tree, "batches": "uint8" if args.uint8 else "float"}
    out["cpu_ms_per_sample"] = round(1000 * cpu / samples, 3)
    out["wall_per_cpu"] = round(wall / cpu, 2)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()

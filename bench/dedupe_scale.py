"""Bench: near-dedupe of synthetic 64-bit signatures at 1M, 4M and 10M, on Ray.

Each set: n random hashes of which 1% are planted copies of another at a distance drawn
uniformly from 0..radius. Reports wall time of `near_groups` (tables, candidates, union-find),
the peak PSS of the process tree (driver + Ray), the planted pairs found (same group), and, on
a 200k subset holding 2,000 planted pairs, recall against brute force (faiss binary flat index)
with the plan for 200k and again with the plan used at the largest size.

    .venv/bin/python bench/dedupe_scale.py [--sizes 1000000 4000000 10000000] [--radius 4]
        [--mode auto|exact|lsh] [--no-subset] [--stage-defaults]

`--stage-defaults` times the whole default `near_dedupe` decision instead (radius 4 pairs plus
candidates within 8 by any of 3 hashes, verified on thumbnails) on synthetic signature rows:
the same hashes, each with 2 random inset hashes (a planted copy shares its original's insets
and thumbnail) and a random 32x32 thumbnail.

The machine's load average (other users' work shares its cores) is printed before and after
each size: a timing taken under load says so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np
import pyarrow as pa
from mmcurate.pipeline.runtime.loopback import loopback_only_env

# Before Ray is imported: Ray on 127.0.0.1 and nothing sent off loopback (objectstore.py).
os.environ.update(loopback_only_env())

import faiss  # noqa: E402
import ray  # noqa: E402
from memwatch import PeakMemory, tree, tree_pss  # noqa: E402
from mmcurate.core.mapreduce import RayRunner  # noqa: E402
from mmcurate.stages.lib.hamming_plan import TablePlan, plan_tables
from mmcurate.stages.near_dedupe import close_pairs, near_groups  # noqa: E402
from mmcurate.stages.registry import build_stage  # noqa: E402


def planted(n: int, radius: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n hashes: the last 1% are copies of random originals at distance 0..radius, shuffled.
    Returns hashes and the positions (original, copy) of each planted pair."""
    rng = np.random.default_rng(seed)
    copies = n // 100
    hashes = rng.integers(0, 2**64 - 1, size=n, dtype=np.uint64, endpoint=True)
    originals = rng.choice(n - copies, size=copies, replace=False)
    flipped = hashes[originals].copy()
    distances = rng.integers(0, radius + 1, size=copies)
    for d in range(1, radius + 1):
        rows = np.flatnonzero(distances >= d)
        bits = rng.integers(0, 64, size=len(rows)).astype(np.uint64)
        flipped[rows] ^= np.uint64(1) << bits  # may repeat a bit: distance <= d, still planted
    hashes[n - copies :] = flipped
    order = rng.permutation(n)
    position = np.empty(n, np.int64)
    position[order] = np.arange(n)
    return hashes[order], position[originals], position[np.arange(n - copies, n)]


def brute_force(hashes: np.ndarray, radius: int) -> set[tuple[int, int]]:
    """All pairs within radius, by faiss's exhaustive binary index (range search is < bound)."""
    codes = hashes.view(np.uint8).reshape(-1, 8)
    index = faiss.IndexBinaryFlat(64)
    index.add(codes)
    lims, _, ids = index.range_search(codes, radius + 1)
    pairs = set()
    for i in range(len(hashes)):
        for j in ids[lims[i] : lims[i + 1]]:
            if i < j:
                pairs.add((i, int(j)))
    return pairs


def tree_cpu_seconds() -> float:
    """CPU seconds (user + system) used so far by this process and its descendants (the Ray
    workers): a figure the other users of a shared machine do not inflate the way they do
    wall time."""
    total = 0
    for pid in tree(os.getpid()):
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def subset_recall(radius: int, seed: int, plan: TablePlan | None = None) -> dict:
    """Recall against brute force on 200k hashes, with the plan for 200k, or with `plan`
    (the one used at the largest size: its tables and bits, on this subset)."""
    hashes, _, _ = planted(200_000, radius, seed + 1000)  # 2,000 planted pairs
    started = time.perf_counter()
    truth = brute_force(hashes, radius)
    brute_s = time.perf_counter() - started
    plan = plan or plan_tables(len(hashes), radius, 0.99)
    a, b = close_pairs(hashes, plan, RayRunner())
    found = set(zip(a.tolist(), b.tolist(), strict=True))
    return {
        "plan": plan.describe(),
        "pairs_within_radius": len(truth),
        "found": len(found & truth),
        "recall": len(found & truth) / max(1, len(truth)),
        "false": len(found - truth),
        "brute_force_s": round(brute_s, 1),
    }


def run_size(n: int, radius: int, seed: int, mode: str) -> dict:
    hashes, originals, copies = planted(n, radius, seed)
    plan = plan_tables(n, radius, 0.99, mode)
    load_before = round(os.getloadavg()[0], 2)
    with PeakMemory() as peak:
        cpu, started = tree_cpu_seconds(), time.perf_counter()
        labels = near_groups(hashes, plan, RayRunner())
        seconds, cpu = time.perf_counter() - started, tree_cpu_seconds() - cpu
    found = int(np.sum(labels[originals] == labels[copies]))
    return {
        "n": n,
        "load_before_after": [load_before, round(os.getloadavg()[0], 2)],
        "plan": plan.describe(),
        "seconds": round(seconds, 1),
        "cpu_seconds": round(cpu, 1),
        "peak_pss_gib": round(peak.bytes / 2**30, 2),
        "planted": len(copies),
        "planted_found": found,
        "planted_recall": found / len(copies),
        "groups_with_more_than_one": int(np.sum(np.bincount(labels) > 1)),
    }


def stage_defaults(n: int, seed: int) -> dict:
    """The default near_dedupe's decide on n synthetic signature rows (see the module doc)."""
    hashes, originals, copies = planted(n, 8, seed)
    rng = np.random.default_rng(seed + 1)
    crops = rng.integers(0, 2**64 - 1, size=(n, 2), dtype=np.uint64, endpoint=True)
    thumbs = rng.integers(0, 256, size=(n, 1024), dtype=np.uint8)
    crops[copies], thumbs[copies] = crops[originals], thumbs[originals]
    table = pa.table(
        {
            "__key__": [f"k{i:09d}" for i in range(n)],
            "__drop__": pa.nulls(n, pa.string()),
            "phash": pa.array(hashes, pa.uint64()),
            "phash_crops": pa.FixedSizeListArray.from_arrays(crops.reshape(-1), 2).cast(
                pa.list_(pa.uint64())
            ),
            "thumb": pa.FixedSizeBinaryArray.from_buffers(
                pa.binary(1024), n, [None, pa.py_buffer(thumbs)]
            ).cast(pa.binary()),
        }
    )
    del thumbs
    load_before = round(os.getloadavg()[0], 2)
    with PeakMemory() as peak:
        started = time.perf_counter()
        decided = build_stage({"name": "near_dedupe"}).decide(table, RayRunner())
        seconds = time.perf_counter() - started
    return {
        "n": n,
        "stage": "near_dedupe defaults",
        "load_before_after": [load_before, round(os.getloadavg()[0], 2)],
        "seconds": round(seconds, 1),
        "peak_pss_gib": round(peak.bytes / 2**30, 2),
        "dropped": len(decided),
        "planted": len(copies),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 4_000_000, 10_000_000])
    parser.add_argument("--radius", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mode", default="auto", choices=["auto", "exact", "lsh"])
    parser.add_argument("--no-subset", action="store_true", help="skip the brute-force check")
    parser.add_argument("--stage-defaults", action="store_true", help="time the default stage")
    args = parser.parse_args()
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False)
    print(json.dumps({"machine": f"{platform.machine()}, {os.cpu_count()} CPUs"}))
    print(json.dumps({"idle_tree_pss_gib": round(tree_pss() / 2**30, 2)}))
    if args.stage_defaults:
        for n in args.sizes:
            print(json.dumps(stage_defaults(n, args.seed)), flush=True)
        ray.shutdown()
        return
    results = []
    for n in args.sizes:
        results.append(run_size(n, args.radius, args.seed, args.mode))
        print(json.dumps(results[-1]), flush=True)
    if len(results) > 1:
        ratio = results[-1]["seconds"] / results[0]["seconds"]
        print(json.dumps({"time_ratio_last_to_first": round(ratio, 2)}))
    if not args.no_subset:
        print(json.dumps({"subset_200k": subset_recall(args.radius, args.seed)}))
        largest = plan_tables(max(args.sizes), args.radius, 0.99, args.mode)
        print(
            json.dumps({"subset_200k_largest_plan": subset_recall(args.radius, args.seed, largest)})
        )
    ray.shutdown()


if __name__ == "__main__":
    main()

"""Bench: near-duplicate precision and recall on real photos, and imagededup side by side.

Quality: distinct photos (bench/nearphotos.py) each with 2 injected near-duplicates. A pair of
items is *true* when both come from the same original; *found* when the dedupe puts both in one
group. Precision and recall count pairs, at several radii, with recall per transform.

imagededup (`--imagededup`): the same kind of set, bigger (tiles in 4 orientations), written to
a folder. imagededup's PHash (`encode_images` + `find_duplicates`, its defaults: all CPUs,
brute_force_cython search) runs in its own venv (bench/.venv-imagededup, made on first use);
mmcurate's side is the near_dedupe stage's hash on a 2-process pool, then `near_groups`.
imagededup reports, per image, the images within the radius (no grouping), so a pair is found
for it when one lists the other; for mmcurate when both share a group.

    .venv/bin/python bench/dedupe_quality.py [--radii 4 6 8 10] [--imagededup --radius 8 --tile 64]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from itertools import combinations
from multiprocessing import Pool
from pathlib import Path

import numpy as np
from nearphotos import TRANSFORMS, Item, make_items

from core.mapreduce import LocalRunner
from stages.lib.hamming import plan_tables
from stages.lib.image_hash import image_hash
from stages.near_dedupe import close_pairs, near_groups

HERE = Path(__file__).resolve().parent
IDD_VENV = HERE / ".venv-imagededup"


def true_pairs(items: list[Item]) -> set[tuple[int, int]]:
    by_group = defaultdict(list)
    for i, item in enumerate(items):
        by_group[item.group].append(i)
    return {pair for members in by_group.values() for pair in combinations(members, 2)}


def group_pairs(labels: np.ndarray) -> set[tuple[int, int]]:
    by_label = defaultdict(list)
    for i, label in enumerate(labels.tolist()):
        by_label[label].append(i)
    return {pair for members in by_label.values() for pair in combinations(members, 2)}


def pairs_of(found: tuple[np.ndarray, np.ndarray]) -> set[tuple[int, int]]:
    return set(zip(found[0].tolist(), found[1].tolist(), strict=True))


def scores(items: list[Item], found: set[tuple[int, int]]) -> dict:
    truth = true_pairs(items)
    hit = found & truth
    per_transform = {}
    originals = {item.group: i for i, item in enumerate(items) if item.transform == "original"}
    for kind in TRANSFORMS:
        pairs = [
            tuple(sorted((originals[item.group], i)))
            for i, item in enumerate(items)
            if item.transform == kind
        ]
        if pairs:
            per_transform[kind] = round(sum(p in found for p in pairs) / len(pairs), 4)
    return {
        "true_pairs": len(truth),
        "found_pairs": len(found),
        "recall": round(len(hit) / max(1, len(truth)), 4),
        "precision": round(len(hit) / max(1, len(found)), 4),
        "recall_vs_original": per_transform,
    }


def hash_one(data: bytes) -> int:
    return image_hash(data)[0]


def our_hashes(items: list[Item]) -> np.ndarray:
    with Pool(2) as pool:
        return np.array(pool.map(hash_one, [i.data for i in items], chunksize=64), np.uint64)


def quality(radii: list[int], seed: int) -> None:
    items = make_items(variants_per_original=2, seed=seed)
    hashes = our_hashes(items)
    originals = sum(1 for i in items if i.transform == "original")
    print(json.dumps({"set": "quality", "originals": originals, "items": len(items)}))
    for radius in radii:
        labels = near_groups(hashes, plan_tables(len(hashes), radius, 0.99), LocalRunner())
        print(json.dumps({"radius": radius, **scores(items, group_pairs(labels))}))


def ensure_imagededup() -> Path:
    python = IDD_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(IDD_VENV)], check=True)
        pip = [str(IDD_VENV / "bin" / "pip"), "install", "-q"]
        subprocess.run([*pip, "torch==2.14.1", "torchvision==0.29.1", "imagededup"], check=True)
    return python


IDD_SCRIPT = """
import json, sys, time
from imagededup.methods import PHash
folder, radius = sys.argv[1], int(sys.argv[2])
phasher = PHash(verbose=False)
started = time.perf_counter()
encodings = phasher.encode_images(image_dir=folder)
encoded = time.perf_counter()
dups = phasher.find_duplicates(encoding_map=encodings, max_distance_threshold=radius)
done = time.perf_counter()
print(json.dumps({"encode_s": encoded - started, "search_s": done - encoded, "dups": dups}))
"""


def versus_imagededup(radius: int, seed: int, limit: int | None, tile: int) -> None:
    python = ensure_imagededup()
    items = make_items(2, orientations=4, seed=seed, limit=limit, tile=tile)
    with tempfile.TemporaryDirectory(prefix="dedupe-bench-") as tmp:
        folder = Path(tmp)
        for item in items:
            (folder / f"{item.key}.jpg").write_bytes(item.data)  # PNG bytes keep their magic
        started = time.perf_counter()
        hashes = our_hashes(items)
        hashed = time.perf_counter()
        plan = plan_tables(len(hashes), radius, 0.99)
        labels = near_groups(hashes, plan, LocalRunner())
        ours_done = time.perf_counter()
        within = pairs_of(close_pairs(hashes, plan, LocalRunner()))
        result = subprocess.run(
            [str(python), "-c", IDD_SCRIPT, str(folder), str(radius)],
            check=True,
            capture_output=True,
            text=True,
        )
    theirs = json.loads(result.stdout.strip().splitlines()[-1])
    index = {f"{item.key}.jpg": i for i, item in enumerate(items)}
    their_pairs = {
        tuple(sorted((index[name], index[other])))
        for name, others in theirs["dups"].items()
        for other in others
    }
    ours = {"hash_s": hashed - started, "search_s": ours_done - hashed}
    print(json.dumps({"set": "imagededup", "items": len(items), "radius": radius}))
    for name, timing, found in (
        ("mmcurate", ours, group_pairs(labels)),
        ("mmcurate, pairs within radius (no grouping)", ours, within),
        ("imagededup", {"hash_s": theirs["encode_s"], "search_s": theirs["search_s"]}, their_pairs),
    ):
        total = timing["hash_s"] + timing["search_s"]
        timing = {k: round(v, 2) for k, v in timing.items()}
        print(
            json.dumps({"tool": name, **timing, "total_s": round(total, 2), **scores(items, found)})
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--radii", type=int, nargs="+", default=[4, 6, 8, 10])
    parser.add_argument("--imagededup", action="store_true")
    parser.add_argument("--radius", type=int, default=8)
    parser.add_argument("--limit", type=int, default=None, help="originals for --imagededup")
    parser.add_argument("--tile", type=int, default=64, help="tile side for --imagededup")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(json.dumps({"machine": f"{platform.machine()}, {os.cpu_count()} CPUs"}))
    if args.imagededup:
        versus_imagededup(args.radius, args.seed, args.limit, args.tile)
    else:
        quality(args.radii, args.seed)


if __name__ == "__main__":
    main()

"""Bench: near-duplicate recall and precision on real photos, with imagededup in the same run.

Sets (bench/nearphotos.py): `views`, the larger-photo set (384-900 px distinct views of the
scikit-image photos, many of them different crops of one scene, 30% with one injected
near-duplicate, some exact copies), and `tiles`, the 96 px tiles (192 px) with two injected
near-duplicates each.

What a build would keep is scored, for every tool the same way, on the survivors alone:
- recall: of the injected near-duplicates, the fraction found: not both it and its original
  survive, and its group keeps a survivor (else it was lost to another group); per transform;
- groups collapsed: of the groups with injected near-duplicates, those left with one survivor;
- precision (distinct kept): of the distinct images (groups), the fraction with a survivor;
- wrong drops: items dropped for an item of another group (near_dedupe says which it kept).

Tools: `near_dedupe` with its defaults (`- {name: near_dedupe}`), the same with CLIP embeddings
in the signatures (as after clip_score; the tiny open_clip config `mmcurate-tiny` with random
weights, the only CLIP model there is offline here), the pre-issue-22 behaviour (`radius: 8,
verify: none`, and its connected components), and imagededup in its own venv
(bench/.venv-imagededup, made on first use): PHash `find_duplicates_to_remove` at several
thresholds, and CNN (it needs torchvision weights downloaded from the internet: reported as
not run when they are not there).

    .venv/bin/python bench/dedupe_quality.py [--sets views tiles] [--count 1500] [--no-imagededup]
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
from multiprocessing import Pool
from pathlib import Path

import numpy as np
import pyarrow as pa
from mmcurate.core.mapreduce import LocalRunner
from mmcurate.stages.base import DROP
from mmcurate.stages.lib.dedupe_common import group_decisions, keepers, priority_rank
from mmcurate.stages.lib.hamming_plan import plan_tables
from mmcurate.stages.near_dedupe import close_pairs
from mmcurate.stages.registry import build_stage
from nearphotos import TRANSFORMS, Item, make_items, make_views
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

HERE = Path(__file__).resolve().parent
IDD_VENV = HERE / ".venv-imagededup"
MAIN_SITE = Path(sys.prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
CHUNK = 64


def signals(chunk: list[Item]) -> dict:
    stage = build_stage({"name": "near_dedupe"})
    batch = {
        "__key__": [i.key for i in chunk],
        "jpg": [i.data for i in chunk],
        DROP: [None] * len(chunk),
    }
    out = stage(batch)
    return {c: out[c] for c in ("__key__", "phash", "phash_crops", "thumb", "width", "height")}


def signature_table(items: list[Item]) -> tuple[pa.Table, float]:
    started = time.perf_counter()
    chunks = [items[i : i + CHUNK] for i in range(0, len(items), CHUNK)]
    with Pool(2) as pool:
        parts = pool.map(signals, chunks)
    columns = {c: [v for p in parts for v in p[c]] for c in parts[0]}
    table = pa.table(
        {
            "__key__": columns["__key__"],
            DROP: pa.nulls(len(items), pa.string()),
            "phash": pa.array(columns["phash"], pa.uint64()),
            "phash_crops": pa.array(columns["phash_crops"], pa.list_(pa.uint64())),
            "thumb": pa.array(columns["thumb"], pa.binary()),
            "width": columns["width"],
            "height": columns["height"],
        }
    )
    return table, time.perf_counter() - started


def embeddings(items: list[Item]) -> tuple[list[np.ndarray], float]:
    """Image embeddings as clip_score computes them, from `mmcurate-tiny` (random weights)."""
    from mmcurate.stages.lib.clip_model import cached_model

    started = time.perf_counter()
    model = cached_model("mmcurate-tiny", None, "cpu", "auto")
    pixels, _ = model.prepare([i.data for i in items])
    out = []
    for start in range(0, len(pixels), 64):
        vectors, _ = model.encode(np.stack(pixels[start : start + 64]))
        out += [v.astype(np.float16) for v in vectors]
    return out, time.perf_counter() - started


def scores(items: list[Item], survivors: set[str], dropped_for: dict[str, str]) -> dict:
    group = {i.key: i.group for i in items}
    originals = {i.group: i.key for i in items if i.transform == "original"}
    alive = {group[k] for k in survivors}
    members: dict[int, int] = defaultdict(int)
    for key in survivors:
        members[group[key]] += 1
    per_kind: dict[str, list[bool]] = defaultdict(list)
    injected = set()
    for item in items:
        if item.transform in TRANSFORMS:
            both = originals[item.group] in survivors and item.key in survivors
            per_kind[item.transform].append(item.group in alive and not both)
            injected.add(item.group)
    found = [hit for hits in per_kind.values() for hit in hits]
    wrong = sum(group[k] != group[v] for k, v in dropped_for.items())
    return {
        "recall": round(float(np.mean(found)), 4),
        "missed": len(found) - int(np.sum(found)),
        "groups_collapsed": round(sum(members[g] == 1 for g in injected) / len(injected), 4),
        "distinct_kept": round(len(alive) / len(originals), 4),
        "distinct_lost": len(originals) - len(alive),
        "wrong_drops": wrong,
        "per_transform": {k: round(float(np.mean(v)), 4) for k, v in sorted(per_kind.items())},
    }


def ours(items: list[Item], table: pa.Table, options: dict) -> tuple[dict, float]:
    stage = build_stage({"name": "near_dedupe", **options})
    started = time.perf_counter()
    decided = stage.decide(table)
    seconds = time.perf_counter() - started
    survivors = {i.key for i in items} - set(decided)
    return scores(items, survivors, {k: kept for k, (_, kept) in decided.items()}), seconds


def components(items: list[Item], table: pa.Table, radius: int) -> dict:
    """The pre-issue-22 grouping: connected components of pHash pairs within the radius."""
    hashes = table["phash"].to_numpy().astype(np.uint64)
    a, b = close_pairs(hashes, plan_tables(len(hashes), radius, 0.99), LocalRunner())
    graph = coo_matrix((np.ones(len(a)), (a, b)), shape=(len(hashes), len(hashes)))
    labels = connected_components(graph, directed=False)[1]
    keys = table["__key__"].to_pylist()
    decided = group_decisions(keys, keepers(labels, priority_rank(table)), "duplicate_near")
    survivors = set(keys) - set(decided)
    return scores(items, survivors, {k: kept for k, (_, kept) in decided.items()})


def ensure_imagededup() -> Path:
    """imagededup in its own venv; torch and the rest come from this venv (a .pth file), so
    nothing is downloaded twice and the project's venv is left as it is."""
    python = IDD_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(IDD_VENV)], check=True)
        site = next((IDD_VENV / "lib").glob("python*/site-packages"))
        (site / "zz_project_venv.pth").write_text(str(MAIN_SITE / "site-packages") + "\n")
        pip = [str(IDD_VENV / "bin" / "pip"), "install", "-q", "imagededup==0.3.3.post2"]
        subprocess.run(pip, check=True)
    return python


IDD_SCRIPT = """
import json, sys, time
from imagededup.methods import CNN, PHash
folder, thresholds = sys.argv[1], [int(t) for t in sys.argv[2].split(",")]
out = {}
started = time.perf_counter()
phasher = PHash(verbose=False)
encodings = phasher.encode_images(image_dir=folder)
out["phash_encode_s"] = time.perf_counter() - started
for t in thresholds:
    started = time.perf_counter()
    removed = phasher.find_duplicates_to_remove(encoding_map=encodings, max_distance_threshold=t)
    out[f"phash_{t}"] = {"removed": removed, "search_s": time.perf_counter() - started}
try:
    started = time.perf_counter()
    cnn = CNN(verbose=False)
    encodings = cnn.encode_images(image_dir=folder)
    removed = cnn.find_duplicates_to_remove(encoding_map=encodings)
    out["cnn"] = {"removed": removed, "search_s": time.perf_counter() - started}
except Exception as error:  # no weights offline: say so
    out["cnn_error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
print(json.dumps(out))
"""


def imagededup_rows(items: list[Item], thresholds: list[int]) -> list[dict]:
    python = ensure_imagededup()
    with tempfile.TemporaryDirectory(prefix="dedupe-bench-") as tmp:
        for item in items:
            ext = "png" if item.data[:4] == b"\x89PNG" else "jpg"
            (Path(tmp) / f"{item.key}.{ext}").write_bytes(item.data)
        arg = ",".join(map(str, thresholds))
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        result = subprocess.run(
            [str(python), "-c", IDD_SCRIPT, tmp, arg], capture_output=True, text=True, env=env
        )
    if result.returncode != 0:
        return [{"tool": "imagededup", "error": result.stderr.strip().splitlines()[-1]}]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    rows = []
    everyone = {i.key for i in items}
    for name in [f"phash_{t}" for t in thresholds] + ["cnn"]:
        if name not in out:
            continue
        removed = {Path(f).stem for f in out[name]["removed"]}
        row = {"tool": f"imagededup {name.replace('_', ' threshold ')}"}
        row |= {"encode_s": round(out["phash_encode_s"], 2)} if name != "cnn" else {}
        row |= {"search_s": round(out[name]["search_s"], 2)}
        rows.append(row | scores(items, everyone - removed, {}))
    if "cnn_error" in out:
        rows.append({"tool": "imagededup cnn", "not_run": out["cnn_error"]})
    return rows


def run_set(name: str, items: list[Item], args: argparse.Namespace) -> None:
    originals = sum(i.transform == "original" for i in items)
    injected = sum(i.transform in TRANSFORMS for i in items)
    table, hash_s = signature_table(items)
    print(
        json.dumps(
            {
                "set": name,
                "items": len(items),
                "distinct": originals,
                "injected": injected,
                "signals_s_2_processes": round(hash_s, 1),
            }
        )
    )
    for label, options in (
        ("near_dedupe defaults", {}),
        ("radius 8, verify none", {"radius": 8, "verify": "none"}),
    ):
        result, seconds = ours(items, table, options)
        print(json.dumps({"tool": label, "decide_s": round(seconds, 2), **result}))
    print(
        json.dumps(
            {"tool": "radius 8, connected components (before)", **components(items, table, 8)}
        )
    )
    if args.embeddings:
        vectors, embed_s = embeddings(items)
        with_emb = table.append_column("embedding", pa.array(vectors, pa.list_(pa.float16())))
        result, seconds = ours(items, with_emb, {})
        row = {"tool": "near_dedupe defaults, clip embeddings", "embed_s": round(embed_s, 1)}
        print(json.dumps({**row, "decide_s": round(seconds, 2), **result}))
    if args.imagededup:
        for row in imagededup_rows(items, args.thresholds):
            print(json.dumps(row))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sets", nargs="+", default=["views", "tiles"], choices=["views", "tiles"])
    parser.add_argument("--count", type=int, default=1500, help="distinct views")
    parser.add_argument("--thresholds", type=int, nargs="+", default=[4, 8, 10, 12])
    parser.add_argument("--no-imagededup", dest="imagededup", action="store_false")
    parser.add_argument("--no-embeddings", dest="embeddings", action="store_false")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(json.dumps({"machine": f"{platform.machine()}, {os.cpu_count()} CPUs"}))
    for name in args.sets:
        items = (
            make_views(args.count, seed=args.seed)
            if name == "views"
            else make_items(2, seed=args.seed)
        )
        run_set(name, items, args)


if __name__ == "__main__":
    main()

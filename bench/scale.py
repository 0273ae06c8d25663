"""Bench (issue 19): phases B and C of a build on synthetic signatures, no media.

Writes N synthetic signature rows as phase A would (`_work/signatures/part-*.parquet`, 1,000
rows a partition as configs/laion_cluster.yaml plans them) with LAION-like columns: key, url,
source, drop reason (8% dropped in phase A), sha256 (5% exact copies of another row anywhere in
the set), phash (2% more: one bit off another row's), clip_score, width, height, bytes, offset.
Then runs, in a fresh process per size, what a build runs after phase A: the footer scan and
group plan, the decisions (repeated keys, exact_dedupe, clip_score keep_top_fraction 0.3),
the kept tables with the stats shares, the shard plan, and the published signatures (not
above --no-publish-above). Measured:
wall time per phase, the driver's peak RSS (getrusage), the whole tree's peak PSS (driver and
every Ray process), and bytes read by the tree (/proc rchar).

    .venv/bin/python bench/scale.py --sizes 1000000 10000000 100000000 [--no-publish-above N]
    .venv/bin/python bench/scale.py --check 1000000   # decisions equal the whole-table oracle
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from multiprocessing import Pool
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from memwatch import PeakMemory, tree  # noqa: E402
from mmcurate.core.atomic import write_parquet  # noqa: E402

ROWS_PER_PART = 1000
STAGES = [
    {"name": "download"},  # phase A's drops are its
    {"name": "exact_dedupe"},
    {"name": "clip_score", "model": "ViT-B-32", "pretrained": None, "keep_top_fraction": 0.3},
]
CHECK_STAGES = [
    {"name": "download"},  # phase A's drops are its
    {"name": "exact_dedupe"},
    {"name": "near_dedupe", "radius": 4, "candidate_radius": 0, "verify": "none"},
    {"name": "clip_score", "model": "ViT-B-32", "pretrained": None, "keep_top_fraction": 0.3},
]
HEX = np.array([f"{i:02x}".encode() for i in range(256)], "S2")


def mix(x: np.ndarray) -> np.ndarray:
    """splitmix64: a row id to 64 random-looking bits, the same on every run."""
    z = (x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def sha_hex(ids: np.ndarray) -> pa.Array:
    words = np.stack([mix(ids * np.uint64(4) + np.uint64(k)) for k in range(4)], axis=1)
    text = HEX[words.view(np.uint8).reshape(len(ids), 32)].view("S64").ravel()
    return pa.array(text, pa.binary()).cast(pa.string())


def unless(dropped: np.ndarray, values: pa.Array) -> pa.Array:
    """Null where phase A dropped the row (its later stages never ran)."""
    return pc.if_else(pa.array(dropped), pa.scalar(None, values.type), values)


def near_hash(ids: np.ndarray, source: np.ndarray, r: np.ndarray, n: int) -> np.ndarray:
    """pHash of the row's picture; 2% of rows are a near copy (one bit off) of another row."""
    near = (r >> np.uint64(24)) % np.uint64(100) < np.uint64(2)
    other = mix(ids + np.uint64(1 << 41)) % np.uint64(n)
    flip = np.uint64(1) << (r >> np.uint64(58))
    return np.where(near, mix(other + np.uint64(7)) ^ flip, mix(source + np.uint64(7)))


def partition(part: int, n: int) -> pa.Table:
    """One partition's signature rows (global row ids part*1000 ...)."""
    ids = np.arange(part * ROWS_PER_PART, min(n, (part + 1) * ROWS_PER_PART), dtype=np.uint64)
    r = mix(ids + np.uint64(1 << 40))
    copy = (r % np.uint64(100)) < np.uint64(5)
    source = np.where(copy, mix(ids) % np.uint64(n), ids)  # an exact copy of a random row
    dropped = (r >> np.uint64(8)) % np.uint64(100) < np.uint64(8)
    size = 8000 + (r >> np.uint64(16)) % np.uint64(30000)
    score = ((r >> np.uint64(40)) % np.uint64(1 << 20)).astype(np.float32) / (1 << 20) * 0.3
    ids_text = [f"{i:09d}" for i in ids.tolist()]
    return pa.table(
        {
            "__key__": ids_text,
            "__part__": pa.array(np.full(len(ids), part, np.int64)),
            "__index__": pa.array(np.arange(len(ids), dtype=np.int64)),
            "__source__": pa.array([f"laion/part-{part // 1000:05d}.parquet"] * len(ids)),
            "__drop__": pa.array(np.where(dropped, "download_error", None), pa.string()),
            "__drop_stage__": pa.array(np.where(dropped, "download", None), pa.string()),
            "__bytes__": pa.array(np.where(dropped, 0, size).astype(np.int64)),
            "__offset__": pa.array(np.cumsum(np.where(dropped, 0, size)).astype(np.int64)),
            "url": [f"http://127.0.0.1/laion/{i}.jpg" for i in ids_text],
            "sha256": unless(dropped, sha_hex(source)),
            "phash": unless(dropped, pa.array(near_hash(ids, source, r, n), pa.uint64())),
            "clip_score": unless(dropped, pa.array(score, pa.float32())),
            "width": pa.array((256 + r % np.uint64(500)).astype(np.int64)),
            "height": pa.array((256 + (r >> np.uint64(9)) % np.uint64(500)).astype(np.int64)),
        }
    )


def write_part(args: tuple[str, int, int]) -> None:
    work, part, n = args
    write_parquet(partition(part, n), f"{work}/signatures/part-{part:06d}.parquet", {})


def generate(work: Path, n: int) -> int:
    parts = -(-n // ROWS_PER_PART)
    with Pool(2) as pool:
        pool.map(write_part, [(str(work), p, n) for p in range(parts)], chunksize=64)
    return parts


def tree_rchar() -> int:
    """Bytes read (read(2) and friends) by this process and every process it started."""
    total = 0
    for pid in tree(os.getpid()):
        try:
            for line in Path(f"/proc/{pid}/io").read_text().splitlines():
                if line.startswith("rchar:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


def phases(work: Path, stages_cfg: list[dict], publish_output: bool) -> dict:
    """What run_build does after phase A, timed phase by phase (this process is the driver)."""
    import ray
    from mmcurate.core.mapreduce import RayRunner
    from mmcurate.pipeline.decide.phase_b import decide
    from mmcurate.pipeline.output.groups import Groups, plan_groups, scan_partitions
    from mmcurate.pipeline.output.layout import kept_starts, kept_tables, plan_layout
    from mmcurate.pipeline.output.publish import Publication, publish
    from mmcurate.pipeline.output.stats import build_stats, merge_counts, timing_columns
    from mmcurate.pipeline.runtime.loopback import loopback_only_env
    from mmcurate.stages.registry import build_stages

    os.environ.update(loopback_only_env())
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    stages, runner, seconds = build_stages(stages_cfg), RayRunner(), {}
    read_before = tree_rchar()
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        seconds[name] = round(time.perf_counter() - clock, 2)
        clock = time.perf_counter()

    numbers = sorted(int(p.stem.split("-")[1]) for p in (work / "signatures").glob("part-*"))
    rows, schema = scan_partitions(str(work), numbers, {}, runner)
    members = plan_groups(numbers, rows)
    row_of = dict(zip(numbers, rows, strict=True))
    groups = Groups(str(work), {}, members, [sum(row_of[p] for p in m) for m in members])
    lap("plan")
    final = decide(groups, stages, runner)
    lap("decide")
    found = kept_tables(groups, final, timing_columns(stages), runner)
    kept = [share["kept"] for share in found]
    specs = plan_layout(groups, kept, 10_000, 1 << 30)
    stats = build_stats(merge_counts([share["counts"] for share in found]), stages)
    lap("kept_stats_layout")
    if publish_output:
        plan = Publication(
            str(work / "out"), final, schema, kept_starts(kept), [s.start for s in specs]
        )
        publish(groups, plan, runner)
        lap("publish")
    read = tree_rchar() - read_before
    ray.shutdown()
    return {
        "partitions": len(numbers),
        "groups": groups.count,
        "shards": len(specs),
        "kept": stats["samples_out"],
        "stats": {s["name"]: s["dropped"] for s in stats["stages"]},
        "seconds": seconds,
        "bytes_read": read,
        "final": final,
    }


def run_one(n: int, work: Path, publish_output: bool, keep: bool) -> dict:
    """Generate (not timed; kept signatures of the same size are reused with `keep`), then the
    phases, in this process; prints one JSON line."""
    parts = -(-n // ROWS_PER_PART)
    reuse = keep and len(list((work / "signatures").glob("part-*.parquet"))) == parts
    for scratch in ["decide", "out"] if reuse else []:
        shutil.rmtree(work / scratch, ignore_errors=True)
    if not reuse and work.exists():
        shutil.rmtree(work)
    started = time.perf_counter()
    if not reuse:
        generate(work, n)
    generated = time.perf_counter() - started
    input_bytes = sum(p.stat().st_size for p in (work / "signatures").glob("*.parquet"))
    with PeakMemory() as peak:
        started = time.perf_counter()
        result = phases(work, STAGES, publish_output)
        total = time.perf_counter() - started
    driver = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result |= {
        "n": n,
        "generate_s": round(generated, 1),
        "input_bytes": input_bytes,
        "phases_s": round(total, 1),
        "driver_peak_rss": driver,
        "tree_peak_pss": peak.bytes,
        "parts": parts,
    }
    if not keep:
        shutil.rmtree(work)
    return result


def check(n: int, work: Path) -> None:
    """At n rows: the partitioned decisions equal the whole-table oracle
    (tests/builds/test_decide.py)."""
    import pyarrow.parquet as pq
    from mmcurate.core.mapreduce import LocalRunner
    from mmcurate.pipeline.decide.phase_b import decide
    from mmcurate.pipeline.output.groups import Groups, plan_groups, read_fate, scan_partitions
    from mmcurate.stages.registry import build_stages

    from tests.kit_decide import oracle  # the phase B before issue 19, kept as the oracle

    if work.exists():
        shutil.rmtree(work)
    generate(work, n)
    table = pq.read_table(work / "signatures")
    started = time.perf_counter()
    expected = oracle(table, build_stages(CHECK_STAGES))
    oracle_s = time.perf_counter() - started
    numbers = sorted(int(p.stem.split("-")[1]) for p in (work / "signatures").glob("part-*"))
    rows, _ = scan_partitions(str(work), numbers, {}, LocalRunner())
    members = plan_groups(numbers, rows, 100_000)  # ten groups: decisions cross groups
    row_of = dict(zip(numbers, rows, strict=True))
    groups = Groups(str(work), {}, members, [sum(row_of[p] for p in m) for m in members])
    started = time.perf_counter()
    final = decide(groups, build_stages(CHECK_STAGES), LocalRunner())
    decide_s = time.perf_counter() - started
    fates = pa.concat_tables(read_fate(groups, final, g) for g in range(groups.count))
    names = ("__part__", "__index__", "__drop__", "__drop_stage__", "duplicate_of")
    columns = [fates[c].to_pylist() for c in names]
    got = {(p, i): (d, s, k) for p, i, d, s, k in zip(*columns, strict=True)}
    reasons: dict = {}
    for d, _, _ in expected.values():
        reasons[d] = reasons.get(d, 0) + 1
    print(
        json.dumps(
            {
                "n": n,
                "equal": got == expected,
                "rows": len(got),
                "reasons": reasons,
                "oracle_s": round(oracle_s, 1),
                "partitioned_s": round(decide_s, 1),
            }
        )
    )
    shutil.rmtree(work)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[1_000_000, 10_000_000])
    parser.add_argument("--no-publish-above", type=int, default=10**12)
    parser.add_argument("--work", type=Path, default=Path("/tmp/mmcurate-scale"))
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--keep", action="store_true", help="keep (and reuse) the signatures")
    parser.add_argument("--check", type=int, help="compare with the oracle at this size")
    args = parser.parse_args()
    if args.check:
        check(args.check, args.work)
        return
    if args.one:
        publish_output = args.one <= args.no_publish_above
        print(json.dumps(run_one(args.one, args.work, publish_output, args.keep)))
        return
    print(f"# {platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()}")
    for n in args.sizes:
        command = [sys.executable, __file__, "--one", str(n), "--work", str(args.work)]
        command += ["--no-publish-above", str(args.no_publish_above)]
        command += ["--keep"] if args.keep else []
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        print(out.strip().splitlines()[-1], f"# load after {os.getloadavg()}", flush=True)


if __name__ == "__main__":
    main()

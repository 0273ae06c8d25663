"""Storage peak of a deduplicating build (issue 37): bytes on the store through the build,
against the final output. A build of N distinct images plus copies (exact_dedupe drops them;
copies sit in other partitions), on local disk and on SeaweedFS S3; a thread lists the output
folder over and over and keeps the largest total (a lower bound of the true peak). Each
round builds with content-addressed payloads (pipeline/output/media_index.py, `on`) and with every
payload stored (`off`, the previous code path), interleaved; `cost` times builds without
any copies, on and off interleaved: what the hashing costs a build that has nothing to save.

    .venv/bin/python bench/storage_peak.py --n 700 --copies 300

Run it against another tree (e.g. `git archive HEAD | tar -x -C /tmp/old`) with
PYTHONPATH=/tmp/old (copy tests/storage_probe.py there) for a before/after pair.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parents[1]))  # last: a PYTHONPATH tree wins

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def config(source: Path, out: str, storage_options: dict, per_task: int, per_shard: int) -> dict:
    return {
        "source": {"kind": "images", "path": str(source), "files_per_task": per_task},
        "stages": [{"name": "exact_dedupe"}],
        "output": {"path": out, "shard_max_samples": per_shard},
        "storage_options": storage_options,
        "ray": {"runtime": "local", "num_cpus": 2},
    }


def measure(cfg: dict, url: str, storage_options: dict, on: bool) -> dict:
    from mmcurate.pipeline.build import run_build
    from mmcurate.pipeline.config import BuildConfig

    from tests.storage_probe import PeakSampler, store_bytes, window_bytes

    cfg = cfg | {"output": cfg["output"] | {"store_copies_once": on}}
    sizes: dict[str, int] = {}
    total = store_bytes(url, storage_options, sizes)
    started = time.perf_counter()
    with PeakSampler(total, interval_s=0.01) as sampler:
        manifest = run_build(BuildConfig.model_validate(cfg), False)
    seconds = time.perf_counter() - started
    final = total()
    shards = sum(s["bytes"] for s in manifest["shards"])
    window = window_bytes(sizes, cfg["ray"]["num_cpus"])
    return {
        "peak_bytes": sampler.peak,
        "final_bytes": final,
        "shard_bytes": shards,
        "peak_over_final": round(sampler.peak / final, 3),
        "peak_over_shards": round(sampler.peak / shards, 3),
        "window_bytes": window,  # per worker: a candidate tar still read, and a shard
        "within_1.05x_final_plus_window": sampler.peak <= 1.05 * final + window,
        "samples": manifest["samples"],
        "polls": sampler.samples,
        "seconds": round(seconds, 2),
        "sha256": [s["sha256"] for s in manifest["shards"]],
    }


def rounds(make: Any, rounds: int) -> dict[str, list[dict]]:
    """`make(on, index)` for on, off, on, off, ...: interleaved, so load shifts hit both."""
    found: dict[str, list[dict]] = {"on": [], "off": []}
    for index in range(rounds):
        for on in (True, False):
            found["on" if on else "off"].append(make(on, f"{index}-{int(on)}"))
    return found


def summary(found: dict[str, list[dict]]) -> dict:
    same = all(r["sha256"] == found["off"][0]["sha256"] for rs in found.values() for r in rs)
    out = {"identical_shards": same}
    for mode, results in found.items():
        out[mode] = [{k: v for k, v in r.items() if k != "sha256"} for r in results]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=700)
    parser.add_argument("--copies", type=int, default=300)
    parser.add_argument("--per-task", type=int, default=50)
    parser.add_argument("--per-shard", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    from mmcurate.pipeline.demo_data import make_demo_images
    from mmcurate.pipeline.runtime.objectstore import LocalS3

    with tempfile.TemporaryDirectory() as tmp:
        shape = (args.per_task, args.per_shard)
        folder, distinct = Path(tmp) / "images", Path(tmp) / "distinct"
        make_demo_images(folder, n=args.n, exact_copies=args.copies, broken=0, seed=3)
        make_demo_images(distinct, n=args.n + args.copies, exact_copies=0, broken=0, seed=3)

        def local(on: bool, name: str, source: Path = folder) -> dict:
            out = str(Path(tmp) / f"out-{source.name}-{name}")
            return measure(config(source, out, {}, *shape), out, {}, on)

        result = {"local": summary(rounds(local, args.rounds))}
        cost = rounds(lambda on, name: local(on, name, distinct), args.rounds)
        result["cost"] = summary(cost) | {"seconds_on_over_off": seconds_ratio(cost)}
        with LocalS3(Path(tmp) / "weed") as s3:
            s3.make_bucket("peak")
            options = s3.storage_options

            def remote(on: bool, name: str) -> dict:
                url = f"s3://peak/out-{name}"
                return measure(config(folder, url, options, *shape), url, options, on)

            result["s3"] = summary(rounds(remote, args.rounds))
    print(json.dumps(result, indent=2))


def seconds_ratio(found: dict[str, list[dict]]) -> float:
    on = sum(r["seconds"] for r in found["on"])
    return round(on / sum(r["seconds"] for r in found["off"]), 3)


if __name__ == "__main__":
    main()

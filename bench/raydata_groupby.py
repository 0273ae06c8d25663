"""Bench: one Hamming table's group-by through Ray Data against mmcurate's table task.

The same work both ways on n random 64-bit hashes: group by the masked bits of one exact table
(radius 4) and list the pairs within the radius. Ray Data: `from_numpy` -> `groupby(key)` ->
`map_groups` (verifies each group's pairs), counted. mmcurate: one table's pairs
(`close_pairs_in_table`) as one Ray task.

    .venv/bin/python bench/raydata_groupby.py [--n 1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

from mmcurate.pipeline.runtime.loopback import loopback_only_env

# Before Ray is imported: Ray on 127.0.0.1 and nothing sent off loopback (objectstore.py).
os.environ.update(loopback_only_env())

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import ray  # noqa: E402
from mmcurate.core.mapreduce import RayRunner  # noqa: E402
from mmcurate.stages.lib.hamming import close_pairs_in_table  # noqa: E402
from mmcurate.stages.lib.hamming_plan import exact_masks  # noqa: E402


def group_pairs(group: dict) -> dict:
    hashes, ids = group["hash"], group["id"]
    a, b = np.triu_indices(len(hashes), 1)
    close = np.bitwise_count(hashes[a] ^ hashes[b]) <= 4
    return {"a": ids[a[close]], "b": ids[b[close]]}


def table_pairs(hashes: np.ndarray, mask: int, radius: int) -> tuple[np.ndarray, np.ndarray]:
    """One table's verified pairs, as a Ray task body."""
    return close_pairs_in_table(hashes, mask, radius)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=1_000_000)
    args = parser.parse_args()
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, logging_level="ERROR")
    rng = np.random.default_rng(0)
    hashes = rng.integers(0, 2**64 - 1, size=args.n, dtype=np.uint64, endpoint=True)
    # planted pairs at distance 2, in bits 2 and 3 (outside this table's mask)
    hashes[1::100] = hashes[::100][: len(hashes[1::100])] ^ np.uint64(12)
    mask = exact_masks(4, 6)[0]
    started = time.perf_counter()
    ours = RayRunner().run(table_pairs, [(ray.put(hashes), mask, 4)])[0]
    ours_s = time.perf_counter() - started
    started = time.perf_counter()
    keys = hashes & np.uint64(mask)
    table = pa.table({"hash": hashes, "key": keys, "id": np.arange(args.n)})
    ds = ray.data.from_arrow(table)
    theirs = ds.groupby("key").map_groups(group_pairs, batch_format="numpy").count()
    ray_data_s = time.perf_counter() - started
    print(json.dumps({"machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "n": args.n}))
    print(
        json.dumps(
            {
                "mmcurate_table_task_s": round(ours_s, 2),
                "ray_data_groupby_s": round(ray_data_s, 2),
                "pairs": [len(ours[0]), theirs],
                "ratio": round(ray_data_s / ours_s, 1),
            }
        )
    )
    ray.shutdown()


if __name__ == "__main__":
    main()

"""buckets.json: the buckets of a build that ran `aspect_buckets` or `video_buckets`, counted over
the samples it kept (after every global decision), for trainers that plan batches per bucket.

`{"format": "mmcurate-buckets/1", "stage", "algorithm", "parameters", "buckets": ["WxH", ...],
"counts": {"WxH": n, ...} (every bucket of the list, zeros too), "samples", "mean_aspect_error",
"max_aspect_error", "mean_crop_share"}`. Counted per signature group in tasks (each returns a
few numbers per bucket), so the driver never holds the rows. With such a stage listed twice, the
last one's list and parameters are recorded (a bucket only the other lists is counted too).
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
from mmcurate.core.atomic import write_bytes_atomic
from mmcurate.core.mapreduce import Runner
from mmcurate.core.storage import filesystem, join
from mmcurate.pipeline.config import BuildConfig
from mmcurate.pipeline.output.names import signatures_file

BUCKETS_FILE = "buckets.json"
BUCKETS_FORMAT = "mmcurate-buckets/1"
STAGE = "aspect_buckets"
STAGES = (STAGE, "video_buckets")  # each writes `bucket`; its options give bucket_list, describe
COLUMNS = ("drop_reason", "bucket", "aspect_error", "crop_share")


def group_sums(output: str, storage_options: dict, group: int) -> dict[str, list[float]]:
    """Task body: bucket -> [kept samples, sum of aspect errors, max error, sum of crop shares]
    in one published signatures file."""
    fs, root = filesystem(output, storage_options)
    with fs.open(join(root, signatures_file(group)), "rb") as f:
        parquet = pq.ParquetFile(f)
        names = [c for c in COLUMNS if c in parquet.schema_arrow.names]
        if "bucket" not in names:
            return {}
        table = parquet.read(columns=names)
    kept = table.filter(pc.and_(pc.is_null(table["drop_reason"]), pc.is_valid(table["bucket"])))
    sums: dict[str, list[float]] = {}
    for row in kept.to_pylist():
        error, share = row.get("aspect_error") or 0.0, row.get("crop_share") or 0.0
        entry = sums.setdefault(row["bucket"], [0, 0.0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += error
        entry[2] = max(entry[2], error)
        entry[3] += share
    return sums


def buckets_document(stage: Any, sums: list[dict[str, list[float]]]) -> dict[str, Any]:
    """The file's content from the stage (its list and parameters) and the groups' sums."""
    from mmcurate.stages.lib.buckets import bucket_name

    names = [bucket_name(b) for b in stage.options.bucket_list()]
    return {
        "format": BUCKETS_FORMAT,
        "stage": stage.label,
        **stage.options.describe(),
        "buckets": names,
        **bucket_figures(names, sums),
    }


def bucket_figures(names: list[str], sums: list[dict[str, list[float]]]) -> dict[str, Any]:
    """counts (every bucket of `names`, zeros too, then any other bucket seen), samples and the
    aspect-error and crop figures, from the groups' sums (`group_sums`)."""
    total: dict[str, list[float]] = {name: [0, 0.0, 0.0, 0.0] for name in names}
    for part in sums:
        for name, (count, errors, worst, shares) in part.items():
            entry = total.setdefault(name, [0, 0.0, 0.0, 0.0])  # a bucket not in the list: kept
            entry[0] += count
            entry[1] += errors
            entry[2] = max(entry[2], worst)
            entry[3] += shares
    samples = int(sum(e[0] for e in total.values()))

    def mean(at: int) -> float | None:
        return round(sum(e[at] for e in total.values()) / samples, 6) if samples else None

    return {
        "counts": {name: int(entry[0]) for name, entry in total.items()},
        "samples": samples,
        "mean_aspect_error": mean(1),
        "max_aspect_error": round(max(e[2] for e in total.values()), 6) if samples else None,
        "mean_crop_share": mean(3),
    }


def write_buckets_file(cfg: BuildConfig, group_count: int, runner: Runner) -> None:
    """buckets.json beside the shards when an aspect_buckets or video_buckets stage ran (else
    nothing); after the published signatures, whose fates it counts."""
    from mmcurate.stages.registry import build_stages

    stages = [s for s in build_stages(cfg.stages) if s.name in STAGES]
    if not stages:
        return
    calls = [(cfg.output.path, cfg.storage_options, g) for g in range(group_count)]
    document = buckets_document(stages[-1], runner.run(group_sums, calls))
    fs, out = filesystem(cfg.output.path, cfg.storage_options)
    write_bytes_atomic(fs, join(out, BUCKETS_FILE), json.dumps(document, indent=2).encode())

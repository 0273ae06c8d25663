"""Bench: writing shards to S3 (SeaweedFS on loopback) against raw s3fs puts of the same bytes.

mmcurate's shard phase (phase C: byte spans copied out of the candidate tars, which live under
the output on the same store, then one PUT per shard plus its metadata parquet and marker)
against `s3fs.put_file` of the identical finished shard files from local disk, with the same
number of parallel writers (one per CPU). Both measured in one run.

    .venv/bin/python bench/storage.py [--samples 4000] [--kb 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mmcurate.pipeline.runtime.loopback import loopback_only_env
from mmcurate.pipeline.runtime.objectstore import LocalS3

# Before Ray is imported: Ray on 127.0.0.1 and nothing sent off loopback (objectstore.py).
os.environ.update(loopback_only_env())

import numpy as np  # noqa: E402
import ray  # noqa: E402
from mmcurate.core.tar_writer import write_tar
from mmcurate.pipeline.build import run_build  # noqa: E402
from mmcurate.pipeline.config import BuildConfig  # noqa: E402


def make_input(folder: Path, samples: int, kb: int) -> None:
    """Incompressible `.jpg` payloads (the writer never decodes) in 8 input tars."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    per = samples // 8
    for t in range(8):
        rows = [
            {"__key__": f"s{t:02d}{i:06d}", "jpg": rng.bytes(kb * 1024), "txt": f"sample {t} {i}"}
            for i in range(per)
        ]
        with open(folder / f"in-{t:02d}.tar", "wb") as out:
            write_tar(rows, out)


def raw_puts(store: LocalS3, files: list[Path], bucket: str) -> float:
    fs = store.filesystem()
    started = time.perf_counter()
    with ThreadPoolExecutor(os.cpu_count()) as pool:
        list(pool.map(lambda f: fs.put_file(str(f), f"{bucket}/raw/{f.name}"), files))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=4000)
    parser.add_argument("--kb", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="mmcurate-storage-"))
    make_input(root / "in", args.samples, args.kb)
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, logging_level="WARNING")
    results = []
    with LocalS3(root / "s3") as store:
        for r in range(args.rounds):
            bucket = f"bench{r}"
            store.make_bucket(bucket)
            cfg = BuildConfig.model_validate(
                {
                    "source": {"kind": "webdataset", "path": str(root / "in" / "*.tar")},
                    "output": {"path": f"s3://{bucket}/mm", "shard_max_samples": 500},
                    "storage_options": store.storage_options,
                }
            )
            run_build(cfg, progress=False)
            fs = store.filesystem()
            stats = json.loads(fs.cat(f"{bucket}/mm/stats.json"))
            shard_s = stats["phases"]["shards"]
            local = root / f"shards{r}"
            local.mkdir()
            for path in fs.glob(f"{bucket}/mm/shard-*.tar"):
                fs.get_file(path, str(local / path.rpartition("/")[2]))
            files = sorted(local.glob("*.tar"))
            size = sum(f.stat().st_size for f in files)
            raw_s = raw_puts(store, files, bucket)
            results.append(
                {
                    "bytes_mb": round(size / 1e6, 1),
                    "shards": len(files),
                    "raw_s3fs_put_mb_s": round(size / 1e6 / raw_s, 1),
                    "mmcurate_shard_phase_mb_s": round(size / 1e6 / shard_s, 1),
                    "ratio": round(raw_s / shard_s, 3),
                }
            )
            print(json.dumps(results[-1]), flush=True)
    ray.shutdown()
    print(
        json.dumps(
            {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "rounds": results}, indent=2
        )
    )


if __name__ == "__main__":
    main()

"""Time to first batch from a cold cache on S3 (SeaweedFS on 127.0.0.1): mmcurate's loader
(manifest + WebDataset shards, node-local shard cache) and MosaicML Streaming (MDS shards,
its local cache), each from an empty cache, then the same throughput measure as run_all.py.

    .venv/bin/python bench/loaders/s3_first_batch.py --shards DIR --work DIR

`--work` must hold the MDS conversion run_all.py made (`WORK/streaming/mds`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]

import common  # noqa: E402
from mmcurate.pipeline.runtime.objectstore import LocalS3  # noqa: E402


def upload(store: LocalS3, folder: Path, prefix: str) -> None:
    fs = store.filesystem()
    for path in sorted(folder.iterdir()):
        if path.is_file():
            fs.put_file(str(path), f"{prefix}/{path.name}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shards", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--batches", type=int, default=30)
    args = parser.parse_args()
    runners = {
        "mmcurate": (HERE.parents[1] / ".venv", "run_mmcurate.py", "s3://bench/wds"),
        "streaming": (common.VENV, "run_streaming.py", "s3://bench/mds"),
    }
    with tempfile.TemporaryDirectory() as tmp, LocalS3(Path(tmp) / "s3") as store:
        store.make_bucket("bench")
        upload(store, Path(args.shards), "bench/wds")
        upload(store, Path(args.work) / "streaming" / "mds", "bench/mds")
        env = os.environ | store.env()
        for venv, script, remote in runners.values():
            command = [str(venv / "bin" / "python"), str(HERE / script), "--shards", args.shards]
            command += ["--work", tmp, "--remote", remote, "--endpoint", store.endpoint_url]
            command += ["--workers", "2", "--batch-size", "64", "--batches", str(args.batches)]
            result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
            lines = [x for x in result.stdout.splitlines() if x.startswith("{")]
            out = json.loads(lines[-1]) if lines else {"error": result.stderr[-1500:]}
            print(json.dumps({"remote": remote} | out), flush=True)


if __name__ == "__main__":
    main()

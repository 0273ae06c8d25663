"""Check: a 20,000-sample build to S3, and the same build killed mid-way and resumed, give
manifests equal in everything but the timestamp (issue 4).

    .venv/bin/python bench/resume_check.py [--samples 20000]

The killed run is the `mmcurate build` command in its own process group (its local Ray
included), SIGKILLed once a quarter of the partitions are done; the same command then resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml
from mmcurate.core.tar_writer import write_tar
from mmcurate.pipeline.runtime.loopback import loopback_only_env
from mmcurate.pipeline.runtime.objectstore import LocalS3

REPO = Path(__file__).resolve().parents[1]


def make_input(folder: Path, samples: int, per_tar: int = 500) -> int:
    """Tars of small random `.jpg` payloads, with exact copies sprinkled in (for dedupe)."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    for t in range(samples // per_tar):
        rows = []
        for i in range(per_tar):
            payload = rng.bytes(2048) if i % 50 else b"copy" * 512  # 1 in 50 is a duplicate
            rows.append({"__key__": f"t{t:04d}i{i:05d}", "jpg": payload, "txt": f"{t} {i}"})
        with open(folder / f"in-{t:04d}.tar", "wb") as out:
            write_tar(rows, out)
    return samples // per_tar


def build(config: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [str(REPO / ".venv" / "bin" / "mmcurate"), "build", str(config), "--no-progress"],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=20000)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="mmcurate-resume-"))
    parts = make_input(root / "in", args.samples)
    env = {**os.environ, **loopback_only_env()}  # Ray on 127.0.0.1, nothing off loopback
    with LocalS3(root / "s3") as store:
        store.make_bucket("resume")
        fs = store.filesystem()
        config = root / "build.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "source": {"kind": "webdataset", "path": str(root / "in" / "*.tar")},
                    "stages": [{"name": "exact_dedupe"}],
                    "output": {"path": "s3://resume/out", "shard_max_samples": 3000},
                    "storage_options": store.storage_options,
                }
            )
        )
        started = time.perf_counter()
        assert build(config, env).wait() == 0
        clean_s = time.perf_counter() - started
        clean = json.loads(fs.cat("resume/out/manifest.json"))
        fs.rm("resume/out", recursive=True)  # same config, same path, from scratch
        killed = build(config, env)
        while len(fs.glob("resume/out/_work/signatures/part-*.parquet")) < parts // 4:
            fs.invalidate_cache()
            time.sleep(0.1)
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait()
        done_at_kill = len(fs.glob("resume/out/_work/signatures/part-*.parquet"))
        started = time.perf_counter()
        assert build(config, env).wait() == 0
        resume_s = time.perf_counter() - started
        fs.invalidate_cache()
        resumed = json.loads(fs.cat("resume/out/manifest.json"))
    same = {k: v for k, v in clean.items() if k != "created"} == {
        k: v for k, v in resumed.items() if k != "created"
    }
    print(
        json.dumps(
            {
                "samples_in": args.samples,
                "samples_out": clean["samples"],
                "shards": len(clean["shards"]),
                "partitions": parts,
                "partitions_done_when_killed": done_at_kill,
                "clean_build_s": round(clean_s, 1),
                "resume_s": round(resume_s, 1),
                "manifests_equal_but_timestamp": same,
            },
            indent=2,
        )
    )
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()

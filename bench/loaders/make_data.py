"""Test shards for the loader benchmark: real photos through an mmcurate build.

make_photos (400-900 px JPEGs with captions) -> mmcurate `images` build with decode_image
(resize 256 shorter side, keep_ratio) -> WebDataset shards of ~1000 samples (`<key>.jpg`,
`<key>.txt`, `<key>.json`), written to --out/shards (the build's output folder).

    .venv/bin/python bench/loaders/make_data.py --out /tmp/mmcurate-loaders [--n 4000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
BENCH = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(BENCH), str(BENCH.parent)]

from photos import make_photos  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=4000)
    parser.add_argument("--out", default="/tmp/mmcurate-loaders")
    parser.add_argument("--shard-samples", type=int, default=1000)
    args = parser.parse_args()

    import ray

    from pipeline.build import run_build
    from pipeline.config import BuildConfig

    root = Path(args.out)
    shutil.rmtree(root / "images", ignore_errors=True)
    started = time.perf_counter()
    make_photos(root / "images", args.n)
    cfg = BuildConfig.model_validate(
        {
            "source": {"kind": "images", "path": str(root / "images"), "files_per_task": 500},
            "stages": [{"name": "decode_image", "resize": {"size": 256, "mode": "keep_ratio"}}],
            "output": {
                "path": str(root / "shards"),
                "overwrite": True,
                "shard_max_samples": args.shard_samples,
            },
        }
    )
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, logging_level="WARNING")
    manifest = run_build(cfg, progress=False)
    ray.shutdown()
    shutil.rmtree(root / "images", ignore_errors=True)
    tars = sorted(p.name for p in (root / "shards").glob("*.tar"))
    print(
        json.dumps(
            {
                "shards_dir": str(root / "shards"),
                "samples": manifest["samples"],
                "shards": len(tars),
                "first": tars[0],
                "last": tars[-1],
                "mb": round(
                    sum(p.stat().st_size for p in (root / "shards").glob("*.tar")) / 1e6, 1
                ),
                "seconds": round(time.perf_counter() - started, 1),
            }
        )
    )


if __name__ == "__main__":
    main()

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

BENCH = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(BENCH), str(BENCH.parent)]

from mmcurate.pipeline.runtime.loopback import loopback_only_env  # noqa: E402
from photos import make_photos  # noqa: E402

os.environ.update(loopback_only_env())  # before Ray loads: nothing leaves loopback


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=4000)
    parser.add_argument("--out", default="/tmp/mmcurate-loaders")
    parser.add_argument("--shard-samples", type=int, default=1000)
    parser.add_argument(
        "--copies", type=int, default=1, help="also write OUT/shards<N>x: each shard N times"
    )
    args = parser.parse_args()

    import ray
    from mmcurate.pipeline.build import run_build
    from mmcurate.pipeline.config import BuildConfig

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
    if args.copies > 1:
        list_copies(root / "shards", root / f"shards{args.copies}x", args.copies)
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


def list_copies(shards: Path, out: Path, copies: int) -> None:
    """A larger set made of copies of every shard (and a manifest listing them), so that a
    long measurement stays inside one epoch without building more photos."""
    out.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((shards / "manifest.json").read_text())
    listed = []
    for copy in range(copies):
        for shard in manifest["shards"]:
            name = f"c{copy}-{shard['name']}"
            shutil.copyfile(shards / shard["name"], out / name)
            listed.append(shard | {"name": name})
    manifest |= {"shards": listed, "samples": sum(s["samples"] for s in listed)}
    (out / "manifest.json").write_text(json.dumps(manifest))


if __name__ == "__main__":
    main()

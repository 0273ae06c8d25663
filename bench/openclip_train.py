"""Check: open_clip's own trainer trains on an mmcurate build's shards.

Builds 96 demo photos (decode_image, caption_filter) into local shards, then runs
`python -m open_clip_train.main --dataset-type webdataset` on them in its own venv
(bench/.venv-openclip: open_clip_train needs webdataset<=0.2.86; made on first use) for one
epoch of ViT-B-32 on CPU, and reports whether it trained and its last logged loss.

    .venv/bin/python bench/openclip_train.py
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from mmcurate.pipeline.runtime.loopback import loopback_only_env

# Before Ray is imported; the proxy variables only once pip is done (ensure_venv needs PyPI).
os.environ.update(loopback_only_env(proxy=False))

from mmcurate.pipeline.build import run_build  # noqa: E402
from mmcurate.pipeline.config import BuildConfig  # noqa: E402
from mmcurate.pipeline.demo_data import make_image_text_pairs  # noqa: E402

VENV = Path(__file__).resolve().parent / ".venv-openclip"


def ensure_venv() -> Path:
    python = VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        packages = ["torch==2.14.1", "torchvision==0.29.1", "open_clip_torch"]
        packages += ["webdataset==0.2.86", "pandas", "braceexpand"]
        subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", *packages], check=True)
    return python


def main() -> None:
    python = ensure_venv()
    os.environ.update(loopback_only_env())  # from here on nothing leaves loopback
    with tempfile.TemporaryDirectory(prefix="openclip-train-") as tmp:
        root = Path(tmp)
        make_image_text_pairs(root / "images", n=96, seed=3)
        cfg = BuildConfig.model_validate(
            {
                "source": {"kind": "images", "path": str(root / "images"), "files_per_task": 32},
                "stages": [
                    {"name": "decode_image", "resize": {"size": 224, "mode": "center_crop"}},
                    {"name": "caption_filter", "min_words": 1},
                ],
                "output": {"path": str(root / "build"), "shard_max_samples": 32},
            }
        )
        manifest = run_build(cfg, progress=False)
        last = len(manifest["shards"]) - 1
        command = [
            str(python), "-m", "open_clip_train.main",
            "--dataset-type", "webdataset",
            "--train-data", str(root / "build" / f"shard-{{000000..{last:06d}}}.tar"),
            "--train-num-samples", str(manifest["samples"]),
            "--model", "ViT-B-32", "--batch-size", "8", "--epochs", "1", "--workers", "1",
            "--device", "cpu", "--precision", "fp32", "--lr", "1e-4", "--warmup", "2",
            "--logs", str(root / "logs"), "--name", "run", "--save-frequency", "0",
            "--log-every-n-steps", "1",
        ]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, timeout=1200)
        log = result.stdout + result.stderr
        losses = re.findall(r"Contrastive_loss: ([0-9.]+)", log)
        print(
            json.dumps(
                {
                    "samples": manifest["samples"],
                    "shards": len(manifest["shards"]),
                    "exit_code": result.returncode,
                    "logged_steps": len(losses),
                    "first_loss": float(losses[0]) if losses else None,
                    "last_loss": float(losses[-1]) if losses else None,
                }
            )
        )
        if result.returncode != 0:
            print(log[-3000:])


if __name__ == "__main__":
    main()

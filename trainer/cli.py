"""`python -m trainer CONFIG.yaml [--set key.path=value ...]` (also `mmcurate train`)."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from core.config_io import ConfigError, add_overrides, one_line
from trainer.config import load_train_config
from trainer.data.manifest import ManifestError, read_manifest


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="mmcurate train", description="Train CLIP on shards.")
    parser.add_argument("config", help="train config YAML (see configs/train_clip.yaml)")
    add_overrides(parser, "run.max_steps=100")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run training; 0 on success, 2 on a bad config, an unreadable manifest or eval set, 1
    when health stopped the run."""
    try:
        args = parse_args(argv)
    except SystemExit as stop:  # argparse already printed its usage line
        return stop.code if isinstance(stop.code, int) else 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        cfg = load_train_config(args.config, args.overrides)
        # Why here: fail fast on storage before importing torch and building the model.
        for url in [cfg.data.manifest, *(entry.manifest for entry in cfg.data.mix)]:
            read_manifest(url, cfg.storage_options)
        if cfg.eval.enabled:  # the eval sets too (this imports torch)
            from trainer.eval.in_training import eval_config_of, open_sets

            open_sets(eval_config_of(cfg))
        if cfg.launch.mode == "ray":
            from trainer.launch import launch_ray

            summary = launch_ray(cfg)
        else:
            from trainer.train import train

            summary = train(cfg)
    except (ConfigError, ManifestError) as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    if summary.get("stopped"):  # health stopped the run (trainer/health/checks.py)
        print(f"error: health: {summary['stopped']}", file=sys.stderr)
        return 1
    return 0

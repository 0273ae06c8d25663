"""`python -m mmcurate.trainer CONFIG.yaml [--set key.path=value ...]` (also `mmcurate train`)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from mmcurate.core.config_io import ConfigError, add_overrides, one_line
from mmcurate.core.manifest import ManifestError
from mmcurate.trainer.config import load_train_config
from mmcurate.trainer.data.manifest import read_manifest
from mmcurate.trainer.outputs import check_output


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
        check_output(cfg.run.output)  # here too: a Ray launch would report it from a worker
        if cfg.eval.enabled:  # the eval sets too (this imports torch)
            from mmcurate.trainer.eval.in_training import eval_config_of, open_sets

            open_sets(eval_config_of(cfg))
        if cfg.launch.mode == "ray":
            from mmcurate.trainer.launch import launch_ray

            summary = launch_ray(cfg)
        else:
            from mmcurate.trainer.train import train

            summary = train(cfg)
    except (ConfigError, ManifestError) as err:
        error_line(one_line(err))
        return 2
    print(json.dumps(summary))
    if summary.get("stopped"):  # health stopped the run (trainer/health/checks.py)
        error_line(f"health: {summary['stopped']}")
        return 1
    return 0


def error_line(message: str) -> None:
    """`error: [rank R] message` and its newline in one write to stderr: the ranks of a job
    share a terminal, and a line written in pieces (print's text, then its newline) runs
    into another rank's."""
    from mmcurate.trainer.dist.world import rank_label  # here: the config checks run without torch

    line = f"error: {rank_label()}{message}\n"
    sys.stderr.flush()  # what was written before stays before it
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # a stream with no descriptor (captured)
        sys.stderr.write(line)
        sys.stderr.flush()
        return
    data = line.encode()
    while data:  # one write for a line under the pipe's atomic size (4 KiB); loop for more
        data = data[os.write(fd, data) :]

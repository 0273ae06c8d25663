"""`mmcurate eval CONFIG.yaml [--set key.path=value ...] [--out FILE.json]` (also
`python -m mmcurate.trainer.eval ...`): zero-shot retrieval on a held-out build and zero-shot
classification, for an `mmcurate train` checkpoint, an open_clip pretrained tag or a local .pt.

`python -m mmcurate.trainer.eval --export CHECKPOINT OUT.pt` writes a train checkpoint as a plain
open_clip file: `open_clip.create_model_and_transforms(name, pretrained=OUT.pt)` loads it.

See configs/eval.yaml for every key; metric names in trainer/eval/metrics.py.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from mmcurate.core.atomic import write_bytes_atomic
from mmcurate.core.config_io import ConfigError, add_overrides, one_line
from mmcurate.core.manifest import ManifestError
from mmcurate.core.storage import check_reachable, filesystem, protocol_of
from mmcurate.trainer.eval.config import (
    EvalConfig,
    Inputs,
    load_eval_config,
)
from mmcurate.trainer.eval.data import EvalDataError

FORMAT = "mmcurate-eval/1"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="mmcurate eval", description=__doc__.split("\n\n")[0])
    parser.add_argument("config", nargs="?", help="eval config YAML (see configs/eval.yaml)")
    add_overrides(parser, "model.pretrained=runs/x")
    parser.add_argument("--out", help="write the results as one JSON document here")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    parser.add_argument(
        "--export",
        nargs=2,
        metavar=("CHECKPOINT", "OUT"),
        help="write a train checkpoint as a plain open_clip file and exit",
    )
    args = parser.parse_args(argv)
    if (args.config is None) == (args.export is None):
        parser.error("give a CONFIG, or --export CHECKPOINT OUT (not both)")
    return args


def main(argv: list[str] | None = None) -> int:
    """0 on success; 2 on a bad config, unreadable data or weights (one line on stderr)."""
    try:
        args = parse_args(argv)
    except SystemExit as stop:  # argparse already printed its usage line
        return stop.code if isinstance(stop.code, int) else 2
    try:
        if args.export:
            print(json.dumps(export_command(*args.export)))
            return 0
        cfg = load_eval_config(args.config, args.overrides)
        if args.out is not None:
            check_out(args.out, cfg.storage_options)  # before the evaluation, not after it
        result = evaluate(cfg, progress=not args.no_progress)
    except (ConfigError, ManifestError, EvalDataError) as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 2
    print(result_table(result))
    if args.out is not None:
        if not write_out(args.out, result, cfg.storage_options):
            return 2
        print(f"  results: {args.out}")
    return 0


def is_url(path: str) -> bool:
    return protocol_of(path) not in ("file", "local")


def local_path(path: str) -> Path:
    return Path(path.removeprefix("file://")).expanduser()


def is_special(target: Path) -> bool:
    """A FIFO, a terminal, /dev/stdout (through links): written in place, never replaced."""
    try:
        mode = target.stat().st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def check_out(path: str, storage_options: dict | None = None, flag: str = "--out") -> None:
    """ConfigError when `path` cannot become the output file: empty, a folder, a part of its
    folder a file, a folder this process cannot create files in (a temporary file is made
    there and removed), or a URL whose store does not answer."""
    if not path.strip():
        raise ConfigError(f"{flag}: empty (give a file name such as eval.json)")
    if is_url(path):
        check_reachable(path, storage_options or {}, f"{flag} {path}")
        return
    target = local_path(path)
    if target.is_dir():
        example = "eval.json" if flag == "--out" else "model.pt"
        raise ConfigError(f"{flag} {path}: is a directory (give a file name such as {example})")
    if is_special(target):
        if not os.access(target, os.W_OK):
            raise ConfigError(f"{flag} {path}: not writable")
        return
    folder = Path(os.path.realpath(target)).parent  # a link: the folder of the file it names
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise ConfigError(f"{flag} {path}: {folder} is not a directory")
    try:
        handle, name = tempfile.mkstemp(prefix=".mmcurate-check-", dir=folder)
        os.close(handle)
        os.unlink(name)
    except OSError as err:
        raise ConfigError(f"{flag} {path}: cannot write in {folder}: {err.strerror}") from None


def export_command(checkpoint: str, out: str) -> dict[str, Any]:
    from mmcurate.trainer.models import export_open_clip

    check_out(out, flag="--export OUT")  # before the checkpoint is read
    return export_open_clip(checkpoint, out)


def check_inputs(cfg: EvalConfig) -> Inputs:
    """Resolve the weights and open every eval set's index before any model loads."""
    import torch
    from mmcurate.trainer.models import resolve_weights

    weights = resolve_weights(cfg.model.name, cfg.model.pretrained, cfg.storage_options)
    wanted = cfg.run.device
    if wanted == "auto":
        wanted = "cuda" if torch.cuda.is_available() else "cpu"
    index = int(wanted.partition(":")[2] or 0)
    if wanted.startswith("cuda") and index >= torch.cuda.device_count():
        found = torch.cuda.device_count()
        raise ConfigError(f"run.device: {wanted}, but torch sees {found} CUDA device(s)")
    retrieval = units_of(cfg, cfg.retrieval.manifest, True) if cfg.retrieval else None
    zeroshot = units_of(cfg, cfg.zeroshot.path) if cfg.zeroshot else None
    return Inputs(weights, torch.device(wanted), retrieval, zeroshot)


def units_of(cfg: EvalConfig, url: str, manifest_only: bool = False) -> tuple[list, Any, list]:
    """(units, reader, shard start positions) of a manifest.json or a folder of classes."""
    from mmcurate.trainer.data.manifest import read_manifest
    from mmcurate.trainer.eval.data import FolderRead, ShardRead, folder_units, shard_units

    if not manifest_only and not url.endswith(".json"):
        return folder_units(url, cfg.storage_options), FolderRead(cfg.storage_options), []
    from mmcurate.trainer.units import parse_size

    manifest = read_manifest(url, cfg.storage_options)
    cache = (cfg.data.cache_dir, parse_size(cfg.data.cache_limit)) if cfg.data.cache_dir else None
    units = shard_units(manifest)
    return units, ShardRead(manifest, cfg.storage_options, cache), [u.position for u in units]


def evaluate(cfg: EvalConfig, progress: bool = True) -> dict[str, Any]:
    """Check every input (fails fast, before a model loads), then run the tasks."""
    from mmcurate.trainer.eval.tasks import ModelUnderTest, run_tasks
    from mmcurate.trainer.models import load_eval_model

    started = time.monotonic()
    inputs = check_inputs(cfg)
    model, preprocess, tokenizer, info = load_eval_model(
        cfg.model.name, inputs.weights, inputs.device, cfg.storage_options
    )
    tasks = run_tasks(cfg, inputs, ModelUnderTest(model, preprocess, tokenizer), progress)
    return {
        "format": FORMAT,
        "model": {
            "name": cfg.model.name,
            "pretrained": cfg.model.pretrained,
            "weights": inputs.weights.source,  # the file a run folder resolved to, or the tag
            **info,
        },
        "device": str(inputs.device),
        "precision": cfg.run.precision if inputs.device.type == "cuda" else "fp32",
        "tasks": tasks,
        "metrics": {k: v for body in tasks.values() for k, v in body["metrics"].items()},
        "seconds": round(time.monotonic() - started, 3),
    }


def result_table(result: dict[str, Any]) -> str:
    """The terminal summary: one line per task, then one per metric."""
    model = result["model"]
    lines = [
        f"model {model['name']} ({model['kind']}: {model['pretrained']}) on {result['device']}"
    ]
    for task, body in result["tasks"].items():
        dropped = ", ".join(f"{k} {v}" for k, v in body["dropped"].items()) or "none"
        counts = ", ".join(
            f"{k} {body[k]}" for k in ("samples", "images", "texts", "classes") if k in body
        )
        lines.append(f"{task}: {body['data']}  ({counts}; dropped: {dropped})")
        width = max(len(name) for name in body["metrics"])
        lines += [f"  {name:<{width}}  {value:.4f}" for name, value in body["metrics"].items()]
    return "\n".join(lines)


def write_out(path: str, result: dict[str, Any], storage_options: dict | None) -> bool:
    """`write_json`, or False after one line on stderr (`--out` of eval and probe)."""
    from mmcurate.core.storage import storage_errors

    try:
        write_json(path, result, storage_options)
    except storage_errors() as err:
        reason = getattr(err, "strerror", None) or one_line(err) or type(err).__name__
        print(f"error: --out {path}: cannot write: {reason}", file=sys.stderr)
        return False
    return True


def write_json(path: str, result: dict[str, Any], storage_options: dict | None = None) -> None:
    """Written whole under a temporary name, then renamed: never half a document. A URL goes
    through fsspec (one PUT); a link is written through (the file it names is replaced, the
    link stays); a FIFO or terminal is written in place."""
    data = (json.dumps(result, indent=2) + "\n").encode()
    if is_url(path):
        fs, remote = filesystem(path, storage_options)
        write_bytes_atomic(fs, remote, data)
        return
    target = local_path(path)
    if is_special(target):
        sys.stdout.flush()  # the table first, when the target is this process's stdout
        with open(target, "wb") as out:
            out.write(data)
        return
    target = Path(os.path.realpath(target))
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)  # no half-written temporary left beside the target
        raise

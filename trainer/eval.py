"""`mmcurate eval CONFIG.yaml [--set key.path=value ...] [--out FILE.json]` (also
`python -m trainer.eval ...`): zero-shot retrieval on a held-out build and zero-shot
classification, for an `mmcurate train` checkpoint, an open_clip pretrained tag or a local .pt.

`python -m trainer.eval --export CHECKPOINT OUT.pt` writes a train checkpoint as a plain
open_clip file: `open_clip.create_model_and_transforms(name, pretrained=OUT.pt)` loads it.

See configs/eval.yaml for every key; metric names in trainer/eval_metrics.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from core.config_io import ConfigError, Strict, add_overrides, load_yaml, one_line, validate
from trainer.eval_data import ClassNames, EvalDataError, load_listing
from trainer.manifest import ManifestError

FORMAT = "mmcurate-eval/1"
MAX_K = 2**31 - 1  # largest retrieval.recall_at K


class EvalModel(Strict):
    name: str  # an open_clip architecture (the one a train checkpoint was trained as)
    # null (random init), an open_clip tag, a local .pt, or an `mmcurate train` checkpoint:
    # a step-N.pt file (local or a URL) or a run folder (its newest checkpoint)
    pretrained: str | None = None


class RetrievalTask(Strict):
    manifest: str  # a build's manifest.json (local path or any fsspec URL)
    captions_field: str = "captions"  # json list of captions (else the txt member)
    image_id_field: str = "image_id"  # json id shared by samples showing the same image
    recall_at: list[int] = Field(default=[1, 5, 10], min_length=1)

    @field_validator("recall_at")
    @classmethod
    def _positive(cls, value: list[int]) -> list[int]:
        if any(k <= 0 for k in value):
            raise ValueError("every K must be at least 1")
        if any(k > MAX_K for k in value):  # compared with int64 ranks: bigger overflows
            raise ValueError(f"every K must be at most {MAX_K}")
        return sorted(set(value))


class ZeroshotTask(Strict):
    path: str  # a folder of class folders, or a build's manifest.json (labels in json)
    # a YAML file, or inline: a list (label = name or index) or a mapping label -> name
    classnames: str | list[str] | dict[Any, Any]
    # a YAML file or an inline list of prompts; {c} stands for the class name
    templates: str | list[str] = ["a photo of a {c}."]
    label_field: str = "label"  # json field of a manifest sample (else its cls member)

    @field_validator("classnames")
    @classmethod
    def _classnames(cls, value: Any) -> Any:
        loaded = load_listing(value, "classnames")
        ClassNames.parse(loaded)
        return {str(k): str(v) for k, v in loaded.items()} if isinstance(loaded, dict) else loaded

    @field_validator("templates")
    @classmethod
    def _templates(cls, value: Any) -> list[str]:
        loaded = load_listing(value, "templates")
        if (
            not isinstance(loaded, list)
            or not loaded
            or not all(isinstance(t, str) for t in loaded)
        ):
            raise ValueError("expected a non-empty list of prompt templates")
        if missing := [t for t in loaded if "{c}" not in t]:
            raise ValueError(f"template {missing[0]!r} has no {{c}} for the class name")
        return loaded


class EvalData(Strict):
    batch_size: int = Field(64, gt=0)  # images (and texts) per forward pass
    workers: int = Field(2, ge=0)  # loader processes reading and decoding
    cache_dir: str | None = None  # node-local shard cache, as for training
    cache_limit: str = "100GB"

    @field_validator("cache_limit")
    @classmethod
    def _size(cls, value: str) -> str:
        from trainer.config import parse_size

        parse_size(value)
        return value


class EvalRun(Strict):
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$")  # auto: cuda when present
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"  # autocast on CUDA only


class EvalConfig(Strict):
    model: EvalModel
    retrieval: RetrievalTask | None = None
    zeroshot: ZeroshotTask | None = None
    data: EvalData = EvalData()
    run: EvalRun = EvalRun()
    storage_options: dict[str, Any] = {}

    @model_validator(mode="after")
    def _some_task(self) -> EvalConfig:
        if self.retrieval is None and self.zeroshot is None:
            raise ValueError("nothing to evaluate: set retrieval, zeroshot, or both")
        return self


def load_eval_config(path: str | Path, overrides: list[str] | None = None) -> EvalConfig:
    """Read YAML, apply `--set` overrides, validate; raises ConfigError with one line."""
    return validate(EvalConfig, load_yaml(path, overrides))


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
        if args.out:
            check_out(args.out)  # before the evaluation, not after it
        result = evaluate(cfg, progress=not args.no_progress)
    except (ConfigError, ManifestError, EvalDataError) as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 2
    print(result_table(result))
    if args.out:
        try:
            write_json(args.out, result)
        except OSError as err:
            print(f"error: --out {args.out}: cannot write: {err.strerror or err}", file=sys.stderr)
            return 2
        print(f"  results: {args.out}")
    return 0


def check_out(path: str) -> None:
    """ConfigError when `--out` cannot become a file: it is a folder, or a part of its
    folder is a file."""
    target = Path(path).expanduser()
    if target.is_dir():
        raise ConfigError(f"--out {path}: is a directory (give a file name such as eval.json)")
    folder = target.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise ConfigError(f"--out {path}: {folder} is not a directory")


def export_command(checkpoint: str, out: str) -> dict[str, Any]:
    from trainer.models import export_open_clip

    return export_open_clip(checkpoint, out)


@dataclass(frozen=True)
class Inputs:
    """What `check_inputs` found: the weights, the eval sets' units and readers, the device."""

    weights: Any
    device: Any
    retrieval: tuple[list, Any, list[int]] | None
    zeroshot: tuple[list, Any, list[int]] | None


def check_inputs(cfg: EvalConfig) -> Inputs:
    """Resolve the weights and open every eval set's index before any model loads."""
    import torch

    from trainer.models import resolve_weights

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
    from trainer.eval_data import FolderRead, ShardRead, folder_units, shard_units
    from trainer.manifest import read_manifest

    if not manifest_only and not url.endswith(".json"):
        return folder_units(url, cfg.storage_options), FolderRead(cfg.storage_options), []
    from trainer.config import parse_size

    manifest = read_manifest(url, cfg.storage_options)
    cache = (cfg.data.cache_dir, parse_size(cfg.data.cache_limit)) if cfg.data.cache_dir else None
    units = shard_units(manifest)
    return units, ShardRead(manifest, cfg.storage_options, cache), [u.position for u in units]


def evaluate(cfg: EvalConfig, progress: bool = True) -> dict[str, Any]:
    """Check every input (fails fast, before a model loads), then run the tasks."""
    from trainer.eval_tasks import run_retrieval, run_zeroshot
    from trainer.models import load_eval_model

    started = time.monotonic()
    inputs = check_inputs(cfg)
    model, preprocess, tokenizer, info = load_eval_model(
        cfg.model.name, inputs.weights, inputs.device, cfg.storage_options
    )
    tasks = {}
    if inputs.retrieval:
        tasks["retrieval"] = run_retrieval(cfg, inputs, model, preprocess, tokenizer, progress)
    if inputs.zeroshot:
        tasks["zeroshot"] = run_zeroshot(cfg, inputs, model, preprocess, tokenizer, progress)
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


def write_json(path: str, result: dict[str, Any]) -> None:
    """Written whole under a temporary name, then renamed: never half a document."""
    target = Path(path).expanduser()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)  # no half-written temporary left beside the target
        raise


if __name__ == "__main__":
    sys.exit(main())

"""`mmcurate eval`'s config models (model, retrieval, zeroshot, data, run) and what
`check_inputs` hands the tasks: a leaf, so the train config can validate its eval section and
the eval tasks can name these types without importing the command (trainer/eval/evaluate.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from mmcurate.core.config_io import Strict, load_yaml, validate
from mmcurate.trainer.eval.data import ClassNames, load_listing
from mmcurate.trainer.units import parse_size
from pydantic import Field, field_validator, model_validator

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


def load_eval_config(path: str | Path | dict, overrides: list[str] | None = None) -> EvalConfig:
    """Read YAML, apply `--set` overrides, validate; raises ConfigError with one line."""
    return validate(EvalConfig, load_yaml(path, overrides))


@dataclass(frozen=True)
class Inputs:
    """What `check_inputs` found: the weights, the eval sets' units and readers, the device."""

    weights: Any
    device: Any
    retrieval: tuple[list, Any, list[int]] | None
    zeroshot: tuple[list, Any, list[int]] | None

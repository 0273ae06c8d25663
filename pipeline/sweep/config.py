"""`mmcurate sweep`'s config (YAML -> typed models): the base build, train and eval configs,
the sources, the seeds, the arms and the output folder. Unknown keys are errors; every
problem is one line (ConfigError) before anything runs, including the build, train and eval
configs it names (validated by their own loaders)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mmcurate.core.config_io import ConfigError, Strict, load_yaml, validate
from mmcurate.pipeline.sweep.scorers import (
    DEFAULT_SCORER,
    THRESHOLDS,  # removed from the scoring build
    check_scorers,
    scorer_index,
)
from pydantic import Field, field_validator, model_validator

NAME = re.compile(r"[a-z0-9][a-z0-9_-]*\Z")  # arm and source names: used in file names
DEDUPE = ("exact_dedupe", "near_dedupe", "semantic_dedupe")  # decisions, not scores: `dedupe:`


class Arm(Strict):
    """One arm: a decision over the recorded scores and dedupe signatures."""

    name: str
    min_score: float | None = Field(None, description="keep clip_score >= this")
    keep_top_fraction: float | None = Field(None, gt=0, le=1, description="per source")
    dedupe: bool = Field(False, description="drop what the sweep's dedupe stages drop")
    weights: dict[str, float] | None = Field(None, description="source -> mixture weight")
    scorer: str | None = Field(None, description="a name in `scorers`; default: clip_score")

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not NAME.match(name):
            raise ValueError(f"arm name {name!r}: use lowercase letters, digits, _ and -")
        return name

    @field_validator("weights")
    @classmethod
    def _weights(cls, weights: dict[str, float] | None) -> dict[str, float] | None:
        if weights is not None and (not weights or any(w < 0 for w in weights.values())):
            raise ValueError("weights: a non-empty mapping of source -> weight >= 0")
        if weights is not None and sum(weights.values()) <= 0:
            raise ValueError("weights: at least one weight above 0")
        return weights

    @model_validator(mode="after")
    def _one_threshold(self) -> Arm:
        if self.min_score is not None and self.keep_top_fraction is not None:
            raise ValueError(f"arm {self.name}: min_score or keep_top_fraction, not both")
        if self.scorer is not None and not self.scored:
            raise ValueError(f"arm {self.name}: scorer needs min_score or keep_top_fraction")
        return self

    @property
    def scored(self) -> bool:
        return self.min_score is not None or self.keep_top_fraction is not None


class Splits(Strict):
    """The eval sets (manifests, as `mmcurate eval` reads them): the recommendation is chosen
    on `validation` and reported on `test`."""

    validation: str
    test: str


class SweepConfig(Strict):
    build: dict[str, Any]  # a build config tree (or `build: PATH`, read by load_sweep_config)
    sources: dict[str, str] = Field(default_factory=dict, description="name -> source.path")
    dedupe: list[dict[str, Any]] = Field(default_factory=list, description="dedupe stages")
    scorers: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="name -> clip_score options: more scorers"
    )
    train: dict[str, Any]
    eval: dict[str, Any]
    splits: Splits
    metric: str = "image_retrieval_recall@1"
    seeds: list[int] = Field(..., min_length=1)
    arms: list[Arm] = Field(..., min_length=1)
    output: str

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, seeds: list[int]) -> list[int]:
        if len(set(seeds)) != len(seeds):
            raise ValueError("each seed once")
        return seeds

    @field_validator("sources")
    @classmethod
    def _sources(cls, sources: dict[str, str]) -> dict[str, str]:
        for name in sources:
            if not NAME.match(name):
                raise ValueError(f"source name {name!r}: use lowercase letters, digits, _ and -")
        return sources

    @field_validator("scorers")
    @classmethod
    def _scorers(cls, scorers: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for name in scorers:
            if not NAME.match(name):
                raise ValueError(f"scorer name {name!r}: use lowercase letters, digits, _ and -")
        return scorers

    @model_validator(mode="after")
    def _arms(self) -> SweepConfig:
        names = [arm.name for arm in self.arms]
        if len(set(names)) != len(names):
            raise ValueError("arms: each name once")
        known = set(self.source_paths())
        for arm in self.arms:
            unknown = set(arm.weights or {}) - known
            if unknown:
                raise ValueError(f"arm {arm.name}: unknown source {sorted(unknown)[0]!r}")
            if arm.weights is None and len(known) > 1:
                raise ValueError(f"arm {arm.name}: several sources: say which in weights")
            if arm.dedupe and not self.dedupe:
                raise ValueError(f"arm {arm.name}: dedupe: true needs the sweep's dedupe stages")
        for i, stage in enumerate(self.build.get("stages") or []):
            if isinstance(stage, dict) and stage.get("name") in DEDUPE:
                raise ValueError(f"build.stages.{i}: {stage['name']} drops; list it in `dedupe`")
        self.check_scorers()
        return self

    def check_scorers(self) -> None:
        """Each arm's scorer exists; each scorer is computed once (scorers.check_scorers)."""
        base = [arm for arm in self.arms if arm.scored and arm.scorer in (None, DEFAULT_SCORER)]
        if base and scorer_index(self.build) is None:
            raise ValueError("arms threshold clip_score: the build config needs a clip_score stage")
        check_scorers(self.build, self.scorers)  # ConfigError: its line as it is
        for arm in self.arms:
            if arm.scorer not in (None, DEFAULT_SCORER, *self.scorers):
                raise ValueError(f"arm {arm.name}: unknown scorer {arm.scorer!r}")

    def source_paths(self) -> dict[str, str]:
        """name -> source.path; the build's own source is `main` when none are named."""
        return dict(self.sources) or {"main": str(self.build["source"]["path"])}

    def arm_weights(self, arm: Arm) -> dict[str, float]:
        """An arm's sources and weights (default: the one source), summing to 1."""
        weights = arm.weights or {next(iter(self.source_paths())): 1.0}
        total = sum(weights.values())
        return {name: w / total for name, w in weights.items() if w > 0}


def scoring_tree(build: dict[str, Any], source: str, output: str) -> dict[str, Any]:
    """The build config that records scores for one source: the base build with its scorer's
    thresholds removed (every sample scored, none dropped by score)."""
    stages = [
        {k: v for k, v in stage.items() if k not in THRESHOLDS}
        for stage in build.get("stages") or []
    ]
    tree = {**build, "stages": stages}
    tree["source"] = {**build["source"], "path": source}
    tree["output"] = {**build.get("output", {}), "path": output}
    return tree


def dedupe_tree(cfg: SweepConfig, scored: Path, out: Path) -> dict[str, Any]:
    """The dedupe stages alone, over the scored build's shards (their hashes computed once)."""
    tree = {k: v for k, v in cfg.build.items() if k in ("ray", "storage_options")}
    tree["source"] = {"kind": "webdataset", "path": str(Path(scored) / "shard-*.tar")}
    tree["stages"] = cfg.dedupe
    tree["output"] = {**cfg.build.get("output", {}), "path": str(out)}
    return tree


def load_sweep_config(path: str | Path | dict, overrides: list[str] | None = None) -> SweepConfig:
    """Read, override and validate a sweep config, and the configs it names (each by its own
    loader, so a bad build, train or eval config is its loader's one line)."""
    tree = load_yaml(path, overrides)
    base = Path(path).parent if not isinstance(path, dict) else Path.cwd()
    for key in ("build", "train", "eval"):
        if isinstance(tree.get(key), str):
            tree[key] = load_yaml(base / tree[key])
    cfg = validate(SweepConfig, tree)
    check_named_configs(cfg)
    return cfg


def check_named_configs(cfg: SweepConfig) -> None:
    """The build, train and eval configs as the sweep will run them, each validated by its
    own loader (so their errors are the commands' own lines, prefixed by the section)."""
    from mmcurate.pipeline.config import load_build_config
    from mmcurate.pipeline.sweep.task import eval_tree, train_tree
    from mmcurate.trainer.config import load_train_config
    from mmcurate.trainer.eval.config import load_eval_config

    first, path = next(iter(cfg.source_paths().items()))
    scratch = str(Path(cfg.output) / "scored" / first)
    run = str(Path(cfg.output) / "runs" / "check")
    model = (cfg.train.get("model") or {}).get("name", "mmcurate-tiny")
    checks = (
        ("build", load_build_config, scoring_tree(cfg.build, path, scratch)),
        ("train", load_train_config, train_tree(cfg.train, cfg.splits.validation, run, 0)),
        ("eval", load_eval_config, eval_tree(cfg.eval, model, run, cfg.splits.validation)),
    )
    if cfg.dedupe:
        tree = dedupe_tree(cfg, Path(scratch), Path(cfg.output) / "deduped" / first)
        checks += (("dedupe", load_build_config, tree),)
    for name, loader, tree in checks:
        try:
            loader(tree)
        except ConfigError as err:
            raise ConfigError(f"{name}: {err}") from None

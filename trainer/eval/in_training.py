"""Evaluation during training (train config `eval`): `mmcurate eval`'s retrieval and zero-shot
tasks (trainer/eval/evaluate.py, trainer/eval/tasks.py) on the model being trained, every
`eval.every` steps and at the last step.

Rank 0 evaluates the full sets with the weights as they are after the step, in eval mode, with
the architecture's eval transform (as `mmcurate eval` loads a checkpoint), then broadcasts the
result: every rank logs and returns the same numbers, whatever the number of ranks, and they
equal `mmcurate eval` on that step's checkpoint. The other ranks wait meanwhile (one broadcast).
The sets are opened (manifests read, class folders listed) before the model is built, so a
missing or unreadable one fails fast; a set without one usable sample stops the run at its
first evaluation (NoUsableData: exit 2, one line).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from mmcurate.core.config_io import ConfigError
from mmcurate.core.manifest import ManifestError
from mmcurate.trainer.config import TrainConfig
from mmcurate.trainer.data.manifest import NoUsableData
from mmcurate.trainer.dist.world import Dist, from_rank0
from mmcurate.trainer.eval.config import EvalConfig, EvalData, EvalModel, EvalRun, Inputs
from mmcurate.trainer.eval.data import EvalDataError
from mmcurate.trainer.eval.evaluate import units_of
from open_clip.transform import PreprocessCfg, image_transform_v2


def eval_config_of(cfg: TrainConfig) -> EvalConfig:
    """The `mmcurate eval` config a run's `eval` section stands for (its model: the one
    being trained; its shard cache: the run's)."""
    section = cfg.eval
    data = EvalData(batch_size=section.batch_size, workers=section.workers)
    if cfg.data.cache_dir:
        data = data.model_copy(
            update={"cache_dir": cfg.data.cache_dir, "cache_limit": cfg.data.cache_limit or "100GB"}
        )
    return EvalConfig(
        model=EvalModel(name=cfg.model.name),
        retrieval=section.retrieval_task(),
        zeroshot=section.zeroshot_task(),
        data=data,
        run=EvalRun(precision=cfg.run.precision),
        storage_options=cfg.storage_options,
    )


def open_sets(cfg: EvalConfig, device: torch.device | None = None) -> Inputs:
    """Every eval set's units and reader (for `device`; None: only to check them);
    ConfigError (one line) for a set that cannot be read."""
    retrieval = zeroshot = None
    if cfg.retrieval:
        try:
            retrieval = units_of(cfg, cfg.retrieval.manifest, manifest_only=True)
        except ManifestError as err:
            raise ConfigError(f"eval.manifest: {err}") from None
    if cfg.zeroshot:
        try:
            zeroshot = units_of(cfg, cfg.zeroshot.path)
        except (ManifestError, EvalDataError) as err:
            text = str(err)
            where = "eval." if text.startswith("zeroshot.") else "eval.zeroshot.path: "
            raise ConfigError(where + text) from None
    return Inputs(weights=None, device=device, retrieval=retrieval, zeroshot=zeroshot)


@dataclass
class EvalSets:
    """A run's opened eval sets (rank 0 holds them; the other ranks only wait for results)."""

    cfg: EvalConfig
    inputs: Inputs | None
    place: Dist

    def evaluator(self, model: torch.nn.Module, tokenizer: Callable) -> Evaluator:
        """The evaluator for `model` (unwrapped from DDP) and its tokenizer."""
        preprocess = None
        if self.place.rank == 0:  # the transform `mmcurate eval` gets for this architecture
            config = PreprocessCfg(**model.visual.preprocess_cfg)
            preprocess = image_transform_v2(config, is_train=False)
        return Evaluator(self, preprocess, tokenizer)


def open_evaluator(cfg: TrainConfig, place: Dist) -> EvalSets | None:
    """The run's eval sets, opened by rank 0 before training (None without `eval`); a
    problem is a ConfigError on every rank."""
    if not cfg.eval.enabled:
        return None
    eval_cfg = eval_config_of(cfg)
    inputs, problem = None, None
    if place.rank == 0:
        try:
            inputs = open_sets(eval_cfg, place.device)
        except ConfigError as err:
            problem = str(err)
    (problem,) = from_rank0(place, problem)
    if problem:
        raise ConfigError(problem)
    return EvalSets(eval_cfg, inputs, place)


class Evaluator:
    """`evaluator(model, step)`: the evaluation of this step on every rank (a collective
    call): {"step", "metrics": {clip_benchmark name: value}, "tasks": {task: counts}}."""

    def __init__(self, sets: EvalSets, preprocess: Callable | None, tokenizer: Callable) -> None:
        self.sets, self.preprocess, self.tokenizer = sets, preprocess, tokenizer

    def __call__(self, model: torch.nn.Module, step: int) -> dict[str, Any]:
        result, problem = None, None
        if self.sets.place.rank == 0:
            try:
                result = self.run(model, step)
            except EvalDataError as err:
                problem = f"eval at step {step}: {err}"
        result, problem = from_rank0(self.sets.place, result, problem)
        if problem:
            raise NoUsableData(problem)  # training stops: exit 2, one line
        return result

    def run(self, model: torch.nn.Module, step: int) -> dict[str, Any]:
        """Rank 0: every task on `model` in eval mode (its train mode comes back after)."""
        # Imported here: eval_tasks imports trainer.train, which imports this module.
        from mmcurate.trainer.eval.tasks import ModelUnderTest, run_tasks

        cfg, inputs = self.sets.cfg, self.sets.inputs
        net = ModelUnderTest(model, self.preprocess, self.tokenizer)
        was_training = model.training
        cuda = [inputs.device] if inputs.device.type == "cuda" else []
        # Why fork_rng: the eval loaders draw seeds from torch's generator; training must go
        # on exactly as it would without evaluations (and alike on every rank).
        with torch.random.fork_rng(devices=cuda):
            model.eval()
            try:
                tasks = run_tasks(cfg, inputs, net, progress=False)
            finally:
                model.train(was_training)
        return {
            "step": step,
            "metrics": {k: v for body in tasks.values() for k, v in body["metrics"].items()},
            "tasks": {
                name: {k: v for k, v in body.items() if k != "metrics"}
                for name, body in tasks.items()
            },
        }

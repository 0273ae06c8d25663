"""`mmcurate sweep SWEEP.yaml`: choose filters, thresholds and source mixtures by training
the same small proxy on each arm at equal compute, over several seeds (issue 50).

1. Score once: per source, one `mmcurate build` of the base build config with its scorer's
   thresholds removed (every sample scored and recorded, none dropped by score); with
   `dedupe` stages, one more build of those over the scored shards (signatures once).
2. Decide: each arm is a selection of keys over the recorded scores and dedupe survivors
   (pipeline/sweep/arms.py), written as a build of its own; no arm downloads or scores again.
3. Train and evaluate each arm x seed (pipeline/sweep/task.py) as Ray tasks, or one at a time
   in this process; a finished one's result file is kept, so a rerun after kill -9 skips it.
4. Report (pipeline/sweep/report.py): results.json, table.md, plot.png, the recommendation.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from mmcurate.core.config_io import ConfigError, add_overrides, one_line
from mmcurate.pipeline.sweep.arms import Part, mix, read_scores, select_keys, write_arm
from mmcurate.pipeline.sweep.config import SweepConfig, dedupe_tree, load_sweep_config, scoring_tree
from mmcurate.pipeline.sweep.report import write_report
from mmcurate.pipeline.sweep.scorers import (
    count_run,
    load_scorer_models,
    scorer_index,
    scorer_tree,
    scorer_weights,
    scores_folder,
)
from mmcurate.pipeline.sweep.task import result_path, run_arm_seed

log = logging.getLogger("mmcurate.sweep")


def score_sources(cfg: SweepConfig, output: Path) -> dict[str, Any]:
    """Per source: the scoring build (with the base scorer), the dedupe build and each named
    scorer's build over it, each once (a finished one is reused); returns the ledger."""
    import mmcurate

    ledger_file = output / "scoring.json"
    ledger = json.loads(ledger_file.read_text()) if ledger_file.exists() else {}
    base = scorer_index(cfg.build)
    for name, path in cfg.source_paths().items():
        scored = output / "scored" / name
        if not (scored / "manifest.json").exists():
            mmcurate.build(scoring_tree(cfg.build, path, str(scored)))
            stage = cfg.build["stages"][base]["name"] if base is not None else None
            count_run(output, ledger, name, stage)
        if cfg.dedupe and not (output / "deduped" / name / "manifest.json").exists():
            mmcurate.build(dedupe_tree(cfg, scored, output / "deduped" / name))
        for scorer in cfg.scorers:
            folder = scores_folder(output, scorer, name)
            if not (folder / "manifest.json").exists():
                mmcurate.build(scorer_tree(cfg.build, cfg.scorers[scorer], scored, folder))
                count_run(output, ledger, name, scorer)
    return ledger


def make_arms(cfg: SweepConfig, output: Path) -> dict[str, dict[str, Any]]:
    """Each arm's build under output/arms/ (kept when finished); per arm, samples per source."""
    sizes = cfg.build.get("output", {})
    max_samples = int(sizes.get("shard_max_samples", 10_000))
    max_bytes = int(sizes.get("shard_max_bytes", 1_000_000_000))
    rows: dict[tuple[str | None, str], list] = {}  # (scorer, source): read once
    kept: dict[str, dict[str, Any]] = {}
    for arm in cfg.arms:
        weights = cfg.arm_weights(arm)
        pools = {}
        for name in weights:
            deduped = None
            if arm.dedupe:
                deduped = {k for k, _ in read_scores(output / "deduped" / name, None)}
            if (arm.scorer, name) not in rows:
                rows[arm.scorer, name] = read_scores(scores_folder(output, arm.scorer, name))
            pools[name] = select_keys(rows[arm.scorer, name], arm, deduped)
        chosen = mix(pools, weights)
        prefix = len(weights) > 1
        parts = [
            Part(output / "scored" / n, frozenset(keys), f"{n}_" if prefix else "")
            for n, keys in chosen.items()
        ]
        if not any(chosen.values()):  # nothing to train on: say so, the scores stay
            raise ConfigError(f"arms: {arm.name} keeps no sample of the scored sources")
        folder = output / "arms" / arm.name
        if not (folder / "manifest.json").exists():
            write_arm(parts, folder, max_samples, max_bytes)
        kept[arm.name] = {"samples": sum(len(k) for k in chosen.values())}
        if arm.scorer is not None:
            kept[arm.name]["scorer"] = arm.scorer
        kept[arm.name]["per_source"] = {n: len(k) for n, k in chosen.items()}
    return kept


def specs(cfg: SweepConfig, output: Path) -> list[dict[str, Any]]:
    """The arm x seed runs not finished yet (no result file)."""
    model = (cfg.train.get("model") or {}).get("name", "mmcurate-tiny")
    todo = []
    for seed in cfg.seeds:
        for arm in cfg.arms:
            if result_path(output, arm.name, seed).exists():
                continue
            todo.append(
                {
                    "output": str(output),
                    "arm": arm.name,
                    "seed": seed,
                    "manifest": str(output / "arms" / arm.name / "manifest.json"),
                    "train": cfg.train,
                    "eval": cfg.eval,
                    "model": model,
                    "splits": cfg.splits.model_dump(),
                }
            )
    return todo


def run_specs(todo: list[dict[str, Any]], runtime: str) -> None:
    """Each arm x seed as a Ray task (one CPU each) when Ray is wanted, else here in turn."""
    use_ray = runtime == "ray" or (runtime == "auto" and ray_available())
    if not use_ray:
        for spec in todo:
            run_arm_seed(spec)
        return
    import ray

    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS") or None, logging_level=logging.WARNING)
    remote = ray.remote(num_cpus=1, max_retries=0)(run_arm_seed)
    pending = [remote.remote(spec) for spec in todo]
    while pending:  # results are files the tasks wrote; here only errors surface
        done, pending = ray.wait(pending, num_returns=1)
        ray.get(done)


def ray_available() -> bool:
    """A Ray to join: this process's, or RAY_ADDRESS."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        return False
    import ray

    return ray.is_initialized() or bool(os.environ.get("RAY_ADDRESS"))


def claim_output(cfg: SweepConfig, output: Path) -> None:
    """Record what the output holds (sweep.json): a rerun may add seeds, arms and scorers, but
    scores, arm builds and runs made for another base config, or an arm or a scorer of the
    same name defined otherwise, would be reused wrongly: ConfigError before anything runs."""
    base = cfg.model_dump(exclude={"seeds", "arms", "metric", "output", "scorers"})
    # An arm without a scorer is recorded as before scorers existed (older outputs resume).
    arms = {
        arm.name: arm.model_dump(exclude={"scorer"} if arm.scorer is None else None)
        for arm in cfg.arms
    }
    record = output / "sweep.json"
    old = json.loads(record.read_text()) if record.exists() else {"base": base, "arms": {}}
    if old["base"] != base:
        raise ConfigError(f"output: {output} holds a sweep of another build/train/eval config")
    for kind, new in (("arms", arms), ("scorers", cfg.scorers)):
        for name, value in new.items():
            if old.get(kind, {}).get(name, value) != value:
                raise ConfigError(f"{kind}: {name} in {output} was defined otherwise; rename it")
    weights = scorer_weights(cfg.build, cfg.scorers)
    for name, now in weights.items():
        if old.get("weights", {}).get(name, now) != now:
            raise ConfigError(
                f"scorers.{name}: its weights ({now['file']}) changed since {output} was scored "
                "with them; use another output, or another scorer name"
            )
    output.mkdir(parents=True, exist_ok=True)
    tmp = output / ".sweep.json.tmp"
    merged = {"base": base, "arms": {**old["arms"], **arms}}
    merged["scorers"] = {**old.get("scorers", {}), **cfg.scorers}
    merged["weights"] = {**old.get("weights", {}), **weights}
    tmp.write_text(json.dumps(merged, indent=1) + "\n")
    os.replace(tmp, record)


def sweep(cfg: SweepConfig, runtime: str = "auto") -> dict[str, Any]:
    """Run (or resume) a whole sweep; returns the result written to output/results.json."""
    output = Path(cfg.output).resolve()
    load_scorer_models(cfg.scorers)  # a scorer's missing weights: one line, before any build
    claim_output(cfg, output)
    ledger = score_sources(cfg, output)
    kept = make_arms(cfg, output)
    todo = specs(cfg, output)
    log.info("%d arm x seed runs to do", len(todo))
    run_specs(todo, runtime)
    results = [
        json.loads(result_path(output, arm.name, seed).read_text())
        for arm in cfg.arms
        for seed in cfg.seeds
    ]
    return write_report(cfg, output, results, kept, ledger)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mmcurate sweep", description=__doc__.split("\n")[0])
    parser.add_argument("config", help="sweep config (YAML)")
    parser.add_argument("--runtime", choices=["auto", "ray", "local"], default="auto")
    add_overrides(parser, "seeds=[0,1,2]")
    args = parser.parse_args(argv)
    try:
        cfg = load_sweep_config(args.config, args.overrides)
    except ConfigError as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        result = sweep(cfg, args.runtime)
    except ConfigError as err:  # another sweep's output; an arm that keeps nothing
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 2
    print(result["table"])
    print(result["recommendation"]["text"])
    return 0

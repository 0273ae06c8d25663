"""One arm x seed of a sweep: train the proxy on the arm's build with `mmcurate.train`, then
`mmcurate.evaluate` it on the validation and the test split. Runs as a Ray task (or in the
sweep's process); its result file, written atomically last, marks it finished, so a rerun
after kill -9 skips it."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

SPLITS = ("validation", "test")


def result_path(output: Path, arm: str, seed: int) -> Path:
    return output / "results" / f"{arm}-s{seed}.json"


def train_tree(train: dict[str, Any], manifest: str, run_dir: str, seed: int) -> dict[str, Any]:
    """The train config of one arm x seed: the sweep's own, on the arm's build, this seed; a
    run folder left by a killed attempt is replaced (`resume` off, `overwrite` on)."""
    tree = copy.deepcopy(train)
    tree["data"] = {**tree.get("data", {}), "manifest": manifest, "seed": seed}
    run = {k: v for k, v in tree.get("run", {}).items() if k != "resume"}
    tree["run"] = {**run, "output": run_dir, "overwrite": True}
    return tree


def eval_tree(
    evaluation: dict[str, Any], model_name: str, run_dir: str, split: str
) -> dict[str, Any]:
    """The eval config of a trained run on one split: the run's newest checkpoint, and the
    split as the retrieval set (or the zero-shot set, when the eval config has only that)."""
    tree = copy.deepcopy(evaluation)
    tree["model"] = {"name": model_name, **tree.get("model", {}), "pretrained": run_dir}
    if "zeroshot" in tree and "retrieval" not in tree:
        tree["zeroshot"] = {**tree["zeroshot"], "path": split}
    else:
        tree["retrieval"] = {**tree.get("retrieval", {}), "manifest": split}
    return tree


def run_arm_seed(spec: dict[str, Any]) -> dict[str, Any]:
    """Train and evaluate one arm x seed (spec: output, arm, seed, manifest, train, eval,
    model, splits); writes and returns its result."""
    import mmcurate

    output, arm, seed = Path(spec["output"]), spec["arm"], spec["seed"]
    run_dir = str(output / "runs" / f"{arm}-s{seed}")
    summary = mmcurate.train(train_tree(spec["train"], spec["manifest"], run_dir, seed))
    result: dict[str, Any] = {"arm": arm, "seed": seed, "run": run_dir}
    keep = ("steps", "samples", "first_loss", "last_loss")
    result["train"] = {k: summary[k] for k in keep if k in summary}
    for split in SPLITS:
        tree = eval_tree(spec["eval"], spec["model"], run_dir, spec["splits"][split])
        result[split] = mmcurate.evaluate(tree)["metrics"]
    path = result_path(output, arm, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    os.replace(tmp, path)  # last: the mark that this arm x seed is done
    return result

"""bench/curation.py --check-by-hand ARM: one arm of the sweep run as a user would, by
`mmcurate build` (clip.yaml with the filter model and the arm's keep_top_fraction; the `raw`
arm keeps all: 1.0), `mmcurate train` (the same train config and seed) and `mmcurate eval` on
both splits; then whether the kept keys, the last logged loss and every metric equal the
sweep's (issue 50: each arm's numbers equal the same arm run by hand)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.curation import CONFIGS, Plan, arms, mmcurate, run, sets, train_cmd
from tests.kit_sweep import keys_of

SPLITS = {"validation": "eval-val", "test": "eval-test"}


def last_loss(run_dir: Path) -> float:
    return json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])["loss"]


def hand_arm(plan: Plan, work: Path, arm: dict[str, Any], checkpoint: Path, seed: int) -> Path:
    """Build, train and evaluate the arm by hand under work/hand/ARM; returns that folder."""
    if arm.get("dedupe") or set(arm["weights"]) != {"raw"}:
        raise SystemExit(f"--check-by-hand {arm['name']}: only raw and clip-* arms are one build")
    hand = work / "hand" / arm["name"]
    build = hand / "build"
    cmd = mmcurate("build", str(CONFIGS / "clip.yaml"), "--no-progress")
    keep = arm.get("keep_top_fraction", 1.0)
    cmd += sets(source__path=work / "data" / "raw", output__path=build)
    cmd += sets(stages__1__pretrained=checkpoint, stages__1__keep_top_fraction=keep)
    run(cmd, hand / "build.log", build / "manifest.json")
    run_dir = hand / f"run-s{seed}"
    cmd = train_cmd(plan, build / "manifest.json", run_dir, seed) + sets(run__overwrite="true")
    run(cmd, hand / "train.log")
    for split, name in SPLITS.items():
        out = hand / f"{split}.json"
        cmd = mmcurate("eval", str(CONFIGS / "eval.yaml"), "--out", str(out), "--no-progress")
        manifest = work / "builds" / name / "manifest.json"
        cmd += sets(model__pretrained=run_dir, retrieval__manifest=manifest)
        run(cmd, hand / f"{split}.log")
    return hand


def check_by_hand(plan: Plan, work: Path, name: str, checkpoint: Path) -> dict[str, Any]:
    """Run arm `name` by hand with the sweep's first seed; print and return the comparison."""
    grid = {a["name"]: a for a in arms(plan)}
    if name not in grid:
        raise SystemExit(f"--check-by-hand: no arm {name!r}; arms: {', '.join(grid)}")
    seed = plan.seeds[0]
    hand = hand_arm(plan, work, grid[name], checkpoint, seed)
    sweep = work / "sweep"
    swept = json.loads((sweep / "results" / f"{name}-s{seed}.json").read_text())
    check: dict[str, Any] = {"arm": name, "seed": seed}
    check["keys_equal"] = keys_of(hand / "build") == keys_of(sweep / "arms" / name)
    check["samples"] = len(keys_of(hand / "build"))
    loss = (last_loss(hand / f"run-s{seed}"), last_loss(sweep / "runs" / f"{name}-s{seed}"))
    check["loss"] = {"hand": loss[0], "sweep": loss[1], "equal": loss[0] == loss[1]}
    for split in SPLITS:
        mine = json.loads((hand / f"{split}.json").read_text())["metrics"]
        check[split] = {"hand": mine, "sweep": swept[split], "equal": mine == swept[split]}
    check["equal"] = all(
        [check["keys_equal"], check["loss"]["equal"], *(check[s]["equal"] for s in SPLITS)]
    )
    equal = " ".join(f"{s} {check[s]['equal']}" for s in SPLITS)
    verdict = "EQUAL" if check["equal"] else "DIFFERENT"
    print(
        f"by hand {name} seed {seed}: {verdict} (keys {check['keys_equal']}, "
        f"loss {loss[0]} vs {loss[1]}, {equal})"
    )
    return check

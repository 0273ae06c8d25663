"""Bench: the curation loop as one `mmcurate sweep` (issues 18 and 50).

1. Data (bench/curation_data.py): a web-like raw set of captioned scenes (~45% of captions
   about something else, ~25% copies, 2% broken files), a small clean seed set, and held-out
   eval scenes, split in half: a validation split (the sweep chooses on it) and a test split
   (it reports on it).
2. `mmcurate build` (decode only) of the seed set and both splits; `mmcurate train` the filter
   model on the seed set (the sweep's scorer: clip_score with that checkpoint, at
   WORK/runs/filter/checkpoints/step-300.pt: where configs/curation/clip.yaml, and so
   configs/sweep_example.yaml, expect it with the default --work).
3. SWEEP.yaml: the grid `raw`; clip keep_top_fraction at 3 levels; clip + exact and near
   dedupe; mixtures of the raw set and the clean seed set at 3 weights. `mmcurate sweep` scores
   each source once, makes every arm a selection over those scores, trains the same proxy on
   each at equal compute (steps x batch) per seed and evaluates R@1 on both splits.
4. Prints the sweep's table, its recommendation and `scorer_runs` (scoring builds per source),
   and what each arm kept by ground truth. `--check-by-hand ARM` then runs that arm as a user
   would (`mmcurate build` with the threshold, `train`, `eval`, same seed) and says whether its
   numbers equal the sweep's (bench/curation_sweep_hand.py).

Dropped from this bench (the sweep cannot express them): the recaption arm (a build stage that
rewrites captions, not a selection over scores) and the oracle (a selection by ground truth,
which a second scoring of the same files would need). Their last figures in BENCHMARKS.md come
from the bench before issue 50 (git history of this file).

    .venv/bin/python bench/curation.py [--small] [--seeds 0 1 2] [--work runs/curation]
        [--runtime auto|ray|local] [--check-by-hand clip-55] [--resume]

Default grid: 8 arms x 3 seeds; raw 3,000 files, 800 seed pairs, 300 eval scenes (150
validation, 150 test), 150 steps x 64 per run, filter model 300 steps (sized for about 15 min
on 2 shared cores). `--small`: raw 800, seed 300, eval 100, 30 steps
x 32, seeds 0 1.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from mmcurate.pipeline.runtime.loopback import loopback_only_env  # noqa: E402

from bench.curation_data import Sizes, make_sets  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "configs" / "curation"
BIN = Path(sys.executable).parent
MARKER = ".curation-bench"  # marks a work folder this bench made (and may therefore delete)
METRIC = "text_retrieval_recall@1"  # image -> text R@1 (clip_benchmark's name)


@dataclass(frozen=True)
class Plan:
    """What one run does: data sizes, the proxy's compute, the filter model, the grid."""

    sizes: Sizes = Sizes(eval=300, seed=800, raw=3000, popular=15)
    steps: int = 150  # every arm x seed: steps x batch samples (equal compute)
    batch: int = 64
    filter_steps: int = 300  # at work/runs/filter: clip.yaml's default `pretrained`
    keeps: tuple[float, ...] = (0.3, 0.55, 0.8)  # clip keep_top_fraction levels
    dedupe_keep: float = 0.55  # the clip + dedupe arm's keep_top_fraction
    mixes: tuple[float, ...] = (0.9, 0.7, 0.5)  # the raw set's weight; the clean set the rest
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    data_seed: int = 0


SMALL = {"sizes": Sizes(eval=100, seed=300, raw=800, popular=8), "steps": 30, "batch": 32}
SMALL.update(filter_steps=60, seeds=[0, 1])


def env() -> dict[str, str]:
    """Ray on loopback, nothing sent off the machine; torch on one thread per process (two
    spin against the loader worker on 2 cores); this checkout first on PYTHONPATH."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    extra = {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    return {**os.environ, **loopback_only_env(), "RAY_USAGE_STATS_ENABLED": "0", **extra}


def run(cmd: list[str], log: Path, done: Path | None = None) -> float:
    """Run one command, output to `log`; seconds taken (0.0: `done` exists, kept)."""
    if done is not None and done.exists():
        return 0.0
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with log.open("w") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        proc = subprocess.run(cmd, cwd=REPO, env=env(), stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-15:])
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{tail}")
    return time.monotonic() - started


def mmcurate(*args: str) -> list[str]:
    return [str(BIN / "mmcurate"), *args]


def sets(**items: Any) -> list[str]:
    """`--set key=value` for each item (keys with dots passed as `key__sub`)."""
    return [a for k, v in items.items() for a in ("--set", f"{k.replace('__', '.')}={v}")]


def decode_build(source: Path, out: Path) -> int:
    """`mmcurate build` decode.yaml; the build's sample count."""
    cmd = mmcurate("build", str(CONFIGS / "decode.yaml"), "--no-progress")
    cmd += sets(source__path=source, output__path=out)
    run(cmd, out.parent / f"{out.name}.log", out / "manifest.json")
    return json.loads((out / "manifest.json").read_text())["samples"]


def train_cmd(plan: Plan, manifest: Path, out: Path, seed: int) -> list[str]:
    """`mmcurate train` at the bench's compute (the filter model and the by-hand check)."""
    cmd = mmcurate("train", str(CONFIGS / "train.yaml"))
    return cmd + sets(
        data__manifest=manifest,
        run__output=out,
        data__seed=seed,
        run__max_steps=plan.steps,
        data__batch_size=plan.batch,
        run__log_every=plan.steps,
    )


def split_eval(data: Path) -> tuple[Path, Path]:
    """The held-out scenes in two halves (hard links): validation and test."""
    keys = sorted(p.stem for p in (data / "eval").glob("*.jpg"))
    half = len(keys) // 2
    folders = (data / "eval-val", data / "eval-test")
    for folder, part in zip(folders, (keys[:half], keys[half:]), strict=True):
        folder.mkdir(exist_ok=True)
        for key in part:
            for ext in ("jpg", "txt"):
                if not (folder / f"{key}.{ext}").exists():
                    os.link(data / "eval" / f"{key}.{ext}", folder / f"{key}.{ext}")
    return folders


def prepare(plan: Plan, work: Path) -> dict[str, Any]:
    """Data, the decode builds of the seed set and both splits, the filter model."""
    data, builds = work / "data", work / "builds"
    if not (data / "truth.json").exists():
        make_sets(data, plan.sizes, plan.data_seed)
    truth = json.loads((data / "truth.json").read_text())
    val, test = split_eval(data)
    samples = {
        name: decode_build(src, builds / name)
        for name, src in (("seed", data / "seed"), ("eval-val", val), ("eval-test", test))
    }
    filter_run = work / "runs" / "filter"
    filter_plan = Plan(**{**asdict(plan), "sizes": plan.sizes, "steps": plan.filter_steps})
    cmd = train_cmd(filter_plan, builds / "seed" / "manifest.json", filter_run, 100)
    checkpoint = filter_run / "checkpoints" / f"step-{plan.filter_steps}.pt"
    run(cmd, work / "runs" / "filter.log", checkpoint)
    return {"counts": truth["counts"], "builds": samples, "checkpoint": checkpoint}


def arms(plan: Plan) -> list[dict[str, Any]]:
    """The grid: raw, clip at each keep, clip + dedupe, the mixtures."""
    grid: list[dict[str, Any]] = [{"name": "raw", "weights": {"raw": 1}}]
    for keep in plan.keeps:
        grid.append({"name": f"clip-{round(keep * 100)}", "keep_top_fraction": keep})
    grid.append(
        {
            "name": f"clip-{round(plan.dedupe_keep * 100)}-dedupe",
            "dedupe": True,
            "keep_top_fraction": plan.dedupe_keep,
        }
    )
    for w in plan.mixes:
        name = f"mix-{round(w * 100)}-{round((1 - w) * 100)}"
        grid.append({"name": name, "weights": {"raw": w, "clean": round(1 - w, 6)}})
    for arm in grid:
        arm.setdefault("weights", {"raw": 1})
    return grid


def proxy_tree(work: Path, batch: int, steps: int) -> dict[str, Any]:
    """What every curation sweep shares: the proxy's train.yaml at batch x steps (equal
    compute per arm), eval.yaml, and the held-out splits decode-built under work/builds."""
    train = yaml.safe_load((CONFIGS / "train.yaml").read_text())
    train["data"]["batch_size"] = batch
    train["run"].update(max_steps=steps, log_every=steps)
    builds = work / "builds"
    return {
        "train": train,
        "eval": yaml.safe_load((CONFIGS / "eval.yaml").read_text()),
        "splits": {
            "validation": str(builds / "eval-val" / "manifest.json"),
            "test": str(builds / "eval-test" / "manifest.json"),
        },
    }


def sweep_tree(plan: Plan, work: Path, checkpoint: Path) -> dict[str, Any]:
    """SWEEP.yaml: the bench's clip.yaml / train.yaml / eval.yaml at the plan's sizes."""
    build = yaml.safe_load((CONFIGS / "clip.yaml").read_text())
    build["stages"][1]["pretrained"] = str(checkpoint)
    return {
        "build": build,
        "sources": {"raw": str(work / "data" / "raw"), "clean": str(work / "data" / "seed")},
        "dedupe": [{"name": "exact_dedupe"}, {"name": "near_dedupe", "radius": 4}],
        **proxy_tree(work, plan.batch, plan.steps),
        "metric": METRIC,
        "seeds": plan.seeds,
        "arms": arms(plan),
        "output": str(work / "sweep"),
    }


def composition(arm: Path, roles: dict[str, dict]) -> dict[str, int]:
    """What an arm kept, by ground truth (mixture keys carry a `raw_` / `clean_` prefix)."""
    counts = {"clean": 0, "mismatched": 0, "copies": 0, "clean_source": 0}
    manifest = json.loads((arm / "manifest.json").read_text())
    for shard in manifest["shards"]:
        with tarfile.open(arm / shard["name"]) as tar:
            for name in tar.getnames():
                if not name.endswith(".txt"):
                    continue
                key = name.partition(".")[0]
                if key.startswith("clean_") or key.startswith("seed_"):
                    counts["clean_source"] += 1
                    continue
                role = roles[key.removeprefix("raw_")]
                counts["copies" if "of" in role else role["role"]] += 1
    return counts


def prepare_work(work: Path, plan: dict, resume: bool) -> None:
    """A new work folder (an old one removed only if this bench made it), or with `resume`
    the old one if it was made for the same plan."""
    if work.exists() and not (work / MARKER).exists():
        raise SystemExit(f"{work} exists and was not made by this bench; choose --work")
    if resume and work.exists():
        if json.loads((work / MARKER).read_text()) != json.loads(json.dumps(plan)):
            raise SystemExit(f"{work} was made for another plan; run without --resume")
        return
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    (work / MARKER).write_text(json.dumps(plan) + "\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="the small preset (see above)")
    parser.add_argument("--seeds", type=int, nargs="+", help="default: the preset's")
    parser.add_argument("--steps", type=int, help="proxy steps per arm x seed")
    parser.add_argument("--work", default="runs/curation", help="scratch (replaced)")
    parser.add_argument("--runtime", choices=["auto", "ray", "local"], default="auto")
    parser.add_argument("--check-by-hand", metavar="ARM", help="rerun ARM by hand, compare")
    parser.add_argument("--resume", action="store_true", help="keep --work; run the rest")
    parser.add_argument("--out", default="runs/curation-results.json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    plan = Plan(**(SMALL if args.small else {}))
    changes = {"seeds": args.seeds, "steps": args.steps}
    plan = Plan(**{**asdict(plan), "sizes": plan.sizes, **{k: v for k, v in changes.items() if v}})
    work = (REPO / args.work).resolve()
    started = time.monotonic()
    tree = {**asdict(plan), "sizes": asdict(plan.sizes)}
    prepare_work(work, {k: v for k, v in tree.items() if k != "seeds"}, args.resume)
    ready = prepare(plan, work)
    print(f"data: {ready['counts']}; decode builds: {ready['builds']}", flush=True)
    sweep_file = work / "SWEEP.yaml"
    sweep_file.write_text(yaml.safe_dump(sweep_tree(plan, work, ready["checkpoint"])))
    cmd = mmcurate("sweep", str(sweep_file), "--runtime", args.runtime)
    seconds = run(cmd, work / "sweep.log")
    result = json.loads((work / "sweep" / "results.json").read_text())
    roles = json.loads((work / "data" / "truth.json").read_text())["roles"]
    kept = {a: composition(work / "sweep" / "arms" / a, roles) for a in result["kept"]}
    print(result["table"], "\n", result["recommendation"]["text"], sep="")
    print(f"scorer_runs: {json.dumps(result['scorer_runs'])}")
    for arm, counts in kept.items():
        print(f"kept by truth {arm:<16} {counts}")
    out = {
        "plan": tree,
        "data": ready["counts"],
        "sweep_seconds": round(seconds, 1),
        "kept_by_truth": kept,
        "sweep": result,
        "command": " ".join(sys.argv),
    }
    if args.check_by_hand:
        from bench.curation_sweep_hand import check_by_hand

        out["by_hand"] = check_by_hand(plan, work, args.check_by_hand, ready["checkpoint"])
    out["seconds"] = round(time.monotonic() - started, 1)
    (REPO / args.out).parent.mkdir(parents=True, exist_ok=True)
    (REPO / args.out).write_text(json.dumps(out, indent=1, default=str) + "\n")
    print(f"total {out['seconds']:.0f} s (sweep {seconds:.0f} s); results: {args.out}")


if __name__ == "__main__":
    main()

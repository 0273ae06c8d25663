"""Bench: the closed curation loop, every step one of mmcurate's documented commands (issue 18).

1. Data (bench/curation_data.py): a web-like raw set of captioned scenes (~45% of captions
   about something else, ~25% exact copies and near-duplicates with a few scenes copied many
   times, 2% broken files), a small clean seed set, and a held-out eval set never trained on.
2. `mmcurate train` a filter model on the seed set (as LAION filtered with a CLIP trained
   elsewhere).
3. `mmcurate build`, all from the same raw files: `noisy` (decode only); `clip` (+ clip_score
   with the filter model, keep_top_fraction); `clip_dedupe` (+ exact, near and semantic
   dedupe); `recaption` (clip_score, then `recaption` with `choose: fill` at the clip arm's
   threshold: what the clip arm drops gets a caption from a tiny BLIP-2 trained on the seed
   set, bench/curation_captioner.py, kept if it scores as high; bench/curation_recaption.py);
   `oracle` (decode only, on the raw files that are distinct and truly captioned).
4. `mmcurate train` the same architecture at equal compute (same steps x batch) on each arm,
   for each seed; `mmcurate eval` (python -m mmcurate.trainer.eval) retrieval R@1 on the eval build.
5. JSON of everything, and a markdown table: R@1 both directions per arm (mean ± sd over
   seeds) and the share of the oracle gain each filtered arm recovers.

    .venv/bin/python bench/curation.py [--quick] [--seeds 0 1 2] [--work runs/curation]
        [--lock /tmp/mmcurate-ray.lock] [--out runs/curation-results.json] [--resume]

--lock FILE runs each build (the only steps that start Ray) under `flock FILE`, for machines
where several Ray users take turns. --work is replaced on every run (only if this bench made
it); --resume keeps the outputs of an interrupted run of the same plan and does the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from mmcurate.pipeline.runtime.loopback import loopback_only_env

from bench.curation_data import Sizes, make_sets  # noqa: E402
from bench.curation_recaption import lowest_kept_score, recaption_sets, recaptioned  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "configs" / "curation"
BIN = Path(sys.executable).parent
MARKER = ".curation-bench"  # marks a work folder this bench made (and may therefore delete)
ARMS = ("noisy", "clip", "recaption", "clip_dedupe", "oracle")
FILTERED = ("clip", "recaption", "clip_dedupe")
I2T, T2I = "text_retrieval_recall@1", "image_retrieval_recall@1"  # clip_benchmark's names


@dataclass(frozen=True)
class Plan:
    """What one run of the bench does; `--quick` is a small version for smoke checks."""

    sizes: Sizes = Sizes()
    steps: int = 300  # every arm: steps x batch samples (equal compute)
    batch: int = 128
    filter_steps: int = 300
    caption_steps: int = 1000  # the captioner's training (batch 64), not the arms' compute
    keep: float = 0.55  # keep_top_fraction: the share of raw captions expected to fit (~55%)
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    data_seed: int = 0


QUICK = {"sizes": Sizes(eval=100, seed=500, raw=1600, popular=8), "steps": 150}
QUICK.update(filter_steps=150, caption_steps=300)


def env() -> dict[str, str]:
    """This process's environment, Ray on loopback, nothing sent off the machine; torch on one
    thread per process: with a loader worker on the other core, torch's default two threads
    spin against it (measured here: 67-160 samples/s with two, 330-400 with one). The repo
    first on PYTHONPATH: the commands run this checkout's packages even when the venv's
    editable install predates a package (as `ray job submit --working-dir .` would)."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {
        **os.environ,
        **loopback_only_env(),
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": path,
    }


RESUME = {"on": False}  # --resume: a step whose output exists is not run again


def run(cmd: list[str], log: Path, lock: str | None = None, done: Path | None = None) -> float:
    """Run one command (under `flock lock` when given), output to `log`; seconds taken (0.0:
    skipped under --resume because `done` exists)."""
    if RESUME["on"] and done is not None and done.exists():
        return 0.0
    if lock:
        cmd = ["flock", lock, *cmd]
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with log.open("w") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        done = subprocess.run(cmd, cwd=REPO, env=env(), stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-15:])
        raise SystemExit(f"failed ({done.returncode}): {' '.join(cmd)}\n{tail}")
    return time.monotonic() - started


def build(
    config: str, source: Path, out: Path, lock: str | None, sets: list[str] | None = None
) -> dict:
    """`mmcurate build` one arm; its sample count, drops per stage and seconds."""
    cmd = [str(BIN / "mmcurate"), "build", str(CONFIGS / config), "--no-progress"]
    for item in [f"source.path={source}", f"output.path={out}", *(sets or [])]:
        cmd += ["--set", item]
    seconds = run(cmd, out.parent / f"{out.name}.log", lock, out / "manifest.json")
    stats = json.loads((out / "stats.json").read_text())
    manifest = json.loads((out / "manifest.json").read_text())
    drops = {s["name"]: s["dropped"] for s in stats["stages"] if s["dropped"]}
    return {"samples": manifest["samples"], "dropped": drops, "seconds": round(seconds, 1)}


def train(manifest: Path, out: Path, seed: int, steps: int, batch: int) -> dict:
    """`mmcurate train` at the bench's fixed compute; loss and seconds."""
    cmd = [str(BIN / "mmcurate"), "train", str(CONFIGS / "train.yaml")]
    for item in (
        f"data.manifest={manifest}",
        f"run.output={out}",
        f"data.seed={seed}",
        f"run.max_steps={steps}",
        f"data.batch_size={batch}",
    ):
        cmd += ["--set", item]
    seconds = run(
        cmd, out.parent / f"{out.name}.log", done=out / "checkpoints" / f"step-{steps}.pt"
    )
    lines = (out / "metrics.jsonl").read_text().splitlines()
    last = json.loads(lines[-1])
    return {"loss": round(last["loss"], 4), "steps": last["step"], "seconds": round(seconds, 1)}


def train_captioner(seed_build: Path, out: Path, plan: Plan) -> dict:
    """bench/curation_captioner.py: the recaption arm's tiny BLIP-2, on the seed build."""
    script, steps = str(REPO / "bench" / "curation_captioner.py"), str(plan.caption_steps)
    cmd = [sys.executable, script, str(seed_build), str(out), "--steps", steps]
    run(cmd, out.parent / "captioner.log", done=out / "training.json")
    return json.loads((out / "training.json").read_text())


def eval_command() -> list[str]:
    """`mmcurate eval` (the same as `python -m mmcurate.trainer.eval`)."""
    probe = subprocess.run(
        [str(BIN / "mmcurate"), "eval", "--help"], cwd=REPO, env=env(), capture_output=True
    )
    return (
        [str(BIN / "mmcurate"), "eval"]
        if probe.returncode == 0
        else [sys.executable, "-m", "mmcurate.trainer.eval"]
    )


def evaluate(command: list[str], run_dir: Path, manifest: Path) -> dict:
    """Retrieval R@1 both directions of a train run on the held-out build."""
    out = run_dir.parent / f"{run_dir.name}.eval.json"
    cmd = [*command, str(CONFIGS / "eval.yaml"), "--out", str(out), "--no-progress"]
    cmd += ["--set", f"model.pretrained={run_dir}", "--set", f"retrieval.manifest={manifest}"]
    seconds = run(cmd, run_dir.parent / f"{run_dir.name}.eval.log", done=out)
    metrics = json.loads(out.read_text())["metrics"]
    return {"i2t": metrics[I2T], "t2i": metrics[T2I], "seconds": round(seconds, 1)}


def build_keys(out: Path) -> list[str]:
    """Sample keys in a build's shards (members are `<key>.<ext>`; keys have no dots)."""
    manifest = json.loads((out / "manifest.json").read_text())
    keys: set[str] = set()
    for shard in manifest["shards"]:
        with tarfile.open(out / shard["name"]) as tar:
            keys.update(name.partition(".")[0] for name in tar.getnames())
    return sorted(keys)


def composition(keys: list[str], roles: dict[str, dict]) -> dict[str, int]:
    """What a build kept, by ground truth: truly captioned scenes, mismatched ones, copies of
    each, and how many distinct truly captioned scenes are in it at all."""
    counts = {"clean": 0, "mismatched": 0, "copy_of_clean": 0, "copy_of_mismatched": 0}
    scenes: set[str] = set()
    for key in keys:
        role = roles[key]
        source = role.get("of", key)
        kind = roles[source]["role"]
        counts[f"copy_of_{kind}" if "of" in role else kind] += 1
        if kind == "clean":
            scenes.add(source)
    return {**counts, "distinct_clean_scenes": len(scenes)}


def semantic_pairs(out: Path, roles: dict[str, dict]) -> dict[str, dict[str, float]]:
    """Why semantic dedupe does what it does: with the image embeddings clip_score wrote, the
    share of item pairs within each eps (cosine >= 1 - eps) that are copies of one scene,
    distinct scenes with the same description, and scenes with different descriptions."""
    import numpy as np
    import pyarrow.parquet as pq

    folder = out / "embeddings"
    keys = pq.read_table(sorted((folder / "metadata").glob("*.parquet"))).column("key")
    vectors = np.concatenate([np.load(f) for f in sorted((folder / "img_emb").glob("*.npy"))])
    vectors = vectors.astype(np.float32)
    source = [roles[k].get("of", k) for k in keys.to_pylist()]
    scene = np.array([json.dumps(roles[s]["scene"], sort_keys=True) for s in source])
    upper = np.triu_indices(len(source), 1)
    cosine = (vectors @ vectors.T)[upper]
    same_source = (np.array(source)[:, None] == np.array(source)[None, :])[upper]
    same_scene = (scene[:, None] == scene[None, :])[upper] & ~same_source
    groups = {"copies": same_source, "same_description": same_scene}
    groups["other_description"] = ~same_source & ~same_scene
    result = {}
    for eps in (0.05, 0.01, 0.005, 0.001):
        hit = cosine >= 1 - eps
        result[str(eps)] = {name: float(hit[m].mean()) for name, m in groups.items()}
    return result


def prepare_work(work: Path, plan: dict, resume: bool) -> dict:
    """A new, empty work folder (an old one is removed only if this bench made it), or, with
    `resume`, the old one if it was made for the same plan; returns the data's counts."""
    if work.exists() and not (work / MARKER).exists():
        raise SystemExit(f"{work} exists and was not made by this bench; choose --work")
    if resume and (work / "data" / "truth.json").exists():
        if json.loads((work / MARKER).read_text()) != plan:
            raise SystemExit(f"{work} was made for another plan; run without --resume")
        truth = json.loads((work / "data" / "truth.json").read_text())
        return {k: v for k, v in truth.items() if k != "roles"}
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    (work / MARKER).write_text(json.dumps(plan) + "\n")  # made here; the next run may remove it
    sizes = Sizes(**plan["sizes"])
    return make_sets(work / "data", sizes, plan["data_seed"])


def spread(values: list[float]) -> dict[str, float]:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"mean": statistics.fmean(values), "sd": sd, "min": min(values), "max": max(values)}


def summarize(evals: dict[str, list[dict]]) -> dict[str, Any]:
    """Per arm: R@1 mean/sd/min/max over seeds; per filtered arm: the share of the oracle gain,
    (arm - noisy) / (oracle - noisy), of the seed means and per seed (paired by seed)."""
    out: dict[str, Any] = {}
    for arm, rows in evals.items():
        out[arm] = {d: spread([r[d] for r in rows]) for d in ("i2t", "t2i")}
    for arm in FILTERED:
        for d in ("i2t", "t2i"):
            noisy, oracle = out["noisy"][d]["mean"], out["oracle"][d]["mean"]
            gain = oracle - noisy
            out[arm][d]["oracle_gain_share"] = (
                (out[arm][d]["mean"] - noisy) / gain if gain else None
            )
            per_seed = [
                (a[d] - n[d]) / (o[d] - n[d])
                for a, n, o in zip(evals[arm], evals["noisy"], evals["oracle"], strict=True)
                if o[d] != n[d]
            ]
            out[arm][d]["oracle_gain_share_per_seed"] = per_seed
    return out


def share_text(cell: dict) -> str:
    share, seeds = cell.get("oracle_gain_share"), cell.get("oracle_gain_share_per_seed", [])
    if share is None:
        return "–"
    text = f"{100 * share:.0f}%"
    if len(seeds) > 1:
        text += f" ({100 * min(seeds):.0f}–{100 * max(seeds):.0f}%)"
    return text


def table(summary: dict, builds: dict, seeds: int) -> str:
    """Markdown: one row per arm."""
    lines = [
        f"| arm | samples | image→text R@1 (mean ± sd, {seeds} seeds) | text→image R@1 | "
        "oracle gain recovered, i→t (per-seed range) | t→i |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for arm in ARMS:
        cells = summary[arm]
        row = [arm, str(builds[arm]["samples"])]
        row += [f"{cells[d]['mean']:.3f} ± {cells[d]['sd']:.3f}" for d in ("i2t", "t2i")]
        row += [share_text(cells[d]) for d in ("i2t", "t2i")]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def make_builds(plan: Plan, data: Path, builds: Path, lock: str | None) -> dict:
    """The filter model, then every arm's build and the eval build."""
    done: dict[str, Any] = {}
    done["seed"] = build("decode.yaml", data / "seed", builds / "seed", lock)
    done["eval"] = build("decode.yaml", data / "eval", builds / "eval", lock)
    filter_run = builds.parent / "runs" / "filter"
    done["filter_model"] = train(
        builds / "seed" / "manifest.json", filter_run, 100, plan.filter_steps, plan.batch
    )
    checkpoint = filter_run / "checkpoints" / f"step-{plan.filter_steps}.pt"
    clip = [f"stages.1.pretrained={checkpoint}", f"stages.1.keep_top_fraction={plan.keep}"]
    done["noisy"] = build("decode.yaml", data / "raw", builds / "noisy", lock)
    done["clip"] = build("clip.yaml", data / "raw", builds / "clip", lock, clip)
    done["captioner"] = train_captioner(builds / "seed", builds.parent / "captioner", plan)
    sets = recaption_sets(
        checkpoint, builds.parent / "captioner", lowest_kept_score(builds / "clip")
    )
    done["recaption"] = build("recaption.yaml", data / "raw", builds / "recaption", lock, sets)
    clip.append(f"stages.4.pretrained={checkpoint}")  # semantic_dedupe loads it too
    done["clip_dedupe"] = build(
        "clip_dedupe.yaml", data / "raw", builds / "clip_dedupe", lock, clip
    )
    done["oracle"] = build("decode.yaml", data / "oracle", builds / "oracle", lock)
    return done


def train_arms(plan: Plan, work: Path) -> dict[str, list[dict]]:
    """Every arm x seed: train at equal compute, evaluate on the held-out build. clip and
    recaption first for every seed (a run cut short still has that comparison), then the rest."""
    command = eval_command()
    eval_manifest = work / "builds" / "eval" / "manifest.json"
    evals: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    first = ("clip", "recaption")
    order = [(s, a) for s in plan.seeds for a in first]
    order += [(s, a) for s in plan.seeds for a in ARMS if a not in first]
    for seed, arm in order:
        run_dir = work / "runs" / f"{arm}-s{seed}"
        manifest = work / "builds" / arm / "manifest.json"
        row = {"seed": seed, **train(manifest, run_dir, seed, plan.steps, plan.batch)}
        row["train_seconds"] = row.pop("seconds")
        row.update(evaluate(command, run_dir, eval_manifest))
        evals[arm].append(row)
        print(f"  seed {seed} {arm:<12} i2t {row['i2t']:.3f}  t2i {row['t2i']:.3f}", flush=True)
    return evals


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a much smaller run (smoke check)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, help="training steps per arm (default: the plan's)")
    parser.add_argument("--keep", type=float, default=0.55, help="clip_score keep_top_fraction")
    parser.add_argument("--work", default="runs/curation", help="scratch folder (replaced)")
    parser.add_argument("--lock", help="flock file held around each build (builds start Ray)")
    parser.add_argument("--out", default="runs/curation-results.json")
    parser.add_argument(
        "--resume", action="store_true", help="keep --work's outputs of the same plan; run the rest"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    plan = Plan(**(QUICK if args.quick else {}), keep=args.keep, seeds=args.seeds)
    if args.steps:
        plan = Plan(**{**asdict(plan), "sizes": plan.sizes, "steps": args.steps})
    work = (REPO / args.work).resolve()
    started = time.monotonic()
    RESUME["on"] = args.resume
    plan_tree = {**asdict(plan), "sizes": asdict(plan.sizes)}
    data = prepare_work(work, {k: v for k, v in plan_tree.items() if k != "seeds"}, args.resume)
    print(f"data: {data['counts']} (oracle {data['oracle']})", flush=True)
    builds = make_builds(plan, work / "data", work / "builds", args.lock)
    roles = json.loads((work / "data" / "truth.json").read_text())["roles"]
    kept = {arm: composition(build_keys(work / "builds" / arm), roles) for arm in ARMS}
    for arm in ARMS:
        print(f"build {arm:<12} {builds[arm]['samples']:>5} samples  {kept[arm]}", flush=True)
    kept["recaption"]["captions"] = recaptioned(work / "builds" / "recaption", roles)
    print(f"recaption arm captions: {kept['recaption']['captions']}", flush=True)
    pairs = semantic_pairs(work / "builds" / "clip", roles)
    print(f"clip build, share of pairs within eps: {pairs}", flush=True)
    evals = train_arms(plan, work)
    summary = summarize(evals)
    result = {
        "plan": plan_tree,
        "data": data,
        "builds": builds,
        "kept": kept,
        "semantic_pairs": pairs,
        "evals": evals,
        "summary": summary,
        "seconds": round(time.monotonic() - started, 1),
        "command": " ".join(sys.argv),
    }
    out = REPO / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(table(summary, builds, len(plan.seeds)))
    print(f"total {result['seconds']:.0f} s; results: {out}")


if __name__ == "__main__":
    main()

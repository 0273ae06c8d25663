"""Bench: the curation loop's noise split into the finite eval set and the training seed, and
the eval size and seeds that make two arms separable (issue 50).

1. Trained proxies of two arms (default clip-30 and clip-55, the bench's best two): reused
   from a finished bench/curation.py work folder (`--reuse WORK`; seeds it lacks are trained
   by its own SWEEP.yaml into --work), or trained here by one `mmcurate sweep` of the two arms.
2. K fresh eval sets of N scenes (bench/curation_data.py's eval phrasing, new streams), each
   decode-built; every model of both arms is evaluated on every set (R@1 both ways).
3. Per arm, r[seed s, set k] = mu + u_s + v_k + e_sk (u: training seed; v: which scenes, shared
   by the models; e: one model's hits on one set, binomial-like), variances by mean squares.
   The difference of the arms' means over S seeds on m sets of N (shared by both arms):
       var = (su_A + su_B) / S + var(v_A - v_B) / m + (se_A + se_B) / (S m)
   separable when the gap > 2 x its SE. Also how often the sweep's own rule (min-max ranges
   over seeds apart) separates them, and checks: fit on half the seeds and sets, test on the
   other half; one split of --check-scenes in one gallery; the sweep's own splits.

    .venv/bin/python bench/curation_noise.py --reuse runs/curation [--seeds 0 1 2 3] [--sets 12]
    .venv/bin/python bench/curation_noise.py --quick    # train 2 arms x 2 seeds, small (~1 min)

`--quick`: bench/curation.py's --small data and proxy, seeds 0 1, 4 eval sets of 150.
Without --reuse: the bench's default sizes, seeds 0 1 2, 8 sets of 150.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from bench.curation import (  # noqa: E402
    CONFIGS,
    REPO,
    SMALL,
    Plan,
    decode_build,
    mmcurate,
    prepare,
    prepare_work,
    run,
    sweep_tree,
)
from bench.curation_data import clean_set  # noqa: E402

METRICS = {"i2t": "text_retrieval_recall@1", "t2i": "image_retrieval_recall@1"}
SEEDS_UP_TO = 12  # the sizing table's seeds
SETS_UP_TO = (1, 2, 3)  # eval sizes in the table: m sets of N (516 distinct captions in all)


def train_pair(plan: Plan, work: Path, names: list[str], resume: bool) -> Path:
    """One `mmcurate sweep` over only the two arms, as bench/curation.py sets it up."""
    tree = {**asdict(plan), "sizes": asdict(plan.sizes)}
    prepare_work(work, {k: v for k, v in tree.items() if k != "seeds"}, resume)
    ready = prepare(plan, work)
    sweep = sweep_tree(plan, work, ready["checkpoint"])
    sweep["arms"] = [a for a in sweep["arms"] if a["name"] in names]
    missing = set(names) - {a["name"] for a in sweep["arms"]}
    if missing:
        raise SystemExit(f"not arms of bench/curation.py's grid: {sorted(missing)}")
    (work / "SWEEP.yaml").write_text(yaml.safe_dump(sweep))
    seconds = run(mmcurate("sweep", str(work / "SWEEP.yaml")), work / "sweep.log")
    print(f"sweep of {names} x seeds {plan.seeds}: {seconds:.0f} s", flush=True)
    return work / "sweep" / "runs"


def trained(folder: Path) -> bool:
    return any((folder / "checkpoints").glob("step-*.pt"))


def more_seeds(reuse: Path, work: Path, names: list[str], seeds: list[int]) -> Path:
    """Seeds the reused folder lacks: its own SWEEP.yaml (same data, scorer, proxy) over only
    the two arms and those seeds, into WORK/sweep (the reused folder is only read)."""
    sweep = yaml.safe_load((reuse / "SWEEP.yaml").read_text())
    sweep["arms"] = [a for a in sweep["arms"] if a["name"] in names]
    runs = work / "sweep" / "runs"
    places = (reuse / "sweep" / "runs", runs)
    missing = [
        s for s in seeds if not all(any(trained(p / f"{a}-s{s}") for p in places) for a in names)
    ]
    if missing:
        sweep.update(seeds=missing, output=str(work / "sweep"))
        (work / "SWEEP.yaml").write_text(yaml.safe_dump(sweep))
        seconds = run(mmcurate("sweep", str(work / "SWEEP.yaml")), work / "sweep.log")
        print(f"sweep of {names} x seeds {missing}: {seconds:.0f} s", flush=True)
    return runs


def run_dirs(places: list[Path], names: list[str], seeds: list[int]) -> dict[str, dict]:
    """Each arm x seed's run folder (the first place that has it trained)."""
    out: dict[str, dict[int, Path]] = {}
    for arm in names:
        out[arm] = {}
        for seed in seeds:
            found = [p / f"{arm}-s{seed}" for p in places if trained(p / f"{arm}-s{seed}")]
            if not found:
                raise SystemExit(f"no trained run of {arm} seed {seed} in {places}")
            out[arm][seed] = found[0]
    return out


def eval_sets(scratch: Path, count: int, scenes: int, data_seed: int) -> list[Path]:
    """`count` fresh held-out sets of `scenes` each (streams unused by make_sets), built."""
    manifests = []
    for i in range(count):
        folder = scratch / "data" / f"noise{i:02d}"
        if not folder.exists():
            clean_set(folder, scenes, np.random.default_rng([data_seed, 1000 + i]), fixed=True)
        out = scratch / "builds" / f"noise{i:02d}"
        if decode_build(folder, out) != scenes:
            raise SystemExit(f"{out}: the decode build lost scenes")
        manifests.append(out / "manifest.json")
    return manifests


def evaluate_grid(dirs: dict, manifests: list[Path], cache: Path) -> dict[str, Any]:
    """R@1 of every arm x seed x eval set (cached per cell, so a rerun goes on)."""
    import torch
    from mmcurate.pipeline.sweep.task import eval_tree

    import mmcurate

    torch.set_num_threads(1)  # 2 shared cores
    base = yaml.safe_load((CONFIGS / "eval.yaml").read_text())
    cells: dict[str, Any] = json.loads(cache.read_text()) if cache.exists() else {}
    for arm, seeds in dirs.items():
        for seed, folder in seeds.items():
            for k, manifest in enumerate(manifests):
                key = f"{arm}|{seed}|{k}"
                if key not in cells:
                    tree = eval_tree(base, "mmcurate-tiny", str(folder), str(manifest))
                    metrics = mmcurate.evaluate(tree)["metrics"]
                    cells[key] = {d: metrics[m] for d, m in METRICS.items()}
                    cache.write_text(json.dumps(cells) + "\n")
    return cells


def table(cells: dict, arm: str, seeds: list[int], sets: int, d: str) -> np.ndarray:
    return np.array([[cells[f"{arm}|{s}|{k}"][d] for k in range(sets)] for s in seeds])


def components(r: np.ndarray) -> dict[str, float]:
    """Two-way mean squares of r[seed, set] (no replication): the variances of u, v, e."""
    s, k = r.shape
    rows, cols, grand = r.mean(axis=1), r.mean(axis=0), r.mean()
    resid = r - rows[:, None] - cols[None, :] + grand
    ms_e = float((resid**2).sum() / ((s - 1) * (k - 1)))
    ms_seed = float(k * ((rows - grand) ** 2).sum() / (s - 1))
    ms_set = float(s * ((cols - grand) ** 2).sum() / (k - 1))
    within = float(r.var(axis=1, ddof=1).mean())  # one model over eval sets: all eval noise
    p = float(grand)
    return {
        "mean": p,
        "seed_var": max(0.0, (ms_seed - ms_e) / k),
        "set_var": max(0.0, (ms_set - ms_e) / s),
        "resid_var": ms_e,
        "one_model_sets_sd": within**0.5,
        "binomial_sd": 0.0,  # set by pair_noise, which knows the set's size
        "seed_sd_on_all_sets": float(rows.std(ddof=1)),
    }


def pair_noise(ra: np.ndarray, rb: np.ndarray, scenes: int) -> dict[str, Any]:
    """Both arms' components, and the eval-set variance of their difference (shared sets)."""
    ca, cb = components(ra), components(rb)
    for c in (ca, cb):
        c["binomial_sd"] = (c["mean"] * (1 - c["mean"]) / scenes) ** 0.5 if scenes else 0.0
    s = ra.shape[0]
    cols = ra.mean(axis=0) - rb.mean(axis=0)
    set_diff = max(0.0, float(cols.var(ddof=1)) - (ca["resid_var"] + cb["resid_var"]) / s)
    out = {"a": ca, "b": cb, "set_diff_var": set_diff, "gap": ca["mean"] - cb["mean"]}
    return {**out, "size": list(ra.shape)}


def se_diff(noise: dict, seeds: int, sets: float) -> float:
    a, b = noise["a"], noise["b"]
    var = (a["seed_var"] + b["seed_var"]) / seeds + noise["set_diff_var"] / sets
    return float((var + (a["resid_var"] + b["resid_var"]) / (seeds * sets)) ** 0.5)


def sizing(noise: dict, scenes: int) -> dict[str, Any]:
    """SE of the difference by (eval scenes, seeds); the fewest seeds with gap > 2 SE."""
    gap, grid, fewest = abs(noise["gap"]), {}, {}
    for m in SETS_UP_TO:
        row = {s: se_diff(noise, s, m) for s in range(1, SEEDS_UP_TO + 1)}
        grid[m * scenes] = row
        ok = [s for s, se in row.items() if gap > 2 * se]
        fewest[m * scenes] = ok[0] if ok else None
    rule = {m * scenes: {s: range_rule(noise, s, m) for s in (2, 3, 5, 8)} for m in SETS_UP_TO}
    out = {"gap": noise["gap"], "se": grid, "fewest_seeds": fewest, "range_rule": rule}
    return {**out, "se_this_run": se_diff(noise, *noise["size"])}


def range_rule(noise: dict, seeds: int, sets: int, draws: int = 20000) -> float:
    """How often the sweep's own rule (pipeline/sweep/report.py: the better arm's lowest seed
    above the other's highest) calls the pair separable at this size, under the fitted
    components (Monte Carlo; the eval-set effect shared by the seeds of an arm)."""
    rng = np.random.default_rng(0)
    a, b = noise["a"], noise["b"]
    shared = rng.normal(0, (noise["set_diff_var"] / sets) ** 0.5, draws)[:, None]
    sd_a = (a["seed_var"] + a["resid_var"] / sets) ** 0.5
    sd_b = (b["seed_var"] + b["resid_var"] / sets) ** 0.5
    va = a["mean"] + shared + rng.normal(0, sd_a, (draws, seeds))
    vb = b["mean"] + rng.normal(0, sd_b, (draws, seeds))
    if noise["gap"] < 0:
        va, vb = vb, va
    return float((va.min(axis=1) > vb.max(axis=1)).mean())


def halves(cells: dict, names: list[str], seeds: list[int], sets: int, d: str) -> dict:
    """The check: components and sizing from the first half of the seeds and sets, then the
    gap and its predicted SE on the other half (disjoint models and scenes)."""
    hs, hk = len(seeds) // 2, sets // 2
    if hs < 2 or hk < 2:
        return {}
    full = [table(cells, arm, seeds, sets, d) for arm in names]
    fit = pair_noise(full[0][:hs, :hk], full[1][:hs, :hk], 0)
    rest = [r[hs:, hk:] for r in full]
    gap = float(rest[0].mean() - rest[1].mean())
    se = se_diff(fit, len(seeds) - hs, sets - hk)
    out = {"fit_gap": fit["gap"], "fit_seeds": seeds[:hs], "fit_sets": hk}
    out.update(check_seeds=seeds[hs:], check_sets=sets - hk, check_gap=gap, predicted_se=se)
    out["separable"] = abs(gap) > 2 * se
    return out


def size_check(dirs: dict, noise_dir: Path, scenes: int, per_set: int, d: str) -> dict:
    """One sweep-like split of `scenes` scenes in ONE gallery (fresh, stream 2000): each arm's
    sd over seeds on it, measured and as predicted from the sets of `per_set` (the model x set
    part scaled by per_set / scenes), and the gap against its predicted SE."""
    folder = noise_dir / "data" / f"check{scenes}"
    if not folder.exists():
        clean_set(folder, scenes, np.random.default_rng([0, 2000]), fixed=True)
    build = noise_dir / "builds" / folder.name
    decode_build(folder, build)
    cells = evaluate_grid(dirs, [build / "manifest.json"], noise_dir / f"{folder.name}.json")
    names, out = list(dirs), {"scenes": scenes}
    vals = {a: [cells[f"{a}|{s}|0"][d] for s in dirs[a]] for a in names}
    out["mean"] = {a: float(np.mean(v)) for a, v in vals.items()}
    out["sd"] = {a: float(np.std(v, ddof=1)) for a, v in vals.items()}
    out["gap"] = out["mean"][names[0]] - out["mean"][names[1]]
    return out


def sweep_splits(dirs: dict, noise: dict, d: str, per_set: int) -> dict:
    """The check on the sweep's own splits (each one gallery of the bench's eval size): per
    split, each arm's sd over seeds against the predicted one, and the gap against 2 x SE."""
    names, out = list(dirs), {}
    first = next(iter(dirs[names[0]].values()))
    sweep = yaml.safe_load((first.parent.parent.parent / "SWEEP.yaml").read_text())
    for split in ("validation", "test"):
        m = json.loads(Path(sweep["splits"][split]).read_text())["samples"] / per_set
        vals = {}
        for arm, seeds in dirs.items():
            files = [f.parent.parent / "results" / f"{f.name}.json" for f in seeds.values()]
            vals[arm] = [json.loads(f.read_text())[split][METRICS[d]] for f in files]
        gap = float(np.mean(vals[names[0]]) - np.mean(vals[names[1]]))
        se = se_diff(noise, len(vals[names[0]]), m)
        sds = {a: float(np.std(v, ddof=1)) for a, v in vals.items()}
        scenes = round(m * per_set)
        pred = {
            a: predicted_sd(noise[t], per_set, scenes) for t, a in zip("ab", names, strict=False)
        }
        out[split] = {"gap": gap, "se": se, "sd": sds, "separable": abs(gap) > 2 * se}
        out[split].update(scenes=scenes, predicted_sd=pred)
    return out


def predicted_sd(c: dict, per_set: int, scenes: int) -> float:
    return float((c["seed_var"] + c["resid_var"] * per_set / scenes) ** 0.5)


def report(names: list[str], noise: dict, size: dict, scenes: int, d: str) -> list[str]:
    lines = [f"{d} R@1, eval sets of {scenes} scenes:"]
    for tag, arm in zip(("a", "b"), names, strict=True):
        c = noise[tag]
        lines.append(
            f"  {arm:<10} mean {c['mean']:.3f}; one model across eval sets sd "
            f"{c['one_model_sets_sd']:.3f} (binomial {c['binomial_sd']:.3f}); seed sd "
            f"{c['seed_var'] ** 0.5:.3f} (sd over seeds of the mean over all sets "
            f"{c['seed_sd_on_all_sets']:.3f}); eval-set sd shared by models "
            f"{c['set_var'] ** 0.5:.3f}, model x set sd {c['resid_var'] ** 0.5:.3f}"
        )
    lines.append(
        f"  gap {names[0]} - {names[1]} = {size['gap']:+.3f}; eval-set sd of the difference "
        f"(shared scenes) {noise['set_diff_var'] ** 0.5:.3f}; SE of the gap in this run "
        f"({noise['size'][0]} seeds x {noise['size'][1]} sets) {size['se_this_run']:.3f}"
    )
    for n, row in size["se"].items():
        cells = " ".join(f"{s}:{se:.3f}" for s, se in row.items() if s in (1, 2, 3, 5, 8, 12))
        rule = " ".join(f"{s}:{p:.2f}" for s, p in size["range_rule"][n].items())
        lines.append(
            f"  {n} scenes: SE(diff) by seeds {cells}; fewest seeds "
            f"for gap > 2 SE: {size['fewest_seeds'][n]}; P(sweep's range rule separates) "
            f"by seeds {rule}"
        )
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (see above)")
    parser.add_argument("--reuse", help="a finished bench/curation.py work folder")
    parser.add_argument("--arms", nargs=2, default=["clip-30", "clip-55"])
    parser.add_argument("--seeds", type=int, nargs="+", help="default: 0 1 2 (quick 0 1)")
    parser.add_argument("--sets", type=int, help="fresh eval sets (default 8, quick 4)")
    parser.add_argument("--scenes", type=int, default=150, help="scenes per eval set")
    parser.add_argument("--check-scenes", type=int, help="then one split of this size")
    parser.add_argument("--work", default="runs/curation-noise", help="scratch (replaced)")
    parser.add_argument("--resume", action="store_true", help="keep --work; run the rest")
    parser.add_argument("--out", default="runs/curation-noise.json")
    return parser.parse_args(argv)


def checks(args: argparse.Namespace, dirs: dict, cells: dict, noise: dict, d: str) -> tuple:
    """The checks of the prediction: the halves, one split of --check-scenes, the sweep's own
    splits; their numbers and report lines."""
    seeds, sets, noise_dir = list(next(iter(dirs.values()))), args.sets_n, args.noise_dir
    lines: list[str] = []
    check = halves(cells, args.arms, seeds, sets, d)
    if check:
        lines.append(
            f"  check: fit on seeds {check['fit_seeds']} x {check['fit_sets']} sets "
            f"(gap {check['fit_gap']:+.3f}); on seeds {check['check_seeds']} x "
            f"{check['check_sets']} other sets the gap is {check['check_gap']:+.3f}, "
            f"predicted SE {check['predicted_se']:.3f}: separable {check['separable']}"
        )
    if args.check_scenes:
        at = size_check(dirs, noise_dir, args.check_scenes, args.scenes, d)
        sds = [
            f"{a} {at['mean'][a]:.3f}, sd {at['sd'][a]:.3f} (predicted "
            f"{predicted_sd(noise[t], args.scenes, args.check_scenes):.3f})"
            for t, a in zip(("a", "b"), args.arms, strict=True)
        ]
        se = se_diff(noise, len(seeds), args.check_scenes / args.scenes)  # m: a fraction
        lines.append(
            f"  one split of {args.check_scenes} scenes, {len(seeds)} seeds: "
            f"{'; '.join(sds)}; gap {at['gap']:+.3f} (predicted SE ~{se:.3f})"
        )
        check["one_split"] = at
    check["sweep_splits"] = sweep_splits(dirs, noise, d, args.scenes)
    for split, c in check["sweep_splits"].items():
        pred = c["predicted_sd"]
        sds = ", ".join(f"{a} {c['sd'][a]:.3f} (predicted {pred[a]:.3f})" for a in pred)
        lines.append(
            f"  sweep's {split} split ({c['scenes']} scenes): sd over seeds {sds}; "
            f"gap {c['gap']:+.3f}, 2 x SE {2 * c['se']:.3f}: separable {c['separable']}"
        )
    return check, lines


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    started = time.monotonic()
    plan = Plan(**(SMALL if args.quick else {}))
    seeds = args.seeds or list(plan.seeds)
    plan = Plan(**{**asdict(plan), "sizes": plan.sizes, "seeds": seeds})
    work = (REPO / args.work).resolve()
    if args.reuse:
        reuse = (REPO / args.reuse).resolve()
        work.mkdir(parents=True, exist_ok=True)
        places = [reuse / "sweep" / "runs", more_seeds(reuse, work, args.arms, seeds)]
    else:
        places = [train_pair(plan, work, args.arms, args.resume)]
    dirs = run_dirs(places, args.arms, seeds)
    sets = args.sets_n = args.sets or (4 if args.quick else 8)
    noise_dir = args.noise_dir = work / "noise"
    if not args.resume and not args.reuse:
        shutil.rmtree(noise_dir, ignore_errors=True)
    manifests = eval_sets(noise_dir, sets, args.scenes, plan.data_seed)
    cells = evaluate_grid(dirs, manifests, noise_dir / "cells.json")
    out: dict[str, Any] = {"arms": args.arms, "seeds": seeds, "sets": sets}
    out.update(scenes=args.scenes, runs=[str(p) for p in places], cells=cells)
    for d in METRICS:
        ra, rb = (table(cells, arm, seeds, sets, d) for arm in args.arms)
        noise = pair_noise(ra, rb, args.scenes)
        size = sizing(noise, args.scenes)
        lines = report(args.arms, noise, size, args.scenes, d)
        check, more = checks(args, dirs, cells, noise, d)
        lines += more
        print("\n".join(lines), flush=True)
        out[d] = {"noise": noise, "sizing": size, "check": check, "lines": lines}
    out["seconds"] = round(time.monotonic() - started, 1)
    out["command"] = " ".join(sys.argv)
    (REPO / args.out).parent.mkdir(parents=True, exist_ok=True)
    (REPO / args.out).write_text(json.dumps(out, indent=1, default=str) + "\n")
    print(f"total {out['seconds']:.0f} s; results: {args.out}")


if __name__ == "__main__":
    main()

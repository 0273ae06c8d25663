"""Bench: a filter network (DFN-style) against a plain CLIP scorer, as two scorers of one
`mmcurate sweep` (issue 50).

1. Data (bench/curation_data.py, as bench/curation.py): a web-like raw set (~45% of captions
   about something else, ~25% copies, 2% broken), a small clean seed set (the trusted set),
   held-out eval scenes split into validation and test.
2. Two scorers, each the same tiny CLIP trained by `mmcurate train` at the same compute
   (filter_steps x batch): the plain CLIP on the raw set itself (what a generic web-trained
   CLIP is here: no pretrained CLIP is available offline), and the filter network on the
   trusted seed set only.
3. One `mmcurate sweep`: the base build's clip_score scores with the plain CLIP; `scorers: {dfn:
   ...}` names the filter network (its run folder). Arms: raw, and at each kept fraction the
   clip arm and the dfn arm (`scorer: dfn`): equal kept fraction, so equal samples. Each
   scorer runs once over the raw set (scorer_runs), every arm x seed trains the same proxy at
   equal compute, and `mmcurate eval` gives R@1 both ways on both splits.
4. Prints per arm: samples kept, what they are by ground truth, and image->text and
   text->image R@1 (mean ± sd [min-max] over seeds) on the test split, and dfn - clip per
   fraction; writes all of it to --out.

    .venv/bin/python bench/filter_network.py [--quick] [--seeds 0 1 2] [--work DIR]
        [--runtime auto|ray|local] [--resume] [--out FILE.json]

Default: raw 3,000 files, seed 800, eval 300 (150 + 150), proxy 150 steps x 64, scorers 300
steps x 64, keep 30% and 55%, seeds 0 1 2 (15 runs: 18-22 min measured on 2 cores shared at
load average 10-16, the sweep 871 s of it; less on a quieter machine). `--quick`: raw 800, seed
300, eval 100, proxy 30 steps x 32, scorers 60 steps (6 min measured at the same load).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from mmcurate.pipeline.sweep.report import spread  # noqa: E402

from bench.curation import (  # noqa: E402
    CONFIGS,
    REPO,
    Plan,
    composition,
    decode_build,
    mmcurate,
    prepare,
    prepare_work,
    proxy_tree,
    run,
    train_cmd,
)
from bench.curation_data import Sizes  # noqa: E402

METRICS = {"i2t": "text_retrieval_recall@1", "t2i": "image_retrieval_recall@1"}


@dataclass(frozen=True)
class Bench:
    sizes: Sizes = Sizes(eval=300, seed=800, raw=3000, popular=15)
    steps: int = 150  # proxy steps per arm x seed (equal compute)
    batch: int = 64
    filter_steps: int = 300  # both scorers: the same steps x batch
    keeps: tuple[float, ...] = (0.3, 0.55)
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])


QUICK = {"sizes": Sizes(eval=100, seed=300, raw=800, popular=8), "steps": 30, "batch": 32}
QUICK["filter_steps"] = 60


def plan_of(bench: Bench) -> Plan:
    """bench/curation.py's plan at these sizes (its data, decode builds and filter model)."""
    return Plan(
        sizes=bench.sizes,
        steps=bench.steps,
        batch=bench.batch,
        filter_steps=bench.filter_steps,
        seeds=list(bench.seeds),
    )


def train_web_clip(plan: Plan, work: Path) -> Path:
    """The plain CLIP: the same model and compute as the filter network, on the raw set."""
    samples = decode_build(work / "data" / "raw", work / "builds" / "raw")
    print(f"raw decode build: {samples} samples", flush=True)
    run_dir = work / "runs" / "web-clip"
    web = Plan(**{**asdict(plan), "sizes": plan.sizes, "steps": plan.filter_steps})
    cmd = train_cmd(web, work / "builds" / "raw" / "manifest.json", run_dir, 100)
    checkpoint = run_dir / "checkpoints" / f"step-{plan.filter_steps}.pt"
    run(cmd, work / "runs" / "web-clip.log", checkpoint)
    return checkpoint


def arms(bench: Bench) -> list[dict[str, Any]]:
    grid: list[dict[str, Any]] = [{"name": "raw"}]
    for keep in bench.keeps:
        pct = round(keep * 100)
        grid.append({"name": f"clip-{pct}", "keep_top_fraction": keep})
        grid.append({"name": f"dfn-{pct}", "keep_top_fraction": keep, "scorer": "dfn"})
    return grid


def sweep_tree(bench: Bench, work: Path, web: Path, dfn_run: Path) -> dict[str, Any]:
    """SWEEP.yaml: the plain CLIP as the base build's scorer, the filter network as `dfn`."""
    build = yaml.safe_load((CONFIGS / "clip.yaml").read_text())
    build["stages"][1]["pretrained"] = str(web)
    return {
        "build": build,
        "sources": {"raw": str(work / "data" / "raw")},
        "scorers": {"dfn": {"model": "mmcurate-tiny", "pretrained": str(dfn_run)}},
        **proxy_tree(work, bench.batch, bench.steps),
        "metric": METRICS["i2t"],
        "seeds": bench.seeds,
        "arms": arms(bench),
        "output": str(work / "sweep"),
    }


def figures(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per arm, split and direction: R@1's spread over seeds."""
    out: dict[str, dict[str, Any]] = {}
    for arm in result["kept"]:
        rows = [r for r in result["runs"] if r["arm"] == arm]
        out[arm] = {
            split: {d: spread([r[split][m] for r in rows]) for d, m in METRICS.items()}
            for split in ("validation", "test")
        }
    return out


def cell(s: dict[str, float]) -> str:
    return f"{s['mean']:.3f} ± {s['sd']:.3f} [{s['min']:.3f}–{s['max']:.3f}]"


def report(bench: Bench, result: dict, figs: dict, kept: dict) -> list[str]:
    lines = [
        "| arm | scorer | samples kept | kept by truth: clean / mismatched / copies "
        "| test i→t R@1 | test t→i R@1 |",
        "|---|---|---:|---|---:|---:|",
    ]
    for arm, info in result["kept"].items():
        k = kept[arm]
        truth = f"{k['clean']} / {k['mismatched']} / {k['copies']}"
        scorer = info.get("scorer", "clip_score" if arm != "raw" else "–")
        t = figs[arm]["test"]
        cells = [arm, scorer, str(info["samples"]), truth, cell(t["i2t"]), cell(t["t2i"])]
        lines.append("| " + " | ".join(cells) + " |")
    for keep in bench.keeps:
        pct = round(keep * 100)
        for d in METRICS:
            dfn, clip = figs[f"dfn-{pct}"]["test"][d], figs[f"clip-{pct}"]["test"][d]
            ratio = dfn["mean"] / clip["mean"] if clip["mean"] else float("nan")
            lines.append(
                f"keep {pct}% {d}: dfn - clip = {dfn['mean'] - clip['mean']:+.3f} "
                f"(ratio {ratio:.2f}); ranges overlap: {dfn['min'] <= clip['max']}"
            )
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (see above)")
    parser.add_argument("--seeds", type=int, nargs="+", help="default 0 1 2")
    parser.add_argument("--work", default="runs/filter-network", help="scratch (replaced)")
    parser.add_argument("--runtime", choices=["auto", "ray", "local"], default="auto")
    parser.add_argument("--resume", action="store_true", help="keep --work; run the rest")
    parser.add_argument("--out", default="runs/filter-network.json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    bench = Bench(**(QUICK if args.quick else {}))
    if args.seeds:
        bench = Bench(**{**asdict(bench), "sizes": bench.sizes, "seeds": args.seeds})
    work = (REPO / args.work).resolve()
    started = time.monotonic()
    tree = {**asdict(bench), "sizes": asdict(bench.sizes)}
    prepare_work(work, {k: v for k, v in tree.items() if k != "seeds"}, args.resume)
    plan = plan_of(bench)
    ready = prepare(plan, work)  # data, decode builds, the filter network on the seed set
    web = train_web_clip(plan, work)
    print(f"data: {ready['counts']}; scorers trained in {time.monotonic() - started:.0f} s")
    sweep_file = work / "SWEEP.yaml"
    dfn_run = Path(ready["checkpoint"]).parent.parent  # the run folder: its newest checkpoint
    sweep_file.write_text(yaml.safe_dump(sweep_tree(bench, work, web, dfn_run)))
    seconds = run(mmcurate("sweep", str(sweep_file), "--runtime", args.runtime), work / "sweep.log")
    result = json.loads((work / "sweep" / "results.json").read_text())
    roles = json.loads((work / "data" / "truth.json").read_text())["roles"]
    kept = {a: composition(work / "sweep" / "arms" / a, roles) for a in result["kept"]}
    figs = figures(result)
    lines = report(bench, result, figs, kept)
    print("\n".join(lines), flush=True)
    print(f"scorer_runs: {json.dumps(result['scorer_runs'])}")
    print(result["recommendation"]["text"])
    out = {
        "bench": tree,
        "data": ready["counts"],
        "scorer_runs": result["scorer_runs"],
        "kept": result["kept"],
        "kept_by_truth": kept,
        "figures": figs,
        "lines": lines,
        "recommendation": result["recommendation"],
        "sweep_seconds": round(seconds, 1),
        "seconds": round(time.monotonic() - started, 1),
        "command": " ".join(sys.argv),
    }
    (REPO / args.out).parent.mkdir(parents=True, exist_ok=True)
    (REPO / args.out).write_text(json.dumps(out, indent=1, default=str) + "\n")
    print(f"total {out['seconds']:.0f} s (sweep {seconds:.0f} s); results: {args.out}")


if __name__ == "__main__":
    main()

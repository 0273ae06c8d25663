"""Bench: T-MARS (clip_score `mask_text: true`) against plain CLIP-score filtering when the
scorer reads text written into the pictures (issue 50).

1. Data (bench/tmars_data.py): the curation bench's scenes; a raw pool where a share of the
   pairs is mis-captioned AND carries its (wrong) caption's words written into the pixels,
   besides clean pairs with and without text and mis-captioned pairs without text; the
   truth per key; held-out clean scenes without text (a validation and a test split).
2. The scorer: `mmcurate train` of a tiny open_clip (mmcurate-tiny, no download) on pairs
   where part of the pictures carry their caption's words, some over a scene the caption
   does not describe (as web text does). First check: it reads the text: its score of each
   mis-captioned pair with the words written in, against the same picture without them
   (`mmcurate build` of check/ with decode + clip_score, no threshold): mean difference and
   the share of pairs where it rises.
3. Two `mmcurate sweep`s (one scorer per sweep): `clip` (decode, clip_score) and `tmars`
   (text_area, decode, clip_score with mask_text), each keeping the same top fraction of the
   raw pool, over the same train/eval configs, splits and seeds. Then what each arm kept by
   truth (the mis-captioned-with-text pairs above all) and the proxies' R@1 on both splits
   per seed.

    .venv/bin/python bench/tmars.py [--quick] [--seeds 0 1 2] [--work runs/tmars]
        [--text-pairs 0.35] [--scorer-steps 1200] [--resume] [--out runs/tmars-results.json]

Default: raw 2,000, scorer set 2,000 (1,200 steps x 64), eval 300 (150 + 150), keep 0.5, proxy
100 steps x 64 per arm x seed, 3 seeds: 14 min on 2 shared cores. `--quick`: raw 300,
scorer 300 (60 steps), eval 60, 20 steps x 32, seed 0 (a smoke check: 2-5 min on the
loaded 2 cores, most of it process and Ray start-up).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from bench.curation import (  # noqa: E402
    CONFIGS,
    METRIC,
    decode_build,
    mmcurate,
    prepare_work,
    proxy_tree,
    run,
    sets,
    split_eval,
)
from bench.curation_data import BACKGROUNDS  # noqa: E402
from bench.tmars_data import ROLES, TmarsSizes, make_tmars_sets  # noqa: E402
from bench.tmars_report import detection, read_check, scores_by_role, summary  # noqa: E402
from tests.kit_sweep import keys_of  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Plan:
    sizes: TmarsSizes = TmarsSizes()
    scorer_steps: int = 1200  # the scoring CLIP (it must learn to read as well as to see)
    scorer_batch: int = 64
    steps: int = 100  # each arm x seed: steps x batch (equal compute)
    batch: int = 64
    keep: float = 0.5  # keep_top_fraction of both arms (the raw pool is 55% clean)
    short_side: int = 128  # text_area: the pictures own size (upscaled 2x, circles read as text)
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    data_seed: int = 0


QUICK = {"sizes": TmarsSizes(raw=300, scorer=300, eval=60), "scorer_steps": 60, "steps": 20}
QUICK.update(batch=32, scorer_batch=32, seeds=[0])


def train_scorer(plan: Plan, work: Path) -> Path:
    """`mmcurate train` of the scoring CLIP on the scorer set's decode build; its checkpoint."""
    out = work / "runs" / "scorer"
    checkpoint = out / "checkpoints" / f"step-{plan.scorer_steps}.pt"
    cmd = mmcurate("train", str(CONFIGS / "train.yaml"))
    cmd += sets(
        data__manifest=work / "builds" / "scorer" / "manifest.json",
        run__output=out,
        data__seed=100,
        run__max_steps=plan.scorer_steps,
        data__batch_size=plan.scorer_batch,
        run__log_every=max(1, plan.scorer_steps // 5),
    )
    run(cmd, work / "runs" / "scorer.log", checkpoint)
    return checkpoint


def stages(plan: Plan, checkpoint: Path, tmars: bool) -> list[dict[str, Any]]:
    """The scoring build's stages: text_area first (on the drawn 128 px pictures, its boxes
    normalised so they fit the resized ones), decode to the model's 64 px, clip_score."""
    base = yaml.safe_load((CONFIGS / "clip.yaml").read_text())["stages"]
    decode, clip = base[0], {**base[1], "pretrained": str(checkpoint)}
    clip.pop("keep_top_fraction", None)
    if not tmars:
        return [decode, clip]
    text = {"name": "text_area", "short_side": plan.short_side}
    return [text, decode, {**clip, "mask_text": True}]


def build_tree(plan: Plan, source: Path, out: Path, checkpoint: Path, tmars: bool) -> dict:
    tree = yaml.safe_load((CONFIGS / "clip.yaml").read_text())
    tree["source"]["path"] = str(source)
    tree["output"]["path"] = str(out)
    tree["stages"] = stages(plan, checkpoint, tmars)
    return tree


def reads_text(plan: Plan, work: Path, checkpoint: Path) -> dict[str, Any]:
    """The scorer's scores of check/ (each mis-captioned pair with and without its words)."""
    out = work / "builds" / "check"
    config = work / "check.yaml"
    config.write_text(
        yaml.safe_dump(build_tree(plan, work / "data" / "check", out, checkpoint, False))
    )
    run(
        mmcurate("build", str(config), "--no-progress"),
        work / "builds" / "check.log",
        out / "manifest.json",
    )
    return read_check(out)


def sweep_tree(plan: Plan, work: Path, checkpoint: Path, tmars: bool) -> dict[str, Any]:
    """One sweep: the plain or the T-MARS scorer; the same proxy, splits, seeds and keep."""
    name = "tmars" if tmars else "clip"
    arms = [{"name": f"{name}-{round(plan.keep * 100)}", "keep_top_fraction": plan.keep}]
    return {
        "build": build_tree(plan, work / "data" / "raw", work / "unused", checkpoint, tmars),
        **proxy_tree(work, plan.batch, plan.steps),
        "metric": METRIC,
        "seeds": plan.seeds,
        "arms": arms,
        "output": str(work / f"sweep-{name}"),
    }


def run_sweep(plan: Plan, work: Path, checkpoint: Path, tmars: bool) -> dict[str, Any]:
    """`mmcurate sweep` of one scorer; its results.json plus the seconds it took."""
    name = "tmars" if tmars else "clip"
    config = work / f"SWEEP-{name}.yaml"
    config.write_text(yaml.safe_dump(sweep_tree(plan, work, checkpoint, tmars)))
    seconds = run(mmcurate("sweep", str(config)), work / f"sweep-{name}.log")
    result = json.loads((work / f"sweep-{name}" / "results.json").read_text())
    return {**result, "seconds": round(seconds, 1)}


def background_named(data: Path, roles: dict[str, dict]) -> None:
    """Mark each raw pair whose caption names the picture's true background (a wrong caption
    does so by chance, 1 in 6: the scorer's easiest cue, so those pairs keep a fair score)."""
    for key, truth in roles.items():
        words = BACKGROUNDS[truth["scene"]["background"]][0]
        truth["background_named"] = words in (data / "raw" / f"{key}.txt").read_text()


def kept_by_truth(sweep: Path, arm: str, roles: dict[str, dict]) -> dict[str, int]:
    """Kept pairs per role, and the mis-captioned ones whose caption names the background."""
    return kept_by_truth_of(keys_of(sweep / "arms" / arm), roles)


def kept_by_truth_of(keys: list[str], roles: dict[str, dict]) -> dict[str, int]:
    counts = dict.fromkeys(ROLES, 0) | {"mismatched_text_bg": 0, "mismatched_bg": 0}
    for key in keys:
        role = roles[key]["role"]
        counts[role] += 1
        if role.startswith("mismatched") and roles[key]["background_named"]:
            counts[f"{role}_bg"] += 1
    return counts


def prepare(plan: Plan, work: Path) -> dict[str, Any]:
    """Data, the decode builds of the scorer set and both eval splits, the scorer."""
    data = work / "data"
    if not (data / "truth.json").exists():
        make_tmars_sets(data, plan.sizes, plan.data_seed)
    val, test = split_eval(data)
    builds = work / "builds"
    for name, src in (("scorer", data / "scorer"), ("eval-val", val), ("eval-test", test)):
        decode_build(src, builds / name)
    return {"checkpoint": train_scorer(plan, work)}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke check (see above)")
    parser.add_argument("--seeds", type=int, nargs="+", help="default: the preset's")
    parser.add_argument("--text-pairs", type=float, help="scorer set: share of text pairs")
    parser.add_argument("--scorer-steps", type=int, help="the scorer's training steps")
    parser.add_argument("--work", default="runs/tmars", help="scratch (replaced)")
    parser.add_argument("--resume", action="store_true", help="keep --work; run the rest")
    parser.add_argument("--out", default="runs/tmars-results.json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    plan = Plan(**(QUICK if args.quick else {}))
    sizes = plan.sizes
    if args.text_pairs is not None:  # a scorer that reads more (or less): the rest clean
        try:
            sizes = replace(sizes, scorer_text_pairs=args.text_pairs)
        except ValueError as err:
            raise SystemExit(f"--text-pairs: {err}") from None
    plan = replace(plan, sizes=sizes, seeds=args.seeds or plan.seeds)
    plan = replace(plan, scorer_steps=args.scorer_steps or plan.scorer_steps)
    work = (REPO / args.work).resolve()
    started = time.monotonic()
    tree = {**asdict(plan), "sizes": asdict(plan.sizes)}
    prepare_work(work, {k: v for k, v in tree.items() if k != "seeds"}, args.resume)
    checkpoint = prepare(plan, work)["checkpoint"]
    check = reads_text(plan, work, checkpoint)
    print(f"reads text: {json.dumps(check)}", flush=True)
    truth = json.loads((work / "data" / "truth.json").read_text())
    background_named(work / "data", truth["roles"])
    pool = kept_by_truth_of(list(truth["roles"]), truth["roles"])
    sweeps = {
        name: run_sweep(plan, work, checkpoint, name == "tmars") for name in ("clip", "tmars")
    }
    kept = {
        arm: kept_by_truth(work / f"sweep-{name}", arm, truth["roles"])
        for name, result in sweeps.items()
        for arm in result["kept"]
    }
    out = {"plan": tree, "data": pool, "scorer_set": truth["scorer"]}
    out |= {"reads_text": check, "kept_by_truth": kept, "sweeps": sweeps}
    out["scores_by_role"] = {
        name: scores_by_role(work / f"sweep-{name}", truth["roles"]) for name in sweeps
    }
    out["detection"] = detection(work / "sweep-tmars" / "scored" / "main", truth["roles"])
    out["seconds"] = round(time.monotonic() - started, 1)
    out["command"] = " ".join(sys.argv)
    print(summary(out))
    (REPO / args.out).parent.mkdir(parents=True, exist_ok=True)
    (REPO / args.out).write_text(json.dumps(out, indent=1, default=str) + "\n")
    print(f"total {out['seconds']:.0f} s; results: {args.out}")


if __name__ == "__main__":
    main()

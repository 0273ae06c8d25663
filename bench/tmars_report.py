"""bench/tmars.py's readings and its printed summary: the reads-text check from the check
build's recorded scores, an arm's keys, scores per role, and the markdown the bench prints."""

from __future__ import annotations

import json
import statistics
import tarfile
from pathlib import Path
from typing import Any

from mmcurate.pipeline.sweep.arms import read_scores

METRIC = "text_retrieval_recall@1"


def read_check(build: Path) -> dict[str, Any]:
    """Per mis-captioned pair, score(with its words written in) - score(same picture without):
    the mean, its sd, and the share of pairs where the score rises."""
    scores = dict(read_scores(build))
    stems = sorted(k.removesuffix("_text") for k in scores if k.endswith("_text"))
    diffs = [
        scores[f"{s}_text"] - scores[f"{s}_plain"]
        for s in stems
        if scores.get(f"{s}_text") is not None and scores.get(f"{s}_plain") is not None
    ]
    return {
        "pairs": len(diffs),
        "mean_plain": round(statistics.fmean(scores[f"{s}_plain"] for s in stems), 4),
        "mean_text": round(statistics.fmean(scores[f"{s}_text"] for s in stems), 4),
        "mean_diff": round(statistics.fmean(diffs), 4),
        "sd_diff": round(statistics.stdev(diffs), 4) if len(diffs) > 1 else 0.0,
        "rises": round(sum(d > 0 for d in diffs) / len(diffs), 4),
    }


def detection(build: Path, roles: dict[str, dict]) -> dict[str, list[int]]:
    """text_area against the truth in a scored build's json: [pictures with boxes, pictures]
    among those with text written in and those without."""
    found = {"text_written": [0, 0], "no_text": [0, 0]}
    manifest = json.loads((build / "manifest.json").read_text())
    for shard in manifest["shards"]:
        with tarfile.open(build / shard["name"]) as tar:
            for info in tar:
                if info.name.endswith(".json"):
                    meta = json.loads(tar.extractfile(info).read())  # type: ignore[union-attr]
                    key = info.name.partition(".")[0]
                    row = found["text_written" if roles[key]["text_written"] else "no_text"]
                    row[0] += bool(meta.get("text_boxes"))
                    row[1] += 1
    return found


def scores_by_role(sweep: Path, roles: dict[str, dict]) -> dict[str, float]:
    """Mean recorded clip_score per truth role in a sweep's scored build."""
    by_role: dict[str, list[float]] = {}
    for key, score in read_scores(sweep / "scored" / "main"):
        if score is not None:
            by_role.setdefault(roles[key]["role"], []).append(float(score))
    return {role: round(statistics.fmean(v), 4) for role, v in sorted(by_role.items())}


def per_seed(sweeps: dict[str, Any], split: str) -> dict[str, dict[int, float]]:
    """arm -> {seed: metric} on one split, over every sweep."""
    out: dict[str, dict[int, float]] = {}
    for result in sweeps.values():
        for row in result["runs"]:
            out.setdefault(row["arm"], {})[row["seed"]] = row[split][METRIC]
    return out


def pairs(counts: dict[str, int]) -> int:
    """Pairs in a by-truth count (the `_bg` columns are subsets of their role's)."""
    return sum(v for k, v in counts.items() if not k.endswith("_bg"))


def spread_text(values: list[float]) -> str:
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.3f} ± {sd:.3f} [{min(values):.3f}–{max(values):.3f}]"


def summary(out: dict[str, Any]) -> str:
    """The markdown the bench prints (and the BENCHMARKS section is made from)."""
    check = out["reads_text"]
    lines = [
        f"raw pool by truth: {out['data']}; scorer set: {out['scorer_set']}",
        f"reads text: over {check['pairs']} mis-captioned pairs, score with the words written in"
        f" {check['mean_text']:.4f} vs without {check['mean_plain']:.4f}: mean difference"
        f" {check['mean_diff']:+.4f} (sd {check['sd_diff']:.4f}), rises in"
        f" {100 * check['rises']:.1f}% of pairs",
        "",
        "| arm | kept | " + " | ".join(out["data"]) + " |",
        "|---|---:|" + "---:|" * len(out["data"]),
        f"| (raw pool) | {pairs(out['data'])} | "
        + " | ".join(map(str, out["data"].values()))
        + " |",
    ]
    for arm, counts in out["kept_by_truth"].items():
        lines.append(f"| {arm} | {pairs(counts)} | " + " | ".join(map(str, counts.values())) + " |")
    seeds = out["plan"]["seeds"]
    lines += [
        "",
        f"| arm | {METRIC} per seed {seeds} (validation / test) | test mean ± sd [min–max] |",
    ]
    lines.append("|---|---|---|")
    val, test = per_seed(out["sweeps"], "validation"), per_seed(out["sweeps"], "test")
    for arm in test:
        cells = ", ".join(f"{val[arm][s]:.3f} / {test[arm][s]:.3f}" for s in sorted(test[arm]))
        lines.append(f"| {arm} | {cells} | {spread_text(list(test[arm].values()))} |")
    if "detection" in out:
        lines.append(f"text_area boxes found [pictures with boxes, pictures]: {out['detection']}")
    if "scores_by_role" in out:
        for name, means in out["scores_by_role"].items():
            lines.append(f"mean clip_score by role, {name} scorer: {means}")
    return "\n".join(lines)

"""A sweep's result: results.json, table.md, plot.svg and report.html, and the
recommendation.

The recommendation is the arm with the best mean `metric` on the validation split, reported
with its numbers on the held-out test split. Rule for "separable": with at least two seeds, the
gap between the best arm's and the runner-up's validation means is more than twice the gap's
standard error over seeds (sqrt(sd_a^2 / n_a + sd_b^2 / n_b)); otherwise the sweep says it
cannot separate them. Unlike "their min-max ranges do not overlap", this rule gets easier, not
harder, as seeds are added (bench/curation_noise.py measured the ranges' rule separating a
real gap at 2 seeds 83% of the time and at 8 seeds 31%).
"""

from __future__ import annotations

import html
import json
import os
import statistics
from pathlib import Path
from typing import Any

from mmcurate.pipeline.sweep.config import SweepConfig
from mmcurate.pipeline.sweep.task import SPLITS

FORMAT = "mmcurate-sweep/1"


def spread(values: list[float]) -> dict[str, float]:
    """Mean, sample sd (0 for one seed), min and max of one arm's values over seeds."""
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"mean": statistics.fmean(values), "sd": sd, "min": min(values), "max": max(values)}


def summarize(results: list[dict[str, Any]], metric: str) -> dict[str, dict[str, Any]]:
    """Per arm and split, the metric's spread over seeds, and every metric's mean."""
    arms: dict[str, list[dict[str, Any]]] = {}
    for row in results:
        arms.setdefault(row["arm"], []).append(row)
    out: dict[str, dict[str, Any]] = {}
    for arm, rows in arms.items():
        out[arm] = {"seeds": [r["seed"] for r in rows]}
        for split in SPLITS:
            out[arm][split] = spread([r[split][metric] for r in rows])
            names = rows[0][split]
            out[arm][f"{split}_means"] = {
                k: statistics.fmean(r[split][k] for r in rows) for k in names
            }
    return out


def recommend(summary: dict[str, dict[str, Any]], metric: str) -> dict[str, Any]:
    """The best arm on validation, its test numbers, and whether it is separable from the
    runner-up (see the module's rule)."""
    order = sorted(summary, key=lambda a: (-summary[a]["validation"]["mean"], a))
    best = order[0]
    rec: dict[str, Any] = {"arm": best, "metric": metric, "chosen_on": "validation"}
    rec["validation"] = summary[best]["validation"]
    rec["test"] = summary[best]["test"]
    rec["best_on_test"] = max(summary, key=lambda a: (summary[a]["test"]["mean"], a))
    seeds = len(summary[best]["seeds"])
    if len(order) == 1:
        rec.update(runner_up=None, separable=None)
        rec["text"] = f"Recommended: {best} (the only arm)."
        return rec
    second = order[1]
    rec["runner_up"] = second
    gap, error = mean_gap(summary[best], summary[second])
    rec["gap"], rec["gap_se"] = gap, error
    rec["separable"] = seeds >= 2 and len(summary[second]["seeds"]) >= 2 and gap > 2 * error
    test = rec["test"]
    text = (
        f"Recommended: {best} (validation {metric} {rec['validation']['mean']:.4f}; "
        f"held-out test {test['mean']:.4f} ± {test['sd']:.4f} over {seeds} seeds)."
    )
    if not rec["separable"]:
        why = (
            "one seed gives no spread"
            if seeds < 2
            else f"the gap {gap:.4f} is within twice its standard error {error:.4f} over seeds"
        )
        text += f" Not separable from {second} on validation: {why}."
    if rec["best_on_test"] != best:
        text += f" On the test split {rec['best_on_test']} scores higher."
    rec["text"] = text
    return rec


def mean_gap(best: dict[str, Any], second: dict[str, Any]) -> tuple[float, float]:
    """The validation means' gap and its standard error over the two arms' seeds."""
    a, b = best["validation"], second["validation"]
    n_a, n_b = len(best["seeds"]), len(second["seeds"])
    error = (a["sd"] ** 2 / n_a + b["sd"] ** 2 / n_b) ** 0.5
    return a["mean"] - b["mean"], error


def cell(s: dict[str, float]) -> str:
    return f"{s['mean']:.4f} ± {s['sd']:.4f} [{s['min']:.4f}–{s['max']:.4f}]"


def table(summary: dict[str, dict[str, Any]], kept: dict[str, Any], metric: str) -> str:
    """Markdown: one row per arm, the metric's mean ± sd [min–max] over seeds per split."""
    lines = [
        f"| arm | samples kept | validation {metric} (mean ± sd [min–max]) | test {metric} "
        "| seeds |",
        "|---|---:|---:|---:|---:|",
    ]
    for arm, row in summary.items():
        cells = [arm, str(kept[arm]["samples"]), cell(row["validation"]), cell(row["test"])]
        lines.append("| " + " | ".join([*cells, str(len(row["seeds"]))]) + " |")
    return "\n".join(lines)


def plot(summary: dict[str, dict[str, Any]], metric: str) -> str:
    """SVG: per arm and split, the min-max range over seeds as a line and the mean as a dot
    (drawn by hand, as the build report's charts: no plotting library needed)."""
    width, label, row_h = 640, 150, 34
    values = [summary[a][s][k] for a in summary for s in SPLITS for k in ("min", "max")]
    low, high = min(values), max(values)
    span = (high - low) or 1.0

    def x(v: float) -> float:
        return label + 10 + (v - low) / span * (width - label - 30)

    parts, colours = [], {"validation": "#4c72b0", "test": "#dd8452"}
    for row, arm in enumerate(summary):
        y = 20 + row * row_h
        parts.append(f'<text x="4" y="{y + 10}" font-size="12">{html.escape(arm)}</text>')
        for i, split in enumerate(SPLITS):
            s, yy, c = summary[arm][split], y + 6 + i * 12, colours[split]
            parts.append(
                f'<line x1="{x(s["min"]):.1f}" x2="{x(s["max"]):.1f}" y1="{yy}" y2="{yy}" '
                f'stroke="{c}" stroke-width="2"/><circle cx="{x(s["mean"]):.1f}" cy="{yy}" '
                f'r="4" fill="{c}"/>'
            )
    bottom = 20 + len(summary) * row_h
    parts.append(
        f'<text x="{label}" y="{bottom + 14}" font-size="11">{html.escape(metric)}: '
        f"{low:.4f} … {high:.4f}; blue validation, orange test; line min–max over seeds, "
        "dot the mean</text>"
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{bottom + 24}">'
        + "".join(parts)
        + "</svg>"
    )


def page(markdown: str, svg: str, rec: dict[str, Any]) -> str:
    """report.html: the recommendation, the plot and the table (as preformatted text)."""
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>mmcurate sweep</title></head>"
        f"<body><h1>mmcurate sweep</h1><p>{html.escape(rec['text'])}</p>{svg}"
        f"<pre>{html.escape(markdown)}</pre></body></html>\n"
    )


def write_report(
    cfg: SweepConfig,
    output: Path,
    results: list[dict[str, Any]],
    kept: dict[str, Any],
    scorer_runs: dict[str, Any],
) -> dict[str, Any]:
    """results.json, table.md, plot.svg, report.html under output; returns the result."""
    summary = summarize(results, cfg.metric)
    rec = recommend(summary, cfg.metric)
    markdown = table(summary, kept, cfg.metric)
    svg = plot(summary, cfg.metric)
    result = {
        "format": FORMAT,
        "metric": cfg.metric,
        "seeds": cfg.seeds,
        "scorer_runs": scorer_runs,
        "kept": kept,
        "runs": results,
        "summary": summary,
        "recommendation": rec,
        "table": markdown,
    }
    files = {
        "table.md": markdown + "\n\n" + rec["text"] + "\n",
        "plot.svg": svg + "\n",
        "report.html": page(markdown, svg, rec),
        "results.json": json.dumps(result, indent=1) + "\n",  # last: the sweep's finish mark
    }
    for name, text in files.items():
        tmp = output / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, output / name)
    return result

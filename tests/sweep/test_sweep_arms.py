"""An arm's keep_top_fraction keeps exactly as many samples as the build's clip_score rule
(stages/lib/decisions.py `top_count`), also where fraction x N is a whole number that float
rounding puts a hair above (0.55 x 2940 = 1617.0000000000002: the curation bench's raw set)."""

from __future__ import annotations

from mmcurate.pipeline.sweep.arms import top_fraction
from mmcurate.stages.lib.decisions import top_count


def test_top_fraction_keeps_the_builds_count_when_the_product_is_whole():
    for fraction, n in ((0.55, 2940), (0.3, 10), (0.7, 10)):
        rows = [(f"k{i:05d}", float(i % 97) / 97) for i in range(n)]
        kept = top_fraction(rows, fraction)
        assert len(kept) == top_count(fraction, n) == round(fraction * n)


def test_top_fraction_rounds_up_a_partial_sample():
    rows = [(f"k{i:03d}", float(i)) for i in range(784)]
    kept = top_fraction(rows, 0.55)  # 431.2 -> 432, highest scores
    assert len(kept) == 432 and "k783" in kept and "k000" not in kept

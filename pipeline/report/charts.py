"""The report's charts as inline SVG: horizontal bars and histograms.

Hand-drawn SVG instead of matplotlib PNGs: importing and driving matplotlib cost ~1.5 s of a
3,000-image build's 9.6 s (docs/benchmarks/fixed_cost.md); these charts need
only rectangles, a few labels and one axis, and they stay sharp at any zoom.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

import numpy as np

WIDTH = 700
BAR = 18  # height of one bar row in a bar chart
LABEL = 170  # room for the bars' labels
PLOT_HEIGHT = 220  # height of a histogram's bars area
TICKS = 5
COLOR = "#4c72b0"


def bar_chart(labels: Sequence[str], values: Sequence[float], xlabel: str) -> str:
    """One horizontal bar per label, top to bottom in the given order."""
    top = max([float(v) for v in values] + [0.0]) or 1.0
    span = WIDTH - LABEL - 20
    rows = []
    for row, (label, value) in enumerate(zip(labels, values, strict=True)):
        y = 10 + row * (BAR + 6)
        width = span * max(float(value), 0.0) / top
        rows.append(
            f'<text x="{LABEL - 6}" y="{y + BAR - 5}" text-anchor="end">{_text(label)}</text>'
            f'<rect x="{LABEL}" y="{y}" width="{width:.1f}" height="{BAR}" fill="{COLOR}">'
            f"<title>{_text(label)}: {_number(value)}</title></rect>"
        )
    axis_y = 10 + len(labels) * (BAR + 6)
    axis = _axis(LABEL, span, axis_y, 0.0, top, xlabel)
    return _svg(axis_y + 40, "".join(rows) + axis)


def histogram(
    values: Sequence[float], bins: int, xlabel: str, marker: tuple[float, str] | None = None
) -> str:
    """Counts of `values` in `bins` equal bins; `marker` (x, label) draws a red line there."""
    data = np.asarray([v for v in values if math.isfinite(v)], dtype=np.float64)
    low, high = (float(data.min()), float(data.max())) if data.size else (0.0, 1.0)
    if marker is not None:
        low, high = min(low, marker[0]), max(high, marker[0])
    if high <= low:
        low, high = low - 0.5, high + 0.5
    counts, edges = np.histogram(data, bins=bins, range=(low, high))
    left, span, base = 50, WIDTH - 70, 10 + PLOT_HEIGHT
    tallest = int(counts.max()) if counts.size and counts.max() > 0 else 1
    step = span / bins
    bars = "".join(
        f'<rect x="{left + i * step:.1f}" y="{base - PLOT_HEIGHT * c / tallest:.1f}" '
        f'width="{max(step - 1, 1):.1f}" height="{PLOT_HEIGHT * c / tallest:.1f}" fill="{COLOR}">'
        f"<title>{_number(edges[i])} to {_number(edges[i + 1])}: {int(c)}</title></rect>"
        for i, c in enumerate(counts)
    )
    body = bars + _axis(left, span, base, low, high, xlabel)
    body += f'<text x="{left - 6}" y="18" text-anchor="end">{tallest}</text>'
    if marker is not None:
        x = left + span * (marker[0] - low) / (high - low)
        body += (
            f'<line x1="{x:.1f}" y1="10" x2="{x:.1f}" y2="{base}" stroke="red" stroke-width="2"/>'
            f'<text x="{x + 4:.1f}" y="22" fill="red">{_text(marker[1])}</text>'
        )
    return _svg(base + 40, body)


def _axis(left: float, span: float, y: float, low: float, high: float, label: str) -> str:
    """The x axis under a chart: a line, evenly spaced tick labels and the axis title."""
    parts = [f'<line x1="{left}" y1="{y}" x2="{left + span}" y2="{y}" stroke="#333"/>']
    for tick in range(TICKS + 1):
        x = left + span * tick / TICKS
        value = low + (high - low) * tick / TICKS
        parts.append(f'<text x="{x:.1f}" y="{y + 14}" text-anchor="middle">{_number(value)}</text>')
    middle = left + span / 2
    parts.append(f'<text x="{middle:.1f}" y="{y + 32}" text-anchor="middle">{_text(label)}</text>')
    return "".join(parts)


def _svg(height: float, body: str) -> str:
    return (
        f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
        f'height="{height:.0f}" viewBox="0 0 {WIDTH} {height:.0f}" font-size="11" '
        f'font-family="sans-serif">{body}</svg>'
    )


def _number(value: float) -> str:
    return f"{value:.4g}"


def _text(value: str) -> str:
    return html.escape(str(value), quote=True)

"""The report's aspect-ratio bucket section: kept samples per bucket (from buckets.json, so
the counts are the whole build's, not the report's first signature group)."""

from __future__ import annotations

import html
import json
from typing import Any

from mmcurate.core.storage import join
from mmcurate.pipeline.output.buckets_file import BUCKETS_FILE
from mmcurate.pipeline.report.charts import bar_chart


def bucket_section(fs: Any, root: str) -> str:
    """A bar per bucket that holds samples (widest first), with the mean aspect error; empty
    when the build wrote no buckets.json."""
    try:
        document = json.loads(fs.cat_file(join(root, BUCKETS_FILE)))
    except FileNotFoundError:
        return ""
    counts = {name: n for name, n in document.get("counts", {}).items() if n}
    if not counts:
        return ""
    order = sorted(counts, key=lambda name: -ratio(name))
    error, share = document.get("mean_aspect_error"), document.get("mean_crop_share")
    note = (
        f"<p>{html.escape(str(document.get('algorithm')))} buckets: {len(counts)} of "
        f"{len(document.get('buckets', []))} used by {document.get('samples')} samples; mean "
        f"aspect error {error}, mean share of pixels cropped {share}.</p>"
    )
    chart = bar_chart(order, [counts[name] for name in order], "kept samples")
    return f"<h2>Aspect-ratio buckets</h2>{note}{chart}"


def ratio(name: str) -> float:
    width, _, height = name.partition("x")
    try:
        return int(width) / int(height)
    except (ValueError, ZeroDivisionError):
        return 0.0

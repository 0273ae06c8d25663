"""Run one driver step in this fresh process and print its peak tree PSS above idle (JSON).

`python tests/driver_memory_child.py plan LIST [WARM]` plans a URL list (plan_urls, 10,000 rows a
partition); `... report FOLDER` renders FOLDER's report. Idle is measured after the imports,
so the figure is what the step itself holds. Used by tests/builds/test_driver_memory.py and by hand:
see its docstring for the figures.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mmcurate.pipeline.config import SourceConfig  # noqa: E402
from mmcurate.pipeline.report.page import render_report  # noqa: E402
from mmcurate.pipeline.sources.urls import plan_urls  # noqa: E402

from bench.memwatch import PeakMemory, tree_pss  # noqa: E402


def run(step: str, path: str) -> dict:
    if step == "plan":
        cfg = SourceConfig(kind="urls", path=path, files_per_task=10_000)
        parts = plan_urls(cfg, {})
        facts = {"parts": len(parts), "rows": sum(p.count for p in parts)}
        return facts | {"reads": sorted({p.read for p in parts})}
    return {"report": render_report(path, {})}


def main(step: str, path: str, warm: str | None = None) -> dict:
    """`warm`: a tiny input of the same kind run first, so that modules imported on first use
    (pa.array imports pandas: ~20 MB) count as idle, not as the step's."""
    if warm:
        run(step, warm)
    idle = tree_pss()
    began = time.perf_counter()
    with PeakMemory(interval=0.02) as peak:
        facts = run(step, path)
    facts |= {"idle": idle, "peak": peak.bytes, "above": peak.bytes - idle}
    return facts | {"seconds": round(time.perf_counter() - began, 2)}


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:4])))

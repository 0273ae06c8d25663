"""Peak memory of builds, measured in a fresh process (tests/builds/test_bounded_memory.py).

`python tests/bounded_build.py SPEC.json` reads {"warm": config, "build": config}: runs the
warm build first (the local pool's worker forks and imports everything a task needs), takes
the process tree's PSS then as `idle`, runs the measured build under a PSS watcher, and prints
{"idle": bytes, "peak": bytes} as JSON on its last line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from mmcurate.pipeline.build import run_build  # noqa: E402
from mmcurate.pipeline.config import BuildConfig  # noqa: E402
from mmcurate.pipeline.runtime.session import connect  # noqa: E402

from bench.memwatch import PeakMemory, tree_pss  # noqa: E402


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    warm = BuildConfig.model_validate(spec["warm"])
    runtime = connect(warm.ray)  # one runtime for both builds: the measured one runs warm
    try:
        run_build(warm, progress=False, runtime=runtime)
        idle = tree_pss()
        with PeakMemory(interval=0.02) as peak:
            run_build(BuildConfig.model_validate(spec["build"]), progress=False, runtime=runtime)
    finally:
        runtime.close()
    print(json.dumps({"idle": idle, "peak": peak.bytes}))


if __name__ == "__main__":
    main(sys.argv[1])

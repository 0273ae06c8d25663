"""Run every competitor runner in its own venv on the same shards; print their JSON lines.

    .venv/bin/python bench/loaders/run_all.py --shards DIR --work DIR [--rounds 2] [-- extra args]

Extra args after `--` go to every runner (e.g. --batches 40 --step-ms 250). Runners go
round-robin so background load drifts hit all of them alike.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

RUNNERS = {
    "mmcurate": ("run_mmcurate.py", common.HERE.parents[1] / ".venv"),
    "mmcurate-gpu-like": ("run_mmcurate.py", common.HERE.parents[1] / ".venv", "--gpu-like"),
    "mmcurate-no-ring": ("run_mmcurate.py", common.HERE.parents[1] / ".venv", "--no-ring"),
    "mmcurate-gpu-like-no-ring": (
        "run_mmcurate.py",
        common.HERE.parents[1] / ".venv",
        "--gpu-like",
        "--no-ring",
    ),
    "openclip_wds": ("run_openclip_wds.py", common.OPENCLIP_VENV),
    "webdataset": ("run_wds1.py", common.VENV),
    "streaming": ("run_streaming.py", common.VENV),
    "litdata": ("run_litdata.py", common.VENV),
}


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser()
    parser.add_argument("--shards", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--only", nargs="*", default=list(RUNNERS))
    parser.add_argument("--stall", nargs="*", default=[], help="loaders to run at 90%% demand")
    args = parser.parse_args(argv)
    common.ensure_venv()
    if not (common.OPENCLIP_VENV / "bin" / "python").exists():
        sys.path.insert(0, str(common.HERE.parent))
        from openclip_train import ensure_venv as ensure_openclip_venv

        ensure_openclip_venv()
    rates: dict[str, list[float]] = {name: [] for name in args.only}
    for _ in range(args.rounds):
        for name in args.only:
            result = run(name, args, extra)
            if "samples_per_s" in result:
                rates[name].append(result["samples_per_s"])
    summary = {name: statistics.median(r) for name, r in rates.items() if r}
    print(json.dumps({"median_samples_per_s": summary}), flush=True)
    for name in args.stall:  # a simulated step at 90% of the loader's median top rate
        step_ms = round(1000 * batch_size(extra) / (0.9 * summary[name]), 1)
        run(name, args, [*extra, "--step-ms", str(step_ms)])


def batch_size(extra: list[str]) -> int:
    return int(extra[extra.index("--batch-size") + 1]) if "--batch-size" in extra else 64


def run(name: str, args: argparse.Namespace, extra: list[str]) -> dict:
    """One runner in its own venv; prints and returns its JSON line."""
    script, venv, *flags = RUNNERS[name]
    command = [str(venv / "bin" / "python"), str(common.HERE / script), *flags]
    command += ["--shards", args.shards, "--work", args.work, *extra]
    result = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    lines = [x for x in result.stdout.splitlines() if x.startswith("{")]
    if result.returncode != 0 or not lines:
        out = {"loader": name, "error": result.stderr[-2000:]}
    else:
        out = json.loads(lines[-1])
    print(json.dumps(out), flush=True)
    return out


if __name__ == "__main__":
    main()

"""strategy ddp vs fsdp (and ddp with optim.zero, "zero") on the CPU (gloo): peak memory
(PSS of the whole torchrun tree) and step time of the same short run, 2 ranks, alternating
rounds (ddp, fsdp, zero, ddp, fsdp, zero, ...).

    .venv/bin/python bench/fsdp_vs_ddp.py --model ViT-B-32 --batch 4 --steps 6 --rounds 2

Each run: torchrun --nproc-per-node=2 -m mmcurate.trainer on tiny generated shards
(the pixels do not
change a step's compute), `run.max_steps` steps; the step time is the mean over the steps
after the first (from metrics.jsonl's samples_per_s), the peak the largest tree PSS seen.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
STRATEGIES = ("ddp", "fsdp", "zero")
sys.path.insert(0, str(REPO))

from bench.memwatch import PeakMemory  # noqa: E402
from tests.kit_shards import write_uneven_shards  # noqa: E402


def one_run(folder: Path, manifest: Path, strategy: str, args: argparse.Namespace) -> dict:
    output = folder / f"run-{strategy}-{len(list(folder.glob('run-*')))}"
    config = output.with_suffix(".yaml")
    tree = {
        "data": {"manifest": str(manifest), "batch_size": args.batch, "workers": 0, "seed": 1},
        "model": {"name": args.model, "gradient_checkpointing": args.checkpointing},
        "optim": {"zero": strategy == "zero"},
        "strategy": "ddp" if strategy == "zero" else strategy,
        "run": {"output": str(output), "max_steps": args.steps, "log_every": 1},
        "health": {"enabled": False},
    }
    config.write_text(yaml.safe_dump(tree))
    env = os.environ | {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": str(args.threads)}
    env |= {"PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    with PeakMemory(0.1) as peak:
        subprocess.run(
            [*cmd, "-m", "mmcurate.trainer", str(config)],
            check=True,
            env=env,
            cwd=REPO,
            capture_output=True,
        )
    rows = [json.loads(x) for x in (output / "metrics.jsonl").read_text().splitlines()]
    step_s = [args.batch * 2 / r["samples_per_s"] for r in rows[1:]]
    return {
        "strategy": strategy,
        "peak_gib": peak.bytes / 2**30,
        "step_s": statistics.mean(step_s),
        "losses": [r["loss"] for r in rows],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="ViT-B-32")
    parser.add_argument("--batch", type=int, default=4, help="per rank")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--checkpointing", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "shards").mkdir()
        manifest = write_uneven_shards(folder / "shards", sizes=(64,))
        results = [
            one_run(folder, manifest, s, args) for _ in range(args.rounds) for s in STRATEGIES
        ]
    for r in results:
        print(json.dumps(r))
    by = {s: [r for r in results if r["strategy"] == s] for s in STRATEGIES}
    peak = {s: statistics.median(r["peak_gib"] for r in v) for s, v in by.items()}
    step = {s: statistics.median(r["step_s"] for r in v) for s, v in by.items()}
    print(
        json.dumps(
            {
                "model": args.model,
                "batch_per_rank": args.batch,
                "ranks": 2,
                "peak_gib": peak,
                "step_s": step,
                "fsdp_over_ddp_peak": peak["fsdp"] / peak["ddp"],
                "fsdp_over_ddp_step": step["fsdp"] / step["ddp"],
                "zero_over_ddp_peak": peak["zero"] / peak["ddp"],
                "zero_over_ddp_step": step["zero"] / step["ddp"],
            }
        )
    )


if __name__ == "__main__":
    main()

"""Any checkpoint resumes under any strategy on any number of ranks (issue 45, item 4), and a
damaged DCP folder is passed over like a damaged `.pt` (item 5).

One module fixture writes a checkpoint of each strategy (ddp, ddp with optim.zero, fsdp) on 1
process and on 2 ranks (torchrun, gloo) and resumes every one of them with every strategy on 2
ranks and on 1 (tests/trainer_resume_child.py): 3 subprocesses in all."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mmcurate.core.config_io import ConfigError
from mmcurate.trainer.checkpoint import load_checkpoint, save_checkpoint
from mmcurate.trainer.config import TrainConfig
from mmcurate.trainer.dist.world import Dist
from mmcurate.trainer.resume import previous_checkpoint
from mmcurate.trainer.train import train

from tests.kit_shards import write_uneven_shards

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CHILD = str(REPO / "tests" / "trainer_resume_child.py")
STRATEGIES = ("ddp", "zero", "fsdp")


def child(steps: str, out: Path, manifest: Path, ranks: int | None) -> None:
    env = os.environ | {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, CHILD, steps, str(out), str(manifest)]
    if ranks:
        launch = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
        cmd = [sys.executable, *launch, *cmd[1:]]
    # The timeout only guards against a hang (a rank left alone in a collective).
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, cwd=REPO)
    lines = [x for x in result.stderr.splitlines() if "Error" in x or "error" in x]
    assert result.returncode == 0, "\n".join(lines[-30:])


@pytest.fixture(scope="module")
def matrix(tmp_path_factory) -> tuple[Path, Path]:
    manifest = write_uneven_shards(tmp_path_factory.mktemp("shards"), sizes=(40, 40))
    out = tmp_path_factory.mktemp("matrix")
    child("write", out, manifest, None)  # one process, no process group
    child("write,read", out, manifest, 2)  # torchrun: 2 ranks write, then resume all
    child("read", out, manifest, None)  # and one process resumes all
    return out, manifest


def test_every_checkpoint_resumes_under_every_strategy_and_world(matrix):
    """6 writers (ddp, zero, fsdp on 1 and 2 ranks) x 6 readers: the weights and every
    parameter's Adam state as saved (as the ranks held them), step 2, and a step after."""
    out, _ = matrix
    rows = [json.loads(x) for p in out.glob("results-*.jsonl") for x in p.read_text().splitlines()]
    writers = [f"{s}-w{w}" for s in STRATEGIES for w in (1, 2)]
    got = {(r["writer"], r["reader"], r["rank"]): r for r in rows}
    expected = {(w, f"{s}-w1", 0) for w in writers for s in STRATEGIES}
    expected |= {(w, f"{s}-w2", rank) for w in writers for s in STRATEGIES for rank in (0, 1)}
    assert set(got) == expected
    failed = {key: row.get("problem") or row.get("refused") for key, row in got.items()}
    assert {key: why for key, why in failed.items() if not got[key].get("ok")} == {}


def damaged_copy(matrix, tmp_path: Path) -> Path:
    """A copy of the fsdp-on-2-ranks run with two checkpoints: step-1 (the original, renamed)
    and step-2 (the same, to be damaged)."""
    out, _ = matrix
    run = tmp_path / "run"
    folder = run / "checkpoints"
    shutil.copytree(out / "fsdp-w2" / "checkpoints", folder)
    for step in (1, 2):
        if step != 2:
            shutil.copytree(folder / "step-2.dcp", folder / f"step-{step}.dcp")
        ckpt = load_checkpoint(str(folder / "step-2.pt"))
        ckpt |= {"step": step, "sharded": f"step-{step}.dcp"}
        save_checkpoint(str(folder / f"step-{step}.pt"), ckpt)
    return run


DAMAGE = {
    "truncated shard": lambda d: truncate(d / "__1_0.distcp", 1000),
    "empty shard": lambda d: truncate(d / "__0_0.distcp", 0),
    "missing shard": lambda d: (d / "__0_0.distcp").unlink(),
    "empty .metadata": lambda d: truncate(d / ".metadata", 0),
    "cut .metadata": lambda d: truncate(d / ".metadata", 100),
}


def truncate(path: Path, size: int) -> None:
    with path.open("r+b") as f:
        f.truncate(size)


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_dcp_folder_is_passed_over_for_the_next_newest(matrix, tmp_path, damage):
    """step-2.dcp damaged: the resume picks step-1 (rank 0 chooses for every rank)."""
    _, manifest = matrix
    run = damaged_copy(matrix, tmp_path)
    DAMAGE[damage](run / "checkpoints" / "step-2.dcp")
    cfg = TrainConfig.model_validate(
        {
            "data": {"manifest": str(manifest), "batch_size": 4, "workers": 0},
            "optim": {"lr": 1e-3, "warmup_steps": 1},
            "strategy": "fsdp",
            "run": {"output": str(run), "max_steps": 10, "resume": True},
        }
    )
    assert previous_checkpoint(cfg, str(run), Dist()).endswith("step-1.pt")


def test_a_resume_past_a_damaged_dcp_trains_on(matrix, tmp_path):
    """The whole run: `mmcurate train` with run.resume over a cut step-2.dcp resumes from
    step-1 and trains to max_steps; a shard garbled at its full size (which a size check
    cannot see) fails on one line, not a traceback."""
    _, manifest = matrix
    run = damaged_copy(matrix, tmp_path)
    truncate(run / "checkpoints" / "step-2.dcp" / "__1_0.distcp", 10)
    body = {
        "data": {"manifest": str(manifest), "batch_size": 4, "workers": 0},
        "optim": {"lr": 1e-3, "warmup_steps": 1},
        "strategy": "fsdp",
        "run": {"output": str(run), "max_steps": 3, "resume": True, "overwrite": False},
    }
    summary = train(TrainConfig.model_validate(body))
    assert summary["steps"] == 3
    assert int(load_checkpoint(str(run / "checkpoints" / "step-3.pt"))["step"]) == 3

    garbled = damaged_copy(matrix, tmp_path / "garbled")
    shard = garbled / "checkpoints" / "step-2.dcp" / "__0_0.distcp"
    shard.write_bytes(b"\x00" * shard.stat().st_size)
    body["run"] |= {"output": str(garbled)}
    with pytest.raises(ConfigError, match=r"step-2\.dcp does not load \(") as err:
        train(TrainConfig.model_validate(body))
    assert "\n" not in str(err.value)

"""A run's logs as the loop writes them: the stall meter's window (`Meter`), rank 0's
`metrics.jsonl` and TensorBoard scalars, and each rank's optional sample log. `LogFiles`
writes into `RunLogs.folder` (trainer/outputs.py: run.output, or its local mirror for a URL)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from mmcurate.core.config_io import ConfigError
from mmcurate.trainer.config import RunConfig
from mmcurate.trainer.loop_state import LoopState

# metrics.jsonl fields also written as TensorBoard scalars `train/<name>` (eval/* go as named)
BOARD_FIELDS = ("loss", "samples_per_s", "data_wait_frac", "lr", "epoch", "grad_norm")


@dataclass
class Meter:
    """One log window: data wait vs total step time, samples, and losses (kept on device so
    that logging, not every step, pays for the GPU sync)."""

    wait_s: float = 0.0
    total_s: float = 0.0
    samples: int = 0
    losses: list[torch.Tensor] = field(default_factory=list)
    grad_norms: list[torch.Tensor] = field(default_factory=list)

    def add(
        self,
        loss: torch.Tensor,
        samples: int,
        step_s: float,
        grad_norm: torch.Tensor | None = None,
        applied: bool = True,
    ) -> None:
        """One step; a skipped one (`applied` False) adds its time and samples only."""
        if applied:
            self.losses.append(loss)
            if grad_norm is not None:
                self.grad_norms.append(grad_norm)
        self.samples += samples
        self.total_s += step_s

    def flush(self, state: LoopState) -> dict[str, Any]:
        """The metrics row for this window; starts the next window."""
        total = self.total_s
        row = {
            "step": state.step,
            "samples": state.samples_seen,
            "loss": mean_of(self.losses),
            "samples_per_s": self.samples / total if total > 0 else 0.0,
            "data_wait_frac": min(self.wait_s / total, 1.0) if total > 0 else 0.0,
            "epoch": state.epoch,
            "grad_norm": mean_of(self.grad_norms),
        }
        self.wait_s, self.total_s, self.samples, self.losses = 0.0, 0.0, 0, []
        self.grad_norms = []
        return row


def mean_of(values: list[torch.Tensor]) -> float:
    """The mean of a window's device scalars (one sync); NaN for none."""
    return torch.stack(values).float().mean().item() if values else math.nan


def trim_log(path: Path, step: int) -> None:
    """Drop the lines a stopped run logged after the checkpoint it resumes from."""
    if path.is_file():
        lines = path.read_text().splitlines(keepends=True)
        path.write_text("".join(x for x in lines if json.loads(x)["step"] <= step))


def tensorboard_writer(output: Path) -> Any:
    """A SummaryWriter for `<output>/tensorboard`; one clear line when tensorboard is missing."""
    if importlib.util.find_spec("tensorboard") is None:
        raise ConfigError(
            "run.tensorboard: needs the tensorboard package (pip install tensorboard)"
        )
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(str(output / "tensorboard"))


def require_tensorboard(run: RunConfig) -> None:
    """Fail fast, before any model is built, when run.tensorboard lacks its package."""
    if run.tensorboard and importlib.util.find_spec("tensorboard") is None:
        tensorboard_writer(Path(run.output))


class LogFiles:
    """Rank 0's `metrics.jsonl` and TensorBoard writer, and this rank's sample log
    (run.sample_log). Opened for appending after `resume_step`'s lines (later ones, logged by
    the stopped run after its checkpoint, are dropped), else afresh."""

    def __init__(
        self, folder: Path, run: RunConfig, rank: int, resume_step: int | None = None
    ) -> None:
        self.folder = folder
        sample_path = folder / "samples" / f"rank-{rank}.jsonl"
        mode = "w" if resume_step is None else "a"
        if resume_step is not None:
            for path in (folder / "metrics.jsonl", sample_path):
                trim_log(path, resume_step)
        with contextlib.ExitStack() as files:
            self.metrics = (
                files.enter_context(open(folder / "metrics.jsonl", mode)) if rank == 0 else None
            )
            self.samples = None
            if run.sample_log:
                sample_path.parent.mkdir(exist_ok=True)
                self.samples = files.enter_context(open(sample_path, mode))
            self.board: Any = None
            if run.tensorboard and rank == 0:
                self.board = tensorboard_writer(folder)
                files.callback(self.board.close)
            self.files = files.pop_all()  # closed by close(); by the stack on a failure here

    def write_row(self, row: dict[str, Any]) -> None:
        """One metrics.jsonl line (rank 0), and its scalars to TensorBoard."""
        if self.metrics:
            self.metrics.write(json.dumps(row) + "\n")
            self.metrics.flush()
        if self.board:
            for name in BOARD_FIELDS:
                self.board.add_scalar(f"train/{name}", row[name], row["step"])
            for name in (k for k in row if k.startswith(("eval/", "gpu/"))):
                self.board.add_scalar(name, row[name], row["step"])
            self.board.flush()

    def write_keys(self, step: int, keys: list[str], used: list[str] | None = None) -> None:
        """One sample-log line: the planned keys of the step's batches on this rank, and,
        when some places were filled by other samples of their batch, `used`: the key each
        place really held ("" for a stand-in), so the log is an audit of what was trained on."""
        if self.samples:
            line = {"step": step, "keys": keys}
            if used is not None and used != keys:
                line["used"] = used
            self.samples.write(json.dumps(line) + "\n")
            self.samples.flush()

    def flush(self) -> None:
        for stream in (self.metrics, self.samples):
            if stream:
                stream.flush()
        if self.board:
            self.board.flush()

    def close(self) -> None:
        self.files.close()

    def __enter__(self) -> LogFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

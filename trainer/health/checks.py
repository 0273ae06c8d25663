"""The training loop's guards (`health:` in the train config).

Every step, between backward and the optimizer step, the guard looks at the loss and the
gradient norm. All ranks all-reduce one small tensor (non-finite flag, loss, norm) so that they
all decide the same: one rank's NaN skips the step on every rank.

- A non-finite loss or gradient norm skips the step: no weight update (the schedule still
  advances; the step counts toward run.max_steps), counted as `skipped_steps`. With fp16's
  grad scaler on, an overflowing gradient is the scaler's business (it skips and lowers its
  scale); only a non-finite loss counts then.
- `max_skipped` skipped steps in a row, or a loss spike (the loss, mean over ranks, above the
  median of the last `spike_window` healthy losses by `spike_sigmas` robust deviations, 1.4826 x
  the median absolute deviation, for `spike_steps` steps in a row) trigger `action`:
  `restore` loads the model, optimizer and scaler of the last good checkpoint (one written
  while no skip or spike streak was running) and goes on with the next data: the loader is
  not rewound, so no sample is trained on twice; `stop` ends the run (no final checkpoint).

Test hook (tests only, never set in real runs): the environment variable MMCURATE_TEST_FAULTS
holds JSON `{"nan": [steps], "spike": [steps], "kill": [steps], "ranks": [ranks], "factor":
1000}`: at those steps (numbered from 1) the listed ranks (all when absent) get a batch whose
images are NaN, or a loss multiplied by `factor`, or are killed with SIGKILL before the step
(only in the first attempt: not after a torchrun or Ray Train restart, `restart_count`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import statistics
from collections import deque
from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist
from mmcurate.trainer.config import HealthConfig
from mmcurate.trainer.data.batch import Batch
from mmcurate.trainer.dist.world import Dist, restart_count
from mmcurate.trainer.step import Learner, StepResult, guarded_step

log = logging.getLogger(__name__)
FAULTS_ENV = "MMCURATE_TEST_FAULTS"


@dataclass
class Faults:
    """The test hook's plan for this rank (empty unless MMCURATE_TEST_FAULTS is set)."""

    nan: set[int] = field(default_factory=set)
    spike: set[int] = field(default_factory=set)
    factor: float = 1000.0
    kill: set[int] = field(default_factory=set)  # SIGKILL this rank there (first attempt only)

    @classmethod
    def from_env(cls, rank: int) -> Faults:
        text = os.environ.get(FAULTS_ENV)
        if not text:
            return cls()
        plan = json.loads(text)
        if rank not in plan.get("ranks", [rank]):
            return cls()
        first = restart_count() == 0
        kill = set(plan.get("kill", ())) if first else set()
        nan, spike = set(plan.get("nan", ())), set(plan.get("spike", ()))
        return cls(nan, spike, plan.get("factor", 1e3), kill)

    def apply(self, step: int, learner: Learner, group: list[Batch]) -> tuple[Learner, list[Batch]]:
        if step in self.kill:  # a lost rank, as a dead GPU or a kill -9 leaves it
            os.kill(os.getpid(), signal.SIGKILL)
        if step in self.nan:
            group = [b._replace(images=poisoned(b.images)) for b in group]
        if step in self.spike:
            learner = replace(learner, loss_fn=ScaledLoss(learner.loss_fn, self.factor))
        return learner, group


def poisoned(images: torch.Tensor | list[torch.Tensor]) -> torch.Tensor | list[torch.Tensor]:
    """A NaN copy (the loader's own memory is left alone)."""
    if isinstance(images, list):
        return [poisoned(image) for image in images]
    return torch.full_like(images, math.nan, dtype=torch.float32)


class ScaledLoss(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module, factor: float) -> None:
        super().__init__()
        self.inner, self.factor = inner, factor

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.inner(*args) * self.factor


class LossWatch:
    """The robust running baseline of healthy losses and the current spike streak."""

    def __init__(self, cfg: HealthConfig) -> None:
        self.cfg = cfg
        self.window: deque[float] = deque(maxlen=cfg.spike_window)
        self.streak = 0

    def limit(self) -> float | None:
        """The loss above which a step spikes; None while there are too few losses."""
        if self.cfg.spike_sigmas is None or len(self.window) < self.cfg.spike_warmup:
            return None
        median = statistics.median(self.window)
        mad = statistics.median(abs(x - median) for x in self.window)
        sigma = max(1.4826 * mad, 1e-3 * abs(median), 1e-8)  # a flat loss still has a floor
        return median + self.cfg.spike_sigmas * sigma

    def observe(self, loss: float) -> bool:
        """Add a finite, applied step's loss; True when it spikes (spikes stay out of the
        baseline)."""
        limit = self.limit()
        if limit is not None and loss > limit:
            self.streak += 1
            return True
        self.streak = 0
        self.window.append(loss)
        return False


@dataclass
class Verdict:
    """What the guard found at one step (the same on every rank)."""

    event: str | None = None  # "nonfinite" | "spike" | None
    action: str | None = None  # "restore" | "stop" | None: what the loop does now
    message: str = ""


class Health:
    """Judges each step (a collective call on every rank) and counts what it found."""

    def __init__(self, cfg: HealthConfig, place: Dist, scaler_on: bool) -> None:
        self.cfg, self.place, self.scaler_on = cfg, place, scaler_on
        self.faults = Faults.from_env(place.rank)
        self.watch = LossWatch(cfg)
        self.skipped = 0  # skipped steps in the run (since its start or resume)
        self.skip_streak = 0
        self.restores = 0
        self.loss = math.nan  # the last judged step's loss, mean over ranks
        self.bad = False

    @property
    def healthy(self) -> bool:
        """No skip or spike streak running: a checkpoint written now is a good one."""
        return self.skip_streak == 0 and self.watch.streak == 0

    def step(self, learner: Learner, group: list[Batch], step: int) -> StepResult:
        """One guarded optimizer step (`step`: its number, counted from 1)."""
        learner, group = self.faults.apply(step, learner, group)
        if not self.cfg.enabled:
            return guarded_step(learner, group)
        return guarded_step(learner, group, self.judge)

    def judge(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> bool:
        """The guard: True takes the step. One all-reduce over the ranks."""
        bad = ~torch.isfinite(loss.float())
        if not self.scaler_on:
            bad = bad | ~torch.isfinite(grad_norm.float())
        safe = torch.nan_to_num(loss.float().reshape(()), nan=0.0, posinf=0.0, neginf=0.0)
        values = torch.stack([bad.float().reshape(()), safe]).to(self.place.device)
        if self.place.world > 1:
            dist.all_reduce(values)
        flags, total = values.tolist()
        self.bad, self.loss = flags > 0, total / self.place.world
        return not self.bad

    def verdict(self, step: int) -> Verdict:
        """After a judged step: counts, and the action due (if any)."""
        if not self.cfg.enabled:
            return Verdict()
        if self.bad:
            self.skipped += 1
            self.skip_streak += 1
            message = f"step {step}: non-finite loss or gradient norm, update skipped"
            if self.skip_streak >= self.cfg.max_skipped:
                return self.act("nonfinite", f"{message} ({self.skip_streak} in a row)")
            return Verdict("nonfinite", None, message)
        self.skip_streak = 0
        if not self.watch.observe(self.loss):
            return Verdict()
        message = f"step {step}: loss {self.loss:.4g} above {self.watch.limit():.4g}"
        if self.watch.streak >= self.cfg.spike_steps:
            return self.act("spike", f"{message} ({self.watch.streak} steps in a row)")
        return Verdict()

    def act(self, event: str, message: str) -> Verdict:
        action = self.cfg.action
        if action == "restore" and self.restores >= self.cfg.max_restores:
            action = "stop"
            message += f"; {self.restores} restores already (health.max_restores)"
        return Verdict(event, action, message)

    def restored(self) -> None:
        """The loop reloaded the last good checkpoint: streaks start over."""
        self.restores += 1
        self.skip_streak = 0
        self.watch.streak = 0

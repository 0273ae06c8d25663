"""What the training loop does with health's verdicts and the alerts: the guarded step, the
restore from the last good checkpoint, the stall and end-of-run alerts, and the extra
metrics fields (`grad_norm`, `skipped_steps`, `restores`, `logit_scale`, `peak_memory_gib`)."""

from __future__ import annotations

import logging
import posixpath
from typing import Any

import torch
import torch.distributed as dist
from mmcurate.trainer.checkpoint import checkpoint_exists
from mmcurate.trainer.config import TrainConfig
from mmcurate.trainer.data.batch import Batch
from mmcurate.trainer.dist.world import Dist
from mmcurate.trainer.health.alerts import Alerts
from mmcurate.trainer.health.checks import Health, Verdict
from mmcurate.trainer.loop_state import LoopState
from mmcurate.trainer.resume import reload_weights
from mmcurate.trainer.step import Learner, StepResult

log = logging.getLogger(__name__)


def open_alerts(cfg: TrainConfig, place: Dist) -> Alerts:
    """Rank 0's sender (the other ranks' sends nothing: every rank sees the same events)."""
    section = cfg.alerts
    url = section.webhook if place.rank == 0 else None
    run = section.run_name or posixpath.basename(cfg.run.output.rstrip("/"))
    return Alerts(url, run, section.timeout_s, section.retries)


def every_rank(place: Dist, flag: bool) -> bool:
    """True when `flag` holds on every rank (a collective call)."""
    if place.world == 1:
        return flag
    value = torch.tensor([0 if flag else 1], device=place.device)
    dist.all_reduce(value)
    return value.item() == 0


class Guard:
    """Health and alerts for one Trainer."""

    def __init__(
        self, cfg: TrainConfig, learner: Learner, place: Dist, state: LoopState, alerts: Alerts
    ) -> None:
        self.cfg, self.learner, self.place, self.alerts = cfg, learner, place, alerts
        self.state = state  # the Trainer's: its counts kept current for its checkpoints
        self.health = Health(cfg.health, place, learner.scaler.is_enabled())
        self.health.skipped, self.health.restores = state.skipped_steps, state.restores
        self.good: str | None = None  # the newest checkpoint written while healthy
        self.stopped: str | None = None  # why health stopped the run
        self.stalled = False
        self.rows = 0
        self.verdict = Verdict()  # the last step's

    def step(self, group: list[Batch], step: int) -> StepResult:
        """Step number `step`, guarded; judged at once (the log and a checkpoint of this step
        see its counts), acted on in `after`."""
        result = self.health.step(self.learner, group, step)
        self.verdict = self.health.verdict(step)
        self.state.skipped_steps = self.health.skipped
        return result

    def saved(self, path: str) -> None:
        """A checkpoint was written (or resumed from)."""
        if self.health.healthy:
            self.good = path

    def after(self, state: LoopState) -> str | None:
        """Act on the step just counted in `state`: None, "restored" (the last good
        checkpoint's weights are back) or "stop" (the run must end: `stopped` says why)."""
        verdict = self.verdict
        if verdict.event == "nonfinite" and self.health.skip_streak == 1 or verdict.action:
            log.warning("health: %s", verdict.message)
            self.alerts.send(verdict.event, state.step, verdict.message, self.fields())
        if verdict.action == "restore":
            return self.restore(state, verdict)
        if verdict.action == "stop":
            self.stopped = verdict.message
        return verdict.action

    def restore(self, state: LoopState, verdict: Verdict) -> str:
        good = self.good
        readable = good is not None and checkpoint_exists(good, self.cfg.storage_options)
        if not every_rank(self.place, readable):
            self.stopped = f"{verdict.message}; no good checkpoint to restore"
            return "stop"
        reload_weights(self.learner, good, self.cfg)
        self.health.restored()
        state.restores = self.health.restores
        message = f"step {state.step}: restored {posixpath.basename(good)}, going on with new data"
        log.warning("health: %s", message)
        self.alerts.send("restore", state.step, message, self.fields())
        return "restored"

    def fields(self) -> dict[str, Any]:
        """This step's health fields for metrics.jsonl and alerts."""
        row: dict[str, Any] = {
            "skipped_steps": self.health.skipped,
            "restores": self.health.restores,
            "logit_scale": self.learner.core.logit_scale.detach().exp().item(),
        }
        if self.learner.device.type == "cuda":
            row["peak_memory_gib"] = torch.cuda.max_memory_allocated(self.learner.device) / 2**30
        return row

    def logged(self, row: dict[str, Any]) -> None:
        """A metrics row was written: alert once when the data wait crosses the threshold
        (the first row, holding the loader's start-up, never counts)."""
        self.rows += 1
        limit = self.cfg.alerts.stall_frac
        stalled = limit is not None and self.rows > 1 and row["data_wait_frac"] > limit
        if stalled and not self.stalled:
            wait = row["data_wait_frac"]
            message = f"step {row['step']}: data_wait_frac {wait:.0%} above {limit:.0%}"
            self.alerts.send("data_stall", row["step"], message, row)
        self.stalled = stalled

    def failed(self, err: Exception, step: int) -> None:
        """The run ended with an error at `step` (it is raised on after this)."""
        message = f"failed: {type(err).__name__}: {str(err)[:500]}"
        self.alerts.send("run_end", step, message)
        self.alerts.close()

    def end(self, summary: dict[str, Any]) -> None:
        message = f"stopped: {self.stopped}" if self.stopped else "finished"
        self.alerts.send("run_end", summary["steps"], message, summary)
        self.alerts.close()

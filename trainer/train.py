"""The CLIP training loop: open_clip model + contrastive (or SigLIP) loss, AdamW, warmup +
cosine, gradient accumulation, DDP, exact mid-epoch resume, a stall meter and evaluation
during training.

`<run.output>/metrics.jsonl` (rank 0) gets one line at step 1, every `log_every` steps, at
every evaluation and at the end. Each line covers the steps since the previous one: `loss` is
their mean (rank 0's), `samples_per_s` their throughput over all ranks, `data_wait_frac` the
share of their wall time rank 0 spent waiting for the next batch (near 0: compute-bound; near
1: the input pipeline is the bottleneck). `samples` and `step` are totals; an evaluation adds
its metrics as `eval/<name>` (trainer/eval/in_training.py). Checkpoints go to
`<run.output>/checkpoints/step-<N>.pt` and hold the loader's position: a resumed run sees
exactly the samples the stopped one had not yet trained on. `run.output` may be an object-store
URL (trainer/outputs.py says how its logs get there).

Distributed: under torchrun (or Ray Train, trainer/launch.py) every rank runs `train`; the
process group comes from the environment (trainer/dist/world.py).

The pieces: dist/world.py (the `Dist` value), step.py (loss, accumulation, optimizer),
data/prefetch.py (batches onto the device), loop_state.py (where training stands), resume.py
(checkpoints and resume), run_log.py (metrics, TensorBoard, sample logs), eval/in_training.py
(evaluation), health/ (non-finite and loss-spike guards, restores, the webhook alerts, GPU
telemetry); this module builds them and runs the loop.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, replace
from typing import Any

import torch
from mmcurate.core.config_io import ConfigError
from mmcurate.core.storage import join
from mmcurate.trainer.checkpoint import checkpoint_path, checkpoint_step
from mmcurate.trainer.config import TrainConfig
from mmcurate.trainer.data.cache import check_cache_dir
from mmcurate.trainer.data.dataset import Batch, ShardDataset
from mmcurate.trainer.data.plan import batches_per_rank
from mmcurate.trainer.data.prefetch import DevicePrefetcher, timed
from mmcurate.trainer.dist import sharded
from mmcurate.trainer.dist.fsdp import weights_and_optimizer
from mmcurate.trainer.dist.world import Dist, barrier, leave, setup_distributed
from mmcurate.trainer.eval.in_training import Evaluator, open_evaluator
from mmcurate.trainer.health.guard import Alerts, Guard, open_alerts
from mmcurate.trainer.health.telemetry import Telemetry, open_telemetry
from mmcurate.trainer.loop_state import (
    LoopState,
    carry_epoch,
    data_totals,
    finished,
    minutes_due,
)
from mmcurate.trainer.models import resolve_weights
from mmcurate.trainer.outputs import RunLogs, check_output
from mmcurate.trainer.resume import (
    announce_restart,
    clear_previous_run,
    previous_checkpoint,
    restarted_config,
    save_shards,
    save_state,
    start_state,
)
from mmcurate.trainer.run_log import (
    LogFiles,
    Meter,
    require_tensorboard,
)
from mmcurate.trainer.step import (
    Learner,
    build_learner,
    lr_of,
    planned_steps,
)
from mmcurate.trainer.train_data import (
    make_dataset,
    make_training_loader,
    read_sources,
)
from tqdm import tqdm

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunData:
    """What the loop reads: the planned dataset and the loader over it."""

    dataset: ShardDataset
    loader: Any


@dataclass(frozen=True)
class Reports:
    """Where the loop reports: the run's log folder and files, the evaluator, the alert
    sender and the GPU telemetry (each optional but the logs)."""

    logs: RunLogs
    files: LogFiles
    evaluator: Evaluator | None = None
    alerts: Alerts | None = None
    telemetry: Telemetry | None = None  # GPU readings for the log rows (rank 0)


class Trainer:
    """Runs epochs over the loader from a given state (fresh or resumed); owns the loop
    state, the stall meter and the outputs (written by rank 0, except each rank's optional
    sample log)."""

    def __init__(
        self,
        cfg: TrainConfig,
        learner: Learner,
        data: RunData,
        place: Dist,
        reports: Reports,
        state: LoopState,
        checkpoint: str | None = None,  # the checkpoint `state` was restored from
    ) -> None:
        self.cfg, self.learner, self.dataset, self.loader = cfg, learner, data.dataset, data.loader
        self.place, self.logs, self.files = place, reports.logs, reports.files
        self.state, self.checkpoint = state, checkpoint  # checkpoint: the newest written
        self.evaluator, self.telemetry = reports.evaluator, reports.telemetry
        self.guard = Guard(cfg, learner, place, state, reports.alerts or Alerts(None, ""))
        if checkpoint:
            self.guard.saved(checkpoint)
        self.meter = Meter()
        self.saved_at = time.monotonic()  # run.checkpoint_minutes counts from here
        self.epoch_batches = data.dataset.batches_per_epoch(state.epoch)  # a re-split one: fewer
        self.first_loss: float | None = None
        self.last_loss: torch.Tensor | None = None
        self.last_lr = 0.0
        self.last_eval: dict[str, Any] | None = None  # the newest evaluation (summary.json)
        # A progress bar on rank 0's terminal only (tqdm turns itself off off a TTY).
        off = None if place.rank == 0 else True
        self.bar = tqdm(total=cfg.run.max_steps, unit="step", desc="train", disable=off)

    def fit(self) -> None:
        if self.epoch_batches == 0:
            raise ConfigError(
                f"data.batch_size: an epoch of {self.dataset.epoch_samples} samples holds no "
                f"full step of {self.cfg.data.batch_size} x accum_freq "
                f"{self.cfg.optim.accum_freq} samples for each of {self.place.world} ranks"
            )
        self.bar.update(self.state.step)  # a resumed run starts where it stopped
        run = self.cfg.run
        left = None if run.max_steps is not None else run.epochs - self.state.epoch
        self.dataset.set_epoch(self.state.epoch, left)
        self.dataset.resume_at(self.state.epoch, self.state.batches_in_epoch)
        if not finished(self.cfg.run, self.state):
            batches = iter(self.loader)  # one set of workers for the whole run
            try:
                self.run(DevicePrefetcher(batches, self.place.device, self.dataset.transform))
            finally:
                batches.close()  # stops the loader workers before the final checkpoint
        self.finish()
        self.bar.close()

    def run(self, batches: DevicePrefetcher) -> None:
        accum = self.cfg.optim.accum_freq
        tick, group = time.perf_counter(), []
        for batch in timed(iter(batches), self.meter):
            group.append(batch)
            if len(group) < accum:
                continue
            lr = lr_of(self.learner)  # the lr this step uses; the step advances the schedule
            out = self.guard.step(group, self.state.step + 1)  # health's guarded step
            now = time.perf_counter()
            samples = sum(len(b.keys) for b in group) * self.place.world
            self.meter.add(out.loss, samples, now - tick, out.grad_norm, out.applied)
            tick = now  # logging and checkpoint time count toward the next step
            tick += self.after_step(out.loss, group, lr)  # evaluation time does not
            group = []
            action = self.guard.after(self.state)  # health: None, "restored" or "stop"
            if action == "restored":  # the step's checkpoint (if any) is not the final one
                self.checkpoint = self.guard.good
            if action == "stop" or finished(self.cfg.run, self.state):
                return

    def after_step(self, loss: torch.Tensor, group: list[Batch], lr: float) -> float:
        """Count the step, log, evaluate and checkpoint as due (a periodic checkpoint only
        while healthy); returns the seconds spent evaluating."""
        state, run = self.state, self.cfg.run
        state.step += 1
        state.batches_in_epoch += len(group)
        if state.batches_in_epoch >= self.epoch_batches:  # epochs hold whole steps
            state.epoch, state.batches_in_epoch, state.carried = state.epoch + 1, 0, []
            self.epoch_batches = self.dataset.batches_per_epoch(state.epoch)
        state.samples_seen += sum(len(b.keys) for b in group) * self.place.world
        for batch in group:
            state.skipped_shards.update(batch.skipped)
            state.replaced_samples += batch.replaced
        self.files.write_keys(
            state.step,
            [key for batch in group for key in batch.keys],
            [key for batch in group for key in (batch.used or batch.keys)],
        )
        self.bar.update()
        if self.telemetry:
            self.telemetry.step = state.step
        if self.first_loss is None:
            self.first_loss = loss.item()
        self.last_loss, self.last_lr = loss, lr
        spent, metrics = self.evaluate_if_due()
        if metrics or state.step == 1 or state.step % run.log_every == 0:
            self.log(lr, metrics)
        due = run.checkpoint_every and state.step % run.checkpoint_every == 0
        due = due or minutes_due(self.cfg.run, self.place, self.saved_at)
        # Not during a skip or spike streak: the newest checkpoint must stay a good one (the
        # one a restore reloads and, after health's stop, the one a resume starts from).
        if due and self.guard.health.healthy:
            self.save()
        return spent

    def evaluate_if_due(self) -> tuple[float, dict[str, float]]:
        """(seconds spent, `eval/<name>` metrics) of this step's evaluation: every
        `eval.every` steps and at the last step; (0, {}) when none is due."""
        section, step = self.cfg.eval, self.state.step
        every = (section.every and step % section.every == 0) or finished(self.cfg.run, self.state)
        if self.evaluator is None or not every:
            return 0.0, {}
        start = time.perf_counter()
        self.last_eval = self.evaluator(self.learner.core, step)
        logged = {f"eval/{name}": value for name, value in self.last_eval["metrics"].items()}
        return time.perf_counter() - start, logged

    def save(self) -> None:
        """Checkpoint this step (rank 0). For a URL output every rank first uploads its logs:
        a stop between the two then leaves logs past the newest checkpoint, which a resume
        trims, never a checkpoint past the logs, which would lose their lines."""
        if self.logs.remote:
            self.files.flush()
            self.logs.upload()
            barrier(self.place)
        skipped, replaced = self.totals()  # all ranks': rank 0 saves them
        self.saved_at = time.monotonic()
        gathered = weights_and_optimizer(self.learner)  # fsdp: a collective call
        shards = save_shards(self.learner, self.cfg, self.state.step)  # fsdp: every rank's own
        if self.place.rank == 0:
            samples, folder = self.dataset.epoch_samples, self.logs.folder
            state = replace(self.state, skipped_shards=skipped, replaced_samples=replaced)
            self.checkpoint = save_state(
                self.learner, state, self.cfg, self.place.world, samples, folder, gathered, shards
            )
        else:
            self.checkpoint = checkpoint_path(self.cfg.run.output, self.state.step)
        self.guard.saved(self.checkpoint)

    def summary(self) -> dict[str, Any]:
        """The run's summary; every rank calls it (the data totals are all ranks')."""
        skipped, replaced = self.totals()
        if skipped and self.place.rank == 0:
            log.warning(
                "%d of %d shards were unusable and skipped (the warnings above say why); "
                "%d samples were replaced by others",
                len(skipped),
                len(self.dataset.shards),
                replaced,
            )
        output = self.cfg.run.output
        summary = {
            "steps": self.state.step,
            "samples": self.state.samples_seen,
            "epoch": self.state.epoch,
            "rank": self.place.rank,
            "world": self.place.world,
            "first_loss": self.first_loss,
            "last_loss": self.last_loss.item() if self.last_loss is not None else None,
            "device": str(self.place.device),
            "output": output,
            "metrics": join(output, "metrics.jsonl"),
            "checkpoint": self.checkpoint,
            "skipped_shards": len(skipped),  # unusable shards skipped, all ranks
            "replaced_samples": replaced,  # batch places filled with another sample, all ranks
            "skipped_steps": self.state.skipped_steps,  # health: non-finite steps skipped
            "restores": self.state.restores,  # health: last good checkpoint reloaded
            "stopped": self.guard.stopped,  # health: why it stopped the run (null: it did not)
        }
        if self.last_eval is not None:
            summary["eval"] = self.last_eval
        return summary

    def totals(self) -> tuple[set[int], int]:
        """(skipped shards, replaced samples) of all ranks so far (a collective call)."""
        return data_totals(self.state, self.place, len(self.dataset.shards))

    def log(self, lr: float, extra: dict[str, float] | None = None) -> None:
        skipped, replaced = self.totals()
        row = self.meter.flush(self.state) | {"lr": lr}
        row |= {"skipped_shards": len(skipped), "replaced_samples": replaced}
        row |= self.guard.fields() | (extra or {})
        row |= self.telemetry.fields() if self.telemetry else {}
        self.bar.set_postfix(
            loss=f"{row['loss']:.3f}",
            samples_s=f"{row['samples_per_s']:.0f}",
            data_wait=f"{row['data_wait_frac']:.0%}",
        )
        self.files.write_row(row)
        self.guard.logged(row)

    def finish(self) -> None:
        """Log the last partial window and checkpoint the final step (once)."""
        if self.meter.samples:
            self.log(self.last_lr)
        if self.guard.stopped:  # the weights are suspect: the last good checkpoint stays newest
            return
        if self.checkpoint != checkpoint_path(self.cfg.run.output, self.state.step):
            self.save()


def check_folders(cfg: TrainConfig) -> None:
    """The local folders a run writes, checked before anything starts (one line each)."""
    check_cache_dir(cfg.data.cache_dir)
    check_output(cfg.run.output)


def train(cfg: TrainConfig) -> dict[str, Any]:
    """Train a CLIP model on a build's shards; returns a summary of the run."""
    require_tensorboard(cfg.run)  # fails fast, before any model is built
    resolve_weights(cfg.model.name, cfg.model.pretrained, cfg.storage_options)  # and these
    check_folders(cfg)
    place = setup_distributed()
    cfg = restarted_config(cfg, place)  # a torchrun restart continues its own run
    torch.manual_seed(cfg.data.seed)  # the same initial weights on every rank
    previous = previous_checkpoint(cfg, cfg.run.output, place)  # before the model: fails fast
    eval_sets = open_evaluator(cfg, place)  # so does a bad eval set
    sources = read_sources(cfg)
    total = sum(round(weight * sum(s.samples for s in m.shards)) for m, weight in sources)
    batches = batches_per_rank(total, place.world, cfg.data.batch_size, cfg.optim.accum_freq)
    learner, (preprocess, tokenizer) = build_learner(
        cfg, place, planned_steps(cfg.run, batches // cfg.optim.accum_freq)
    )
    torch.manual_seed(cfg.data.seed + place.rank)  # each rank its own augmentations
    dataset = make_dataset(cfg, sources, place, preprocess, tokenizer)
    loader = make_training_loader(cfg, dataset, place)
    clear_previous_run(cfg, place)  # run.overwrite, now that nothing above failed
    logs = RunLogs(cfg.run.output, place.rank, cfg.storage_options)
    logs.start(resume=bool(previous))
    resume_step = checkpoint_step(previous) if previous else None
    with LogFiles(logs.folder, cfg.run, place.rank, resume_step) as files:
        state = start_state(learner, previous, cfg, place, total)
        carry_epoch(dataset, state)  # a mid-epoch resume on another layout
        evaluator = eval_sets.evaluator(learner.core, tokenizer) if eval_sets else None
        alerts = open_alerts(cfg, place)
        announce_restart(alerts, place, state, previous)
        telemetry = open_telemetry(cfg, place.local_rank, place.rank, alerts)
        reports = Reports(logs, files, evaluator, alerts, telemetry)
        trainer = Trainer(cfg, learner, RunData(dataset, loader), place, reports, state, previous)
        try:
            trainer.fit()
        except Exception as err:
            trainer.guard.failed(err, trainer.state.step)  # the run_end alert (rank 0)
            raise
        finally:
            if trainer.telemetry:  # its alerts go before the sender closes
                trainer.telemetry.stop()
            sharded.wait()  # an async checkpoint save still writing
        summary = trainer.summary()  # every rank, before the process group goes
        trainer.guard.end(summary)  # the run_end alert (rank 0)
    barrier(place)  # rank 0's final checkpoint is on disk before any rank reports done
    leave(place)
    if place.rank == 0:
        (logs.folder / "summary.json").write_text(json.dumps(summary))
    logs.finish()
    return summary

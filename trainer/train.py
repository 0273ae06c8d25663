"""The CLIP training loop: open_clip model + contrastive (or SigLIP) loss, AdamW, warmup +
cosine, gradient accumulation, DDP, exact mid-epoch resume and a stall meter.

`<run.output>/metrics.jsonl` (rank 0) gets one line at step 1, every `log_every` steps and at
the end. Each line covers the steps since the previous one: `loss` is their mean (rank 0's),
`samples_per_s` their throughput over all ranks, `data_wait_frac` the share of their wall time
rank 0 spent waiting for the next batch (near 0: compute-bound; near 1: the input pipeline is
the bottleneck). `samples` and `step` are totals. Checkpoints go to
`<run.output>/checkpoints/step-<N>.pt` and hold the loader's position: a resumed run sees
exactly the samples the stopped one had not yet trained on. `run.output` may be an object-store
URL (trainer/outputs.py says how its logs get there).

Distributed: under torchrun (or Ray Train, trainer/launch.py) every rank runs `train`; the
process group comes from the environment, gloo on CPU and NCCL on GPU.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import math
import os
import posixpath
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

import open_clip
import torch
import torch.distributed as dist
import torch.nn.functional as F
from open_clip.loss import SigLipLoss
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from core.config_io import ConfigError
from core.storage import join
from trainer.checkpoint import (
    CHECKPOINT_FORMAT,
    checkpoint_exists,
    checkpoint_path,
    checkpoint_step,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from trainer.config import OptimConfig, TrainConfig
from trainer.data import Batch, ImageTransform, ShardDataset, make_loader
from trainer.manifest import Manifest, read_manifest
from trainer.models import build_model, open_clip_state_dict
from trainer.outputs import RunLogs, remove_run
from trainer.plan import batches_per_rank

log = logging.getLogger(__name__)

# Loader settings a mid-epoch resume must share with the run that wrote the checkpoint.
LOADER_LAYOUT = (
    *("seed", "batch_size", "workers", "world", "shuffle_buffer", "accum_freq"),
    "manifest_samples",  # a changed manifest would change the plan
)


@dataclass(frozen=True)
class Dist:
    """This process's place in the job."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    owns_group: bool = False  # this process made the process group (torchrun; not Ray)


def setup_distributed() -> Dist:
    """Join the process group torchrun (or Ray Train) describes; a single process otherwise."""
    cuda = torch.cuda.is_available()
    owns = not dist.is_initialized() and int(os.environ.get("WORLD_SIZE", "1")) > 1
    if owns:
        dist.init_process_group("nccl" if cuda else "gloo")
    if not dist.is_initialized():
        return Dist(device=torch.device("cuda" if cuda else "cpu"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    # Why modulo: Ray Train may show each worker only its own GPU.
    device = torch.device(f"cuda:{local_rank % torch.cuda.device_count()}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    return Dist(dist.get_rank(), dist.get_world_size(), local_rank, device, owns)


@dataclass
class LoopState:
    """Where training stands; saved in checkpoints with the loader's layout."""

    step: int = 0
    epoch: int = 0
    samples_seen: int = 0  # since the start of training, all ranks
    batches_in_epoch: int = 0  # batches this rank consumed in the current epoch
    # Unusable data in the batches this rank trained on: shards its loader skipped (indices
    # among the dataset's shards) and samples replaced by others. After a resume every rank
    # holds the earlier run's skipped shards and rank 0 its replaced samples.
    skipped_shards: set[int] = field(default_factory=set)
    replaced_samples: int = 0


@dataclass
class Meter:
    """One log window: data wait vs total step time, samples, and losses (kept on device so
    that logging, not every step, pays for the GPU sync)."""

    wait_s: float = 0.0
    total_s: float = 0.0
    samples: int = 0
    losses: list[torch.Tensor] = field(default_factory=list)

    def add(self, loss: torch.Tensor, samples: int, step_s: float) -> None:
        self.losses.append(loss)
        self.samples += samples
        self.total_s += step_s

    def flush(self, state: LoopState) -> dict[str, Any]:
        """The metrics row for this window; starts the next window."""
        total = self.total_s
        row = {
            "step": state.step,
            "samples": state.samples_seen,
            "loss": torch.stack(self.losses).float().mean().item() if self.losses else math.nan,
            "samples_per_s": self.samples / total if total > 0 else 0.0,
            "data_wait_frac": min(self.wait_s / total, 1.0) if total > 0 else 0.0,
            "epoch": state.epoch,
        }
        self.wait_s, self.total_s, self.samples, self.losses = 0.0, 0.0, 0, []
        return row


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """No decay on gains, biases, logit_scale and logit_bias (as open_clip's trainer does)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        skip = p.ndim < 2 or "bn" in name or "ln" in name or "bias" in name or "logit_scale" in name
        (no_decay if skip else decay).append(p)
    return [
        {"params": no_decay, "weight_decay": 0.0},
        {"params": decay, "weight_decay": weight_decay},
    ]


def lr_factor(step: int, warmup_steps: int, total_steps: int) -> float:
    """Linear warmup to 1, then cosine to 0 at `total_steps` (held at 0 after)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    span = max(total_steps - warmup_steps, 1)
    progress = min((step - warmup_steps) / span, 1.0)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def make_optimizer(
    model: torch.nn.Module, cfg: OptimConfig, total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    optimizer = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, cfg.warmup_steps, total_steps)
    )
    return optimizer, scheduler


def planned_steps(cfg: TrainConfig, steps_per_epoch: int) -> int:
    """Steps for the LR schedule: max_steps, else epochs x steps per epoch."""
    if cfg.run.max_steps is not None:
        return cfg.run.max_steps
    return max(cfg.run.epochs * steps_per_epoch, 1)


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """Mixed precision on CUDA only; CPU runs (tests, the demo) stay fp32 and reproducible."""
    if device.type != "cuda" or precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast("cuda", dtype=dtype)


class DevicePrefetcher:
    """Batches on the training device, normalized. On CUDA the next batch is copied (from
    pinned memory) and normalized on a side stream while the current step runs; on CPU it
    only finishes the transform."""

    def __init__(self, loader: Any, device: torch.device, transform: ImageTransform) -> None:
        self.loader, self.device, self.transform = loader, device, transform

    def to_device(self, batch: Batch) -> Batch:
        tokens = batch.tokens.to(self.device, non_blocking=True)
        return batch._replace(
            images=self.transform.finish_on(batch.images, self.device), tokens=tokens
        )

    def __iter__(self) -> Iterator[Batch]:
        if self.device.type != "cuda":
            for batch in self.loader:
                yield self.to_device(batch)
            return
        stream = torch.cuda.Stream(self.device)
        batches = iter(self.loader)
        upcoming = self.preload(batches, stream)
        while upcoming is not None:
            torch.cuda.current_stream(self.device).wait_stream(stream)
            ready = upcoming
            for tensor in (ready.images, ready.tokens):  # freed only after the main stream
                tensor.record_stream(torch.cuda.current_stream(self.device))
            upcoming = self.preload(batches, stream)
            yield ready

    def preload(self, batches: Iterator[Batch], stream: torch.cuda.Stream) -> Batch | None:
        batch = next(batches, None)
        if batch is None:
            return None
        with torch.cuda.stream(stream):
            return self.to_device(batch)


def timed(batches: Iterator[Batch], meter: Meter) -> Iterator[Batch]:
    """Yield batches, adding the time spent waiting for each to `meter.wait_s`."""
    it = iter(batches)
    while True:
        start = time.perf_counter()
        batch = next(it, None)
        if batch is None:
            return
        meter.wait_s += time.perf_counter() - start
        yield batch


@dataclass
class Parts:
    """What one training step needs."""

    model: torch.nn.Module  # DDP-wrapped when world > 1
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler
    loss_fn: torch.nn.Module
    device: torch.device
    precision: str

    @property
    def core(self) -> torch.nn.Module:
        """The model without its DDP wrapper (for checkpoints and the logit_scale clamp)."""
        return getattr(self.model, "module", self.model)


def clip_features(model: torch.nn.Module, images: torch.Tensor, texts: torch.Tensor) -> dict:
    """The model's output dict: normalized features, logit_scale (and logit_bias for SigLIP).
    Clips [B, T, 3, H, W] are encoded frame by frame through the same forward (so DDP sees
    it) and their frame features averaged, then normalized again."""
    if images.dim() == 4:
        return model(images, texts)
    batch, frames = images.shape[:2]
    out = model(images.flatten(0, 1), texts)
    per_frame = out["image_features"].view(batch, frames, -1)
    return out | {"image_features": F.normalize(per_frame.mean(dim=1), dim=-1)}


def contrastive_loss(parts: Parts, out: dict) -> torch.Tensor:
    args = [out["image_features"], out["text_features"], out["logit_scale"]]
    if "logit_bias" in out:
        args.append(out["logit_bias"])
    return parts.loss_fn(*args)


def train_step(parts: Parts, batches: list[Batch]) -> torch.Tensor:
    """One optimizer step over one batch, or over `accum_freq` batches as open_clip does:
    features of all of them first (no grad), then each batch again with grad against the
    others' cached features, so the loss sees the whole accumulated batch at once."""
    parts.optimizer.zero_grad(set_to_none=True)
    if len(batches) == 1:
        with autocast(parts.precision, parts.device):
            loss = contrastive_loss(parts, clip_features(parts.model, *batches[0][:2]))
        parts.scaler.scale(loss).backward()
    else:
        loss = accumulated_backward(parts, batches)
    parts.scaler.step(parts.optimizer)
    parts.scaler.update()
    parts.scheduler.step()  # after this, param_groups hold the next step's lr
    with torch.no_grad():  # as open_clip does: keep the temperature in a sane range
        parts.core.logit_scale.clamp_(0, math.log(100))
    return loss.detach()


def accumulated_backward(parts: Parts, batches: list[Batch]) -> torch.Tensor:
    """Backward of the loss over all `batches` joined, one batch's graph at a time. Summed
    over the batches this is exactly the big batch's gradient (tested)."""
    with torch.no_grad(), autocast(parts.precision, parts.device):
        cached = [clip_features(parts.model, b.images, b.tokens) for b in batches]
    no_sync = getattr(parts.model, "no_sync", None)  # DDP: all-reduce after the last only
    for j, batch in enumerate(batches):
        last = j == len(batches) - 1
        with contextlib.nullcontext() if last or no_sync is None else no_sync():
            with autocast(parts.precision, parts.device):
                fresh = clip_features(parts.model, batch.images, batch.tokens)
                joined = dict(fresh)
                for name in ("image_features", "text_features"):
                    features = [c[name] for c in cached]
                    features[j] = fresh[name]  # only this batch's features carry gradients
                    joined[name] = torch.cat(features)
                if not last:  # the temperature (and bias) get their gradient once: in the
                    # last, synced backward (DDP needs every parameter's gradient there)
                    for name in ("logit_scale", "logit_bias"):
                        if name in joined:
                            joined[name] = joined[name].detach()
                loss = contrastive_loss(parts, joined)
            parts.scaler.scale(loss).backward()
    return loss


def loader_state(
    state: LoopState, cfg: TrainConfig, world: int, manifest_samples: int
) -> dict[str, Any]:
    return {
        "epoch": state.epoch,
        "batches_in_epoch": state.batches_in_epoch,
        "samples_seen": state.samples_seen,
        "seed": cfg.data.seed,
        "batch_size": cfg.data.batch_size,
        "workers": max(cfg.data.workers, 1),  # 0 (in-process) plans as 1 worker
        "world": world,
        "shuffle_buffer": cfg.data.shuffle_buffer,
        "accum_freq": cfg.optim.accum_freq,
        "manifest_samples": manifest_samples,
        "skipped_shards": sorted(state.skipped_shards),
        "replaced_samples": state.replaced_samples,
    }


def data_totals(state: LoopState, place: Dist, shards: int) -> tuple[set[int], int]:
    """All ranks' skipped shards (distinct) and replaced samples so far. One all-reduce:
    every rank calls this at the same steps (logging, checkpoints, the end)."""
    if place.world == 1:
        return set(state.skipped_shards), state.replaced_samples
    marks = torch.zeros(shards + 1, dtype=torch.int64, device=place.device)
    if state.skipped_shards:
        marks[sorted(state.skipped_shards)] = 1
    marks[-1] = state.replaced_samples
    dist.all_reduce(marks)
    return set(torch.nonzero(marks[:-1]).flatten().tolist()), int(marks[-1].item())


def save_state(
    parts: Parts,
    state: LoopState,
    cfg: TrainConfig,
    world: int,
    manifest_samples: int,
    staging: Path | None = None,
) -> str:
    """Checkpoint model, optimizer, schedule, loader position and the resolved config. The
    weights are also under `state_dict` as plain open_clip loads them (the same tensors: saved
    once), so `create_model_and_transforms(name, pretrained=PATH)` takes the file as it is."""
    weights = parts.core.state_dict()
    return save_checkpoint(
        checkpoint_path(cfg.run.output, state.step),
        {
            "format": CHECKPOINT_FORMAT,
            "step": state.step,
            "model": weights,
            "state_dict": open_clip_state_dict(weights, cfg.model.name),
            "optimizer": parts.optimizer.state_dict(),
            "scheduler": parts.scheduler.state_dict(),
            "scaler": parts.scaler.state_dict(),
            "loader": loader_state(state, cfg, world, manifest_samples),
            "config": cfg.redacted(),
        },
        cfg.storage_options,
        staging,
    )


def restore_state(
    parts: Parts, path: str, cfg: TrainConfig, world: int, manifest_samples: int
) -> LoopState:
    """Load a checkpoint into `parts` and return where the data continues. Mid-epoch, the
    loader layout must match the one that wrote it (else the plan would differ)."""
    ckpt = load_checkpoint(path, cfg.storage_options)
    saved = ckpt["loader"]
    now = loader_state(LoopState(), cfg, world, manifest_samples)
    changed = [k for k in LOADER_LAYOUT if saved.get(k, now[k]) != now[k]]
    if changed and saved.get("batches_in_epoch", 0):
        was = ", ".join(f"{k}={saved.get(k)}" for k in changed)
        got = ", ".join(f"{k}={now[k]}" for k in changed)
        raise ConfigError(
            f"run.resume: {posixpath.basename(path)} stopped mid-epoch with {was}; an exact "
            f"resume needs the same loader layout (now {got})"
        )
    parts.core.load_state_dict(ckpt["model"])
    parts.optimizer.load_state_dict(ckpt["optimizer"])
    parts.scheduler.load_state_dict(ckpt["scheduler"])
    parts.scaler.load_state_dict(ckpt["scaler"])
    log.info("resumed from %s at step %d", path, ckpt["step"])
    return LoopState(
        step=ckpt["step"],
        epoch=saved["epoch"],
        samples_seen=saved["samples_seen"],
        batches_in_epoch=saved.get("batches_in_epoch", 0),
        skipped_shards=set(saved.get("skipped_shards", ())),
        replaced_samples=saved.get("replaced_samples", 0),
    )


def finished(cfg: TrainConfig, state: LoopState) -> bool:
    if cfg.run.max_steps is not None:
        return state.step >= cfg.run.max_steps
    return state.epoch >= cfg.run.epochs


def lr_of(parts: Parts) -> float:
    return parts.optimizer.param_groups[0]["lr"]


class Trainer:
    """Runs epochs over the loader; owns the loop state, the stall meter and the outputs
    (written by rank 0, except each rank's optional sample log)."""

    def __init__(
        self,
        cfg: TrainConfig,
        parts: Parts,
        dataset: ShardDataset,
        loader: Any,
        place: Dist,
        metrics: IO[str] | None,
        sample_log: IO[str] | None,
        logs: RunLogs,
    ) -> None:
        self.cfg, self.parts, self.dataset, self.loader = cfg, parts, dataset, loader
        self.place, self.metrics, self.sample_log = place, metrics, sample_log
        self.logs = logs
        self.board: Any = None  # a TensorBoard SummaryWriter on rank 0 (run.tensorboard)
        self.state = LoopState()
        self.meter = Meter()
        self.epoch_batches = dataset.batches_per_epoch()
        self.first_loss: float | None = None
        self.last_loss: torch.Tensor | None = None
        self.last_lr = 0.0
        self.checkpoint: str | None = None  # the newest checkpoint written (a path or URL)
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
        if not finished(self.cfg, self.state):
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
            lr = lr_of(self.parts)  # the lr this step uses; train_step advances the schedule
            loss = train_step(self.parts, group)
            now = time.perf_counter()
            samples = sum(len(b.keys) for b in group) * self.place.world
            self.meter.add(loss, samples, now - tick)
            tick = now  # logging and checkpoint time count toward the next step
            self.after_step(loss, group, lr)
            group = []
            if finished(self.cfg, self.state):
                return

    def after_step(self, loss: torch.Tensor, group: list[Batch], lr: float) -> None:
        state, run = self.state, self.cfg.run
        state.step += 1
        state.batches_in_epoch += len(group)
        if state.batches_in_epoch >= self.epoch_batches:  # epochs hold whole steps
            state.epoch, state.batches_in_epoch = state.epoch + 1, 0
        state.samples_seen += sum(len(b.keys) for b in group) * self.place.world
        for batch in group:
            state.skipped_shards.update(batch.skipped)
            state.replaced_samples += batch.replaced
        if self.sample_log:
            keys = [key for batch in group for key in batch.keys]
            self.sample_log.write(json.dumps({"step": state.step, "keys": keys}) + "\n")
            self.sample_log.flush()
        self.bar.update()
        if self.first_loss is None:
            self.first_loss = loss.item()
        self.last_loss, self.last_lr = loss, lr
        if state.step == 1 or state.step % run.log_every == 0:
            self.log(lr)
        if run.checkpoint_every and state.step % run.checkpoint_every == 0:
            self.save()

    def save(self) -> None:
        """Checkpoint this step (rank 0). For a URL output every rank first uploads its logs:
        a stop between the two then leaves logs past the newest checkpoint, which a resume
        trims, never a checkpoint past the logs, which would lose their lines."""
        if self.logs.remote:
            self.upload_logs()
            if self.place.world > 1:
                dist.barrier()
        skipped, replaced = self.totals()  # all ranks': rank 0 saves them
        if self.place.rank == 0:
            samples = self.dataset.epoch_samples
            state = replace(self.state, skipped_shards=skipped, replaced_samples=replaced)
            self.checkpoint = save_state(
                self.parts, state, self.cfg, self.place.world, samples, self.logs.folder
            )
        else:
            self.checkpoint = checkpoint_path(self.cfg.run.output, self.state.step)

    def upload_logs(self) -> None:
        """For a URL output: this rank's logs so far."""
        for stream in (self.metrics, self.sample_log):
            if stream:
                stream.flush()
        if self.board:
            self.board.flush()
        self.logs.upload()

    def resume(self, checkpoint: str, manifest_samples: int) -> None:
        state = restore_state(self.parts, checkpoint, self.cfg, self.place.world, manifest_samples)
        if self.place.rank:  # rank 0 carries the earlier total on (a sum over ranks)
            state.replaced_samples = 0
        self.state, self.checkpoint = state, checkpoint

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
        return {
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
        }

    def totals(self) -> tuple[set[int], int]:
        """(skipped shards, replaced samples) of all ranks so far (a collective call)."""
        return data_totals(self.state, self.place, len(self.dataset.shards))

    def log(self, lr: float) -> None:
        skipped, replaced = self.totals()
        row = self.meter.flush(self.state) | {"lr": lr}
        row |= {"skipped_shards": len(skipped), "replaced_samples": replaced}
        self.bar.set_postfix(
            loss=f"{row['loss']:.3f}",
            samples_s=f"{row['samples_per_s']:.0f}",
            data_wait=f"{row['data_wait_frac']:.0%}",
        )
        if self.metrics:
            self.metrics.write(json.dumps(row) + "\n")
            self.metrics.flush()
        if self.board:
            for name in ("loss", "samples_per_s", "data_wait_frac", "lr", "epoch"):
                self.board.add_scalar(f"train/{name}", row[name], row["step"])
            self.board.flush()

    def finish(self) -> None:
        """Log the last partial window and checkpoint the final step (once)."""
        if self.meter.samples:
            self.log(self.last_lr)
        if self.checkpoint != checkpoint_path(self.cfg.run.output, self.state.step):
            self.save()


def make_loss(name: str, place: Dist) -> torch.nn.Module:
    if name == "siglip":
        return SigLipLoss(rank=place.rank, world_size=place.world)
    # local_loss + gather_with_grad: the memory-lean setting open_clip recommends at scale.
    return open_clip.ClipLoss(
        local_loss=place.world > 1,
        gather_with_grad=place.world > 1,
        rank=place.rank,
        world_size=place.world,
    )


def build_parts(cfg: TrainConfig, place: Dist, total_steps: int) -> tuple[Parts, Any]:
    """Model, optimizer, schedule, scaler and loss; also returns (preprocess, tokenizer)."""
    model, preprocess, tokenizer = build_model(cfg.model, place.device)
    optimizer, scheduler = make_optimizer(model, cfg.optim, total_steps)
    if place.world > 1:
        ids = [place.device.index] if place.device.type == "cuda" else None
        model = DistributedDataParallel(model, device_ids=ids)
    use_scaler = place.device.type == "cuda" and cfg.run.precision == "fp16"
    parts = Parts(
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        scaler=torch.amp.GradScaler(place.device.type, enabled=use_scaler),
        loss_fn=make_loss(cfg.model.loss, place),
        device=place.device,
        precision=cfg.run.precision,
    )
    return parts, (preprocess, tokenizer)


DEFAULT_CACHE_LIMIT = 100 * 10**9  # when cache_dir is set without cache_limit


def read_sources(cfg: TrainConfig) -> list[tuple[Manifest, float]]:
    """`data.manifest` with `data.weight`, then every `data.mix` entry."""
    entries = [(cfg.data.manifest, cfg.data.weight)]
    entries += [(entry.manifest, entry.weight) for entry in cfg.data.mix]
    return [(read_manifest(url, cfg.storage_options), weight) for url, weight in entries]


def make_dataset(
    cfg: TrainConfig,
    sources: list[tuple[Manifest, float]],
    place: Dist,
    preprocess: Any,
    tokenizer: Any,
) -> ShardDataset:
    cache = None
    if cfg.data.cache_dir:
        cache = (cfg.data.cache_dir, cfg.data.cache_limit_bytes or DEFAULT_CACHE_LIMIT)
    return ShardDataset(
        sources,
        ImageTransform(preprocess),
        tokenizer,
        batch_size=cfg.data.batch_size,
        seed=cfg.data.seed,
        shuffle_buffer=cfg.data.shuffle_buffer,
        rank=place.rank,
        world=place.world,
        step_batches=cfg.optim.accum_freq,
        device_decode=cfg.data.gpu_decode,
        decode_threads=cfg.data.decode_threads,
        finish_in_workers=place.device.type != "cuda",
        storage_options=cfg.storage_options,
        cache=cache,
        verify=cfg.data.verify_shards,
    )


def previous_checkpoint(cfg: TrainConfig, output: str, place: Dist) -> str | None:
    """The checkpoint to resume from, chosen by rank 0 for every rank (each must read it).
    A run already in `output` is continued only with run.resume, replaced only with
    run.overwrite, and otherwise refused: starting afresh beside its checkpoints would let
    a later resume pick up the old run's."""
    chosen, problem = None, None
    if place.rank == 0:
        chosen = latest_checkpoint(output, cfg.storage_options)
        if chosen and cfg.run.overwrite:
            remove_run(output, cfg.storage_options)
            chosen = None
        elif chosen and not cfg.run.resume:
            problem = (
                f"run.output: {output} holds a run (newest checkpoint "
                f"{posixpath.basename(chosen)}); set run.resume=true to continue it or "
                "run.overwrite=true to replace it"
            )
    if place.world > 1:
        shared = [chosen, problem]
        dist.broadcast_object_list(shared, src=0)
        chosen, problem = shared
    if problem:
        raise ConfigError(problem)
    if chosen and not checkpoint_exists(chosen, cfg.storage_options):
        raise ConfigError(
            f"run.output: rank {place.rank} cannot read {chosen}; resuming needs "
            "run.output on object storage or a filesystem every node shares"
        )
    return chosen


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


def train(cfg: TrainConfig) -> dict[str, Any]:
    """Train a CLIP model on a build's shards; returns a summary of the run."""
    if cfg.run.tensorboard and importlib.util.find_spec("tensorboard") is None:
        tensorboard_writer(Path(cfg.run.output))  # fails fast, before any model is built
    place = setup_distributed()
    torch.manual_seed(cfg.data.seed)  # the same initial weights on every rank
    output = cfg.run.output
    previous = previous_checkpoint(cfg, output, place)  # before the model: fails fast
    sources = read_sources(cfg)
    total = sum(round(weight * sum(s.samples for s in m.shards)) for m, weight in sources)
    batches = batches_per_rank(total, place.world, cfg.data.batch_size, cfg.optim.accum_freq)
    parts, (preprocess, tokenizer) = build_parts(
        cfg, place, planned_steps(cfg, batches // cfg.optim.accum_freq)
    )
    torch.manual_seed(cfg.data.seed + place.rank)  # each rank its own augmentations
    dataset = make_dataset(cfg, sources, place, preprocess, tokenizer)
    # On the CPU the loop trains on the loader's views and keeps a step's accum_freq batches
    # while it draws the next: they stay valid that long (trainer/ring.py). On CUDA the
    # DataLoader's pinned path stays: its copies to the GPU are asynchronous, and rings
    # registered with CUDA are not built yet.
    cuda = place.device.type == "cuda"
    hold = None if cuda else cfg.optim.accum_freq + 1
    loader = make_loader(dataset, cfg.data.workers, pin_memory=cuda, hold=hold)
    logs = RunLogs(output, place.rank, cfg.storage_options)
    logs.start(resume=bool(previous))
    folder = logs.folder  # run.output, or this rank's local mirror of a URL
    mode = "a" if previous else "w"
    sample_path = folder / "samples" / f"rank-{place.rank}.jsonl"
    if previous:
        for path in (folder / "metrics.jsonl", sample_path):
            trim_log(path, checkpoint_step(previous))
    with contextlib.ExitStack() as files:
        metrics = (
            files.enter_context(open(folder / "metrics.jsonl", mode)) if place.rank == 0 else None
        )
        sample_log = None
        if cfg.run.sample_log:
            (folder / "samples").mkdir(exist_ok=True)
            sample_log = files.enter_context(open(sample_path, mode))
        trainer = Trainer(cfg, parts, dataset, loader, place, metrics, sample_log, logs)
        if cfg.run.tensorboard and place.rank == 0:
            trainer.board = tensorboard_writer(folder)
            files.callback(trainer.board.close)
        if previous:
            trainer.resume(previous, total)
        trainer.fit()
        summary = trainer.summary()  # every rank, before the process group goes
    if place.world > 1:
        dist.barrier()  # rank 0's final checkpoint is on disk before any rank reports done
    if place.owns_group:
        dist.destroy_process_group()
    if place.rank == 0:
        (folder / "summary.json").write_text(json.dumps(summary))
    logs.finish()
    return summary

"""The CLIP training loop: open_clip model + ClipLoss, AdamW, warmup + cosine, stall meter.

`<run.output>/metrics.jsonl` gets one line at step 1, every `log_every` steps and at the end.
Each line covers the steps since the previous one: `loss` is their mean, `samples_per_s` their
throughput, `data_wait_frac` the share of their wall time spent waiting for the next batch
(near 0: compute-bound; near 1: the input pipeline is the bottleneck). `samples` and `step` are
totals. Checkpoints go to `<run.output>/checkpoints/step-<N>.pt`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import open_clip
import torch
import torch.nn.functional as F
from tqdm import tqdm

from pipeline.config_io import ConfigError
from trainer.checkpoint import checkpoint_path, latest_checkpoint, load_checkpoint, save_checkpoint
from trainer.config import OptimConfig, TrainConfig
from trainer.data import ShardDataset, make_loader
from trainer.manifest import read_manifest
from trainer.models import build_model

log = logging.getLogger(__name__)


@dataclass
class LoopState:
    """Where training stands; saved in checkpoints as the loader's state."""

    step: int = 0
    epoch: int = 0
    samples_seen: int = 0  # since the start of training
    samples_in_epoch: int = 0


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
    """No decay on gains, biases and logit_scale (as open_clip's own trainer does)."""
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


def planned_steps(cfg: TrainConfig, manifest_samples: int) -> int:
    """Steps for the LR schedule: max_steps, else epochs x full batches in the manifest."""
    if cfg.run.max_steps is not None:
        return cfg.run.max_steps
    return max(cfg.run.epochs * (manifest_samples // cfg.data.batch_size), 1)


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """Mixed precision on CUDA only; CPU runs (tests, the demo) stay fp32 and reproducible."""
    if device.type != "cuda" or precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast("cuda", dtype=dtype)


def timed_batches(loader: Any, meter: Meter) -> Iterator[Any]:
    """Yield batches, adding the time spent waiting for each to `meter.wait_s`."""
    it = iter(loader)
    while True:
        start = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            return
        meter.wait_s += time.perf_counter() - start
        yield batch


@dataclass
class Parts:
    """What one training step needs."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler
    loss_fn: open_clip.ClipLoss
    device: torch.device
    precision: str


def clip_features(
    model: torch.nn.Module, images: torch.Tensor, texts: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Normalized image and text features and the logit scale. Clips [B, T, 3, H, W] are
    encoded frame by frame and their frame features averaged (then normalized again)."""
    if images.dim() == 4:
        out = model(images, texts)
        return out["image_features"], out["text_features"], out["logit_scale"]
    batch, frames = images.shape[:2]
    per_frame = model.encode_image(images.flatten(0, 1), normalize=True)
    image_features = F.normalize(per_frame.view(batch, frames, -1).mean(dim=1), dim=-1)
    return image_features, model.encode_text(texts, normalize=True), model.logit_scale.exp()


def train_step(parts: Parts, images: torch.Tensor, texts: torch.Tensor) -> torch.Tensor:
    """One optimizer step; returns the detached loss (still on the device, so no sync)."""
    images = images.to(parts.device, non_blocking=True)
    texts = texts.to(parts.device, non_blocking=True)
    with autocast(parts.precision, parts.device):
        image_features, text_features, logit_scale = clip_features(parts.model, images, texts)
        loss = parts.loss_fn(image_features, text_features, logit_scale)
    parts.optimizer.zero_grad(set_to_none=True)
    parts.scaler.scale(loss).backward()
    parts.scaler.step(parts.optimizer)
    parts.scaler.update()
    parts.scheduler.step()  # after this, param_groups hold the next step's lr
    with torch.no_grad():  # as open_clip does: keep the temperature in a sane range
        parts.model.logit_scale.clamp_(0, math.log(100))
    return loss.detach()


def save_state(parts: Parts, state: LoopState, cfg: TrainConfig) -> Path:
    """Checkpoint model, optimizer, schedule, loader position and the resolved config."""
    loader = {
        "epoch": state.epoch,
        "samples_seen": state.samples_seen,
        "samples_in_epoch": state.samples_in_epoch,
        "seed": cfg.data.seed,
        "batch_size": cfg.data.batch_size,
        "workers": cfg.data.workers,
    }
    return save_checkpoint(
        checkpoint_path(cfg.run.output, state.step),
        {
            "format": "mmcurate-checkpoint/1",
            "step": state.step,
            "model": parts.model.state_dict(),
            "optimizer": parts.optimizer.state_dict(),
            "scheduler": parts.scheduler.state_dict(),
            "scaler": parts.scaler.state_dict(),
            "loader": loader,
            "config": cfg.redacted(),
        },
    )


def restore_state(parts: Parts, path: Path) -> LoopState:
    """Load a checkpoint into `parts`; the data restarts at the start of the saved epoch
    (exact mid-epoch resume is not implemented yet)."""
    ckpt = load_checkpoint(path)
    parts.model.load_state_dict(ckpt["model"])
    parts.optimizer.load_state_dict(ckpt["optimizer"])
    parts.scheduler.load_state_dict(ckpt["scheduler"])
    parts.scaler.load_state_dict(ckpt["scaler"])
    loader = ckpt["loader"]
    log.info("resumed from %s at step %d (epoch %d restarts)", path, ckpt["step"], loader["epoch"])
    return LoopState(step=ckpt["step"], epoch=loader["epoch"], samples_seen=loader["samples_seen"])


def finished(cfg: TrainConfig, state: LoopState) -> bool:
    if cfg.run.max_steps is not None:
        return state.step >= cfg.run.max_steps
    return state.epoch >= cfg.run.epochs


def lr_of(parts: Parts) -> float:
    return parts.optimizer.param_groups[0]["lr"]


class Trainer:
    """Runs epochs over the loader; owns the loop state, the stall meter and the outputs."""

    def __init__(
        self, cfg: TrainConfig, parts: Parts, dataset: ShardDataset, loader: Any, metrics: IO[str]
    ) -> None:
        self.cfg, self.parts, self.dataset, self.loader = cfg, parts, dataset, loader
        self.metrics = metrics
        self.state = LoopState()
        self.meter = Meter()
        self.first_loss: float | None = None
        self.last_loss: torch.Tensor | None = None
        self.last_lr = 0.0
        self.checkpoint: Path | None = None
        # A progress bar on a terminal only (tqdm turns itself off when stderr is not a TTY).
        self.bar = tqdm(total=cfg.run.max_steps, unit="step", desc="train", disable=None)

    def fit(self) -> None:
        self.bar.update(self.state.step)  # a resumed run starts where it stopped
        while not finished(self.cfg, self.state):
            self.dataset.set_epoch(self.state.epoch)
            self.run_epoch()
        self.finish()
        self.bar.close()

    def run_epoch(self) -> None:
        batches, tick = 0, time.perf_counter()
        for images, texts in timed_batches(self.loader, self.meter):
            lr = lr_of(self.parts)  # the lr this step uses; train_step advances the schedule
            loss = train_step(self.parts, images, texts)
            batches += 1
            now = time.perf_counter()
            self.meter.add(loss, len(images), now - tick)
            tick = now  # logging and checkpoint time count toward the next step
            self.after_step(loss, len(images), lr)
            if finished(self.cfg, self.state):
                return
        if batches == 0:
            raise ConfigError(
                f"data.batch_size: no full batch of {self.cfg.data.batch_size} in an epoch "
                f"(workers={self.cfg.data.workers}; each worker batches only its own shards)"
            )
        self.state.epoch += 1
        self.state.samples_in_epoch = 0

    def after_step(self, loss: torch.Tensor, samples: int, lr: float) -> None:
        state, run = self.state, self.cfg.run
        state.step += 1
        state.samples_seen += samples
        state.samples_in_epoch += samples
        self.bar.update()
        if self.first_loss is None:
            self.first_loss = loss.item()
        self.last_loss, self.last_lr = loss, lr
        if state.step == 1 or state.step % run.log_every == 0:
            self.log(lr)
        if run.checkpoint_every and state.step % run.checkpoint_every == 0:
            self.checkpoint = save_state(self.parts, state, self.cfg)

    def log(self, lr: float) -> None:
        row = self.meter.flush(self.state) | {"lr": lr}
        self.bar.set_postfix(
            loss=f"{row['loss']:.3f}",
            samples_s=f"{row['samples_per_s']:.0f}",
            data_wait=f"{row['data_wait_frac']:.0%}",
        )
        self.metrics.write(json.dumps(row) + "\n")
        self.metrics.flush()

    def finish(self) -> None:
        """Log the last partial window and checkpoint the final step (once)."""
        if self.meter.samples:
            self.log(self.last_lr)
        if self.checkpoint != checkpoint_path(self.cfg.run.output, self.state.step):
            self.checkpoint = save_state(self.parts, self.state, self.cfg)


def build_parts(cfg: TrainConfig, device: torch.device, total_steps: int) -> tuple[Parts, Any]:
    """Model, optimizer, schedule, scaler and loss; also returns (preprocess, tokenizer)."""
    model, preprocess, tokenizer = build_model(cfg.model, device)
    optimizer, scheduler = make_optimizer(model, cfg.optim, total_steps)
    use_scaler = device.type == "cuda" and cfg.run.precision == "fp16"
    parts = Parts(
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        scaler=torch.amp.GradScaler(device.type, enabled=use_scaler),
        loss_fn=open_clip.ClipLoss(),
        device=device,
        precision=cfg.run.precision,
    )
    return parts, (preprocess, tokenizer)


DEFAULT_CACHE_LIMIT = 100 * 10**9  # when cache_dir is set without cache_limit


def train(cfg: TrainConfig) -> dict[str, Any]:
    """Train a CLIP model on a build's shards; returns a summary of the run."""
    manifest = read_manifest(cfg.data.manifest, cfg.storage_options)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(cfg.data.seed)
    parts, (preprocess, tokenizer) = build_parts(cfg, device, planned_steps(cfg, manifest.samples))
    cache = None
    if cfg.data.cache_dir:
        cache = (cfg.data.cache_dir, cfg.data.cache_limit_bytes or DEFAULT_CACHE_LIMIT)
    dataset = ShardDataset(
        manifest, preprocess, tokenizer, cfg.data.seed, cfg.storage_options, cache=cache
    )
    loader = make_loader(dataset, cfg.data, pin_memory=device.type == "cuda")
    output = Path(cfg.run.output)
    output.mkdir(parents=True, exist_ok=True)
    previous = latest_checkpoint(output)
    if previous and not cfg.run.resume:
        log.warning(
            "%s holds checkpoints of an earlier run; starting fresh (run.resume=false)", output
        )
        previous = None
    with open(output / "metrics.jsonl", "a" if previous else "w") as metrics:
        trainer = Trainer(cfg, parts, dataset, loader, metrics)
        if previous:
            trainer.state = restore_state(parts, previous)
            trainer.checkpoint = previous
        trainer.fit()
    last = trainer.last_loss.item() if trainer.last_loss is not None else None
    return {
        "steps": trainer.state.step,
        "samples": trainer.state.samples_seen,
        "epoch": trainer.state.epoch,
        "first_loss": trainer.first_loss,
        "last_loss": last,
        "device": str(device),
        "output": str(output),
        "metrics": str(output / "metrics.jsonl"),
        "checkpoint": str(trainer.checkpoint) if trainer.checkpoint else None,
    }

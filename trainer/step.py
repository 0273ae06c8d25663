"""Step math of the CLIP training loop: the `Learner` (the model with its optimizer, warmup +
cosine schedule, scaler, contrastive or SigLIP loss, DDP wrapper), mixed precision, and one
optimizer step with open_clip-style gradient accumulation."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import open_clip
import torch
import torch.nn.functional as F
from mmcurate.core.config_io import ConfigError
from mmcurate.trainer.config import OptimConfig, RunConfig, TrainConfig
from mmcurate.trainer.data.dataset import Batch
from mmcurate.trainer.dist.fsdp import average_replicated_grads, is_fsdp, shard_model
from mmcurate.trainer.dist.fsdp import gradient_norm as sharded_gradient_norm
from mmcurate.trainer.dist.world import Dist
from mmcurate.trainer.models import build_model
from mmcurate.trainer.precision import autocast
from open_clip.loss import SigLipLoss
from torch.nn.parallel import DistributedDataParallel


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
    model: torch.nn.Module, cfg: OptimConfig, total_steps: int, zero: bool = False
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW and its schedule; `zero`: each rank keeps and updates the state of its share
    of the parameters only (ZeroRedundancyOptimizer, which broadcasts the updated ones)."""
    groups = param_groups(model, cfg.weight_decay)
    if zero:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        optimizer: torch.optim.Optimizer = ZeroRedundancyOptimizer(
            groups, optimizer_class=torch.optim.AdamW, lr=cfg.lr
        )
    else:
        optimizer = torch.optim.AdamW(groups, lr=cfg.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, cfg.warmup_steps, total_steps)
    )
    return optimizer, scheduler


def planned_steps(run: RunConfig, steps_per_epoch: int) -> int:
    """Steps for the LR schedule: max_steps, else epochs x steps per epoch."""
    if run.max_steps is not None:
        return run.max_steps
    return max(run.epochs * steps_per_epoch, 1)


@dataclass
class Learner:
    """What one training step needs: the model and what trains it."""

    model: torch.nn.Module  # DDP-wrapped (or FSDP-sharded) when world > 1
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


def contrastive_loss(learner: Learner, out: dict) -> torch.Tensor:
    args = [out["image_features"], out["text_features"], out["logit_scale"]]
    if "logit_bias" in out:
        args.append(out["logit_bias"])
    return learner.loss_fn(*args)


# Called between backward and the optimizer step with (loss, gradient norm), both on the
# device; True takes the step, False skips it (no weight update). trainer/health/checks.py's guard.
StepGuard = Callable[[torch.Tensor, torch.Tensor], bool]


@dataclass
class StepResult:
    loss: torch.Tensor  # detached, on the device
    grad_norm: torch.Tensor  # total L2 norm of the (unscaled) gradients, on the device
    applied: bool  # False: the guard skipped the update


def guarded_step(
    learner: Learner, batches: list[Batch], guard: StepGuard | None = None
) -> StepResult:
    """One optimizer step over one batch, or over `accum_freq` batches as open_clip does:
    features of all of them first (no grad), then each batch again with grad against the
    others' cached features, so the loss sees the whole accumulated batch at once. `guard`
    sees the loss and gradient norm before the update and may skip it; the schedule advances
    either way (a skipped step is still a step)."""
    learner.optimizer.zero_grad(set_to_none=True)
    if len(batches) == 1:
        with autocast(learner.precision, learner.device):
            loss = contrastive_loss(learner, clip_features(learner.model, *batches[0][:2]))
        learner.scaler.scale(loss).backward()
    else:
        loss = accumulated_backward(learner, batches)
    if is_fsdp(learner.model):  # the unsharded temperature's gradient, as DDP averages it
        average_replicated_grads(learner.model, torch.distributed.get_world_size())
    learner.scaler.unscale_(learner.optimizer)  # a no-op unless fp16's scaler is on
    grad_norm = gradient_norm(learner.model)
    loss = loss.detach()
    applied = guard is None or guard(loss, grad_norm)
    if applied:
        learner.scaler.step(learner.optimizer)
    learner.scaler.update()  # also when skipped: fp16's scaler still lowers its scale
    learner.scheduler.step()  # after this, param_groups hold the next step's lr
    with torch.no_grad():  # as open_clip does: keep the temperature in a sane range
        learner.core.logit_scale.clamp_(0, math.log(100))
    return StepResult(loss, grad_norm, applied)


def gradient_norm(model: torch.nn.Module) -> torch.Tensor:
    """The total L2 norm of all gradients (as clip_grad_norm_ computes it), on the device."""
    if is_fsdp(model):
        return sharded_gradient_norm(model)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return torch.zeros(())
    return torch.nn.utils.get_total_norm(grads, norm_type=2.0)


def accumulated_backward(learner: Learner, batches: list[Batch]) -> torch.Tensor:
    """Backward of the loss over all `batches` joined, one batch's graph at a time. Summed
    over the batches this is exactly the big batch's gradient (tested)."""
    with torch.no_grad(), autocast(learner.precision, learner.device):
        cached = [clip_features(learner.model, b.images, b.tokens) for b in batches]
    no_sync = getattr(learner.model, "no_sync", None)  # DDP: all-reduce after the last only
    if is_fsdp(learner.model):
        no_sync = partial(fsdp_no_sync, learner.model)
    for j, batch in enumerate(batches):
        last = j == len(batches) - 1
        with contextlib.nullcontext() if last or no_sync is None else no_sync():
            with autocast(learner.precision, learner.device):
                fresh = clip_features(learner.model, batch.images, batch.tokens)
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
                loss = contrastive_loss(learner, joined)
            learner.scaler.scale(loss).backward()
    return loss


@contextlib.contextmanager
def fsdp_no_sync(model: Any) -> Iterator[None]:
    """FSDP2's no_sync: gradients kept unsharded and unreduced until the last micro-batch."""
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


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


def build_learner(cfg: TrainConfig, place: Dist, total_steps: int) -> tuple[Learner, Any]:
    """Model, optimizer, schedule, scaler and loss; also returns (preprocess, tokenizer)."""
    model, preprocess, tokenizer = build_model(cfg.model, place.device)
    if cfg.model.gradient_checkpointing:
        model.set_grad_checkpointing(True)
    # One rank with a process group (a 1-GPU check) shards too: FSDP2 on a mesh of one.
    sharded = cfg.strategy == "fsdp" and (place.world > 1 or torch.distributed.is_initialized())
    if sharded and cfg.eval.enabled:  # rank 0 evaluates alone: a sharded forward needs all
        raise ConfigError("strategy: fsdp on several ranks cannot evaluate during training yet")
    if sharded:  # before the optimizer: it must hold the shards
        model = shard_model(model, place, cfg.run.precision)
    if cfg.optim.zero and cfg.strategy == "fsdp":
        raise ConfigError("optim.zero: for strategy ddp (fsdp shards the optimizer itself)")
    zero = cfg.optim.zero and place.world > 1
    optimizer, scheduler = make_optimizer(model, cfg.optim, total_steps, zero)
    if place.world > 1 and not sharded:
        ids = [place.device.index] if place.device.type == "cuda" else None
        model = DistributedDataParallel(model, device_ids=ids)
    use_scaler = place.device.type == "cuda" and cfg.run.precision == "fp16"
    learner = Learner(
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        scaler=torch.amp.GradScaler(place.device.type, enabled=use_scaler),
        loss_fn=make_loss(cfg.model.loss, place),
        device=place.device,
        precision=cfg.run.precision,
    )
    return learner, (preprocess, tokenizer)


def lr_of(learner: Learner) -> float:
    return learner.optimizer.param_groups[0]["lr"]

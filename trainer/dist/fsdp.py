"""`strategy: fsdp`: the model and its optimizer state sharded over the ranks with PyTorch's
FSDP2 (`fully_shard`): each transformer block is one unit (its parameters gathered just
before its forward and backward, its gradients reduce-scattered after), the root holds the
rest.

Two things differ from DDP, and this module holds them:
- FSDP2 shards along dim 0 and takes no scalar parameter: `logit_scale` (and SigLIP's
  `logit_bias`) stay out of the shards, replicated on every rank, and their gradients are
  averaged here after backward (what DDP would have done for them).
- Parameters are DTensors: the gradient norm sums the squares of each rank's shards (one
  all-reduce). Checkpoints gather the full weights for the plain open_clip export (a
  collective call on every rank); the model and optimizer shards go to a DCP folder
  (trainer/dist/sharded.py), which loads on any number of ranks.

On CUDA, `run.precision` bf16 or fp16 becomes a MixedPrecisionPolicy (parameters cast for
compute, gradients reduced in fp32); on the CPU everything stays fp32.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from mmcurate.core.config_io import ConfigError, one_line
from mmcurate.trainer.dist.optim_state import by_name, by_position, parameter_names
from mmcurate.trainer.dist.world import Dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def is_fsdp(model: torch.nn.Module) -> bool:
    return isinstance(model, FSDPModule)


def is_zero(optimizer: torch.optim.Optimizer) -> bool:
    """optim.zero's ZeroRedundancyOptimizer (each rank holds its share of the state)."""
    return type(optimizer).__name__ == "ZeroRedundancyOptimizer"


def scalar_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.ndim == 0]


def shard_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The blocks each made one FSDP unit: open_clip's residual attention blocks."""
    from open_clip.transformer import ResidualAttentionBlock

    return [m for m in model.modules() if isinstance(m, ResidualAttentionBlock)]


def mixed_precision(precision: str, device: torch.device) -> MixedPrecisionPolicy:
    if device.type != "cuda" or precision not in DTYPES:
        return MixedPrecisionPolicy()  # fp32 throughout
    return MixedPrecisionPolicy(param_dtype=DTYPES[precision], reduce_dtype=torch.float32)


def shard_model(model: torch.nn.Module, place: Dist, precision: str) -> torch.nn.Module:
    """`model` sharded in place over all ranks (its class becomes an FSDPModule)."""
    mesh = init_device_mesh(place.device.type, (place.world,))
    policy = mixed_precision(precision, place.device)
    ignored = set(scalar_parameters(model))
    for unit in shard_units(model):
        fully_shard(unit, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy, ignored_params=ignored)
    return model


def average_replicated_grads(model: torch.nn.Module, world: int) -> None:
    """The mean over ranks of the unsharded parameters' gradients (one all-reduce)."""
    grads = [p.grad for p in scalar_parameters(model) if p.grad is not None]
    if world == 1 or not grads:
        return
    flat = torch.stack([g.reshape(()) for g in grads]).float()
    dist.all_reduce(flat)
    for grad, total in zip(grads, flat / world, strict=True):
        grad.copy_(total.to(grad.dtype))


def gradient_norm(model: torch.nn.Module) -> torch.Tensor:
    """The total L2 norm of all gradients: the sharded ones' squares summed over ranks, the
    replicated ones (the same on every rank after averaging) counted once."""
    sharded = torch.zeros((), device=next(model.parameters()).device)
    replicated = torch.zeros_like(sharded)
    for p in model.parameters():
        if p.grad is None:
            continue
        if isinstance(p.grad, DTensor):
            sharded += p.grad.to_local().float().pow(2).sum()
        else:
            replicated += p.grad.float().pow(2).sum()
    dist.all_reduce(sharded)
    return (sharded + replicated).sqrt()


def load_full_state(learner: Any, state: dict[str, Any]) -> None:
    """A checkpoint file's full (gathered) model and optimizer state into `learner`, sharded
    or not (every rank holds the whole state, read from the file); the optimizer's converted
    to the form this one loads, whichever strategy and world wrote it (optim_state.py)."""
    names = parameter_names(learner.core, learner.optimizer)
    try:
        if is_fsdp(learner.model):
            options = StateDictOptions(full_state_dict=True)
            set_model_state_dict(learner.model, state["model"], options=options)
            saved = by_name(state["optimizer"], names)
            set_optimizer_state_dict(learner.model, learner.optimizer, saved, options=options)
        else:
            learner.core.load_state_dict(state["model"])
            learner.optimizer.load_state_dict(by_position(state["optimizer"], names))
    except (RuntimeError, KeyError, ValueError) as err:  # another architecture's tensors
        why = one_line(err)[:300]
        raise ConfigError(f"run.resume: the checkpoint does not load here: {why}") from None


def weights_and_optimizer(learner: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(model state, optimizer state) to checkpoint: the plain ones; for FSDP the model's
    gathered on rank 0 (a collective call: every rank calls it) and None for the optimizer,
    whose shards go to the DCP folder (trainer/dist/sharded.py)."""
    if is_zero(learner.optimizer):  # its shards gathered on rank 0 (a collective call)
        learner.optimizer.consolidate_state_dict(to=0)
        optimizer = learner.optimizer.state_dict() if dist.get_rank() == 0 else {}
        return learner.core.state_dict(), optimizer
    if not is_fsdp(learner.model):
        return learner.core.state_dict(), learner.optimizer.state_dict()
    return get_model_state_dict(learner.model, options=FULL), None


def load_weights_and_optimizer(
    learner: Any, ckpt: dict[str, Any], path: str | None = None, storage_options: Any = None
) -> None:
    """A checkpoint's model and optimizer into `learner`, sharded or not: from the DCP folder
    a sharded checkpoint (at `path`) names, resharded to this world; else from the file
    (every rank reads the whole of it)."""
    if "sharded" in ckpt:
        from mmcurate.trainer.dist import sharded

        folder = sharded.folder_of(path, ckpt)
        if is_zero(learner.optimizer):  # DCP knows no ZeRO: read whole, then loaded as a file's
            whole = sharded.read_full(learner.model, learner.optimizer, folder, storage_options)
            load_full_state(learner, ckpt | whole)
            return
        sharded.load(learner.model, learner.optimizer, folder, storage_options)
        return
    load_full_state(learner, ckpt)

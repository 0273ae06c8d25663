"""This process's place in a training job: the one place that reads RANK / WORLD_SIZE /
LOCAL_RANK (set by torchrun or Ray Train) and joins the process group (gloo on CPU, NCCL on
GPU); one process and no group otherwise."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


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


def from_rank0(place: Dist, *values: Any) -> list[Any]:
    """Rank 0's `values` on every rank (picklable objects; a collective call)."""
    shared = list(values)
    if place.world > 1:
        dist.broadcast_object_list(shared, src=0)
    return shared


def barrier(place: Dist) -> None:
    if place.world > 1:
        dist.barrier()


def leave(place: Dist) -> None:
    """Destroy the process group if this process made it (Ray Train owns its own)."""
    if place.owns_group:
        dist.destroy_process_group()

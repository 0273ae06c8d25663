"""This process's place in a training job: the one place that reads RANK / WORLD_SIZE /
LOCAL_RANK and the restart count (torchrun's TORCHELASTIC_RESTART_COUNT, or RESTARTS_ENV that
trainer/launch.py sets in a Ray Train worker) and joins the process group (gloo on CPU, NCCL on
GPU); one process and no group otherwise."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

STORE_TIMEOUT = timedelta(minutes=30)  # init_process_group's own default
RESTARTS_ENV = "MMCURATE_RESTARTS"  # times Ray Train restarted the job's workers


def restart_count() -> int:
    """Times the launcher restarted this job's ranks after a lost one (0: the first try)."""
    env = os.environ
    return int(env.get("TORCHELASTIC_RESTART_COUNT") or env.get(RESTARTS_ENV) or 0)


@dataclass(frozen=True)
class Dist:
    """This process's place in the job."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    owns_group: bool = False  # this process made the process group (torchrun; not Ray)
    restarts: int = 0  # times torchrun or Ray Train restarted the job's ranks (a lost one)


def setup_distributed() -> Dist:
    """Join the process group torchrun (or Ray Train) describes; a single process otherwise."""
    cuda = torch.cuda.is_available()
    restarts = restart_count()
    owns = not dist.is_initialized() and int(os.environ.get("WORLD_SIZE", "1")) > 1
    if owns:
        join_group("nccl" if cuda else "gloo", restarts)
    if not dist.is_initialized():
        return Dist(device=torch.device("cuda" if cuda else "cpu"), restarts=restarts)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    # Why modulo: Ray Train may show each worker only its own GPU.
    device = torch.device(f"cuda:{local_rank % torch.cuda.device_count()}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    return Dist(dist.get_rank(), dist.get_world_size(), local_rank, device, owns, restarts)


def join_group(backend: str, restarts: int) -> None:
    """init_process_group; under torchrun's agent store, in a key space of this attempt's own:
    the agent keeps its store across `--max-restarts`, and gloo would read the dead attempt's
    addresses there (and fail, or hang, connecting to them)."""
    env = os.environ
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.init_process_group(backend)
        return
    world = int(env["WORLD_SIZE"])
    agent = dist.TCPStore(
        env["MASTER_ADDR"], int(env["MASTER_PORT"]), world, is_master=False, timeout=STORE_TIMEOUT
    )
    store = dist.PrefixStore(f"/mmcurate/attempt_{restarts}", agent)
    dist.init_process_group(backend, store=store, rank=int(env["RANK"]), world_size=world)


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


def rank_label() -> str:
    """`[rank R] ` for a process torchrun started among several (its lines go to one
    terminal with the others'), else "" (read before or without joining the group)."""
    env = os.environ
    return f"[rank {env.get('RANK', '0')}] " if int(env.get("WORLD_SIZE", "1")) > 1 else ""

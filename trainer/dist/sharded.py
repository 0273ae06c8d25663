"""Sharded checkpoints (`strategy: fsdp`): the model and optimizer state saved with
torch.distributed.checkpoint (DCP), each rank writing only its own shards, into
`checkpoints/step-<N>.dcp/` beside rank 0's `step-<N>.pt`.

`step-<N>.pt` stays the run's checkpoint as `mmcurate eval`, open_clip and clip_benchmark
know it (the gathered weights under `state_dict` and `model`, the schedule, the loader's
position, the config) and names its DCP folder under `sharded`; the optimizer state is only
in the folder. DCP reshards on load: a folder written by 4 ranks loads on 2, or on one
process (no process group), into a sharded or a plain model alike.

DCP writes the folder's `.metadata` last, so a folder without it is a save cut short: such a
checkpoint is passed over by a resume (`damage`), as is one whose `.metadata` does not read or
whose shard files are shorter than the items it places in them (truncated, emptied). With
`run.async_checkpoint` the shards are copied to host memory and written by a background thread
(`dcp.async_save`, its collectives on a gloo group of their own so they never interleave with
training's); the next save, a load and the end of the run wait for it (`wait`).
"""

from __future__ import annotations

import logging
import pickle
import posixpath
from concurrent.futures import Future
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from mmcurate.core.config_io import ConfigError
from mmcurate.core.storage import filesystem, is_local, join
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

log = logging.getLogger(__name__)
METADATA = ".metadata"  # DCP's own commit mark, written after every shard
_pending: list[Future] = []  # this process's async save in flight (one at most)
_group: list[Any] = []  # the gloo group async saves use (made once, by every rank)


def folder_name(step: int) -> str:
    return f"step-{step}.dcp"


def folder_of(checkpoint: str, ckpt: dict[str, Any]) -> str:
    """The DCP folder a loaded `step-<N>.pt` names, beside it."""
    return join(posixpath.dirname(str(checkpoint)), ckpt["sharded"])


def template(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """This rank's state as DCP saves and fills it: DTensor shards for a sharded model,
    whole tensors otherwise; the optimizer's keyed by parameter name (so either loads)."""
    return {
        "model": get_model_state_dict(model),
        "optimizer": get_optimizer_state_dict(model, optimizer),
    }


def writer(url: str, storage_options: dict | None) -> Any:
    fs, path = filesystem(url, storage_options)
    if is_local(fs):
        return dcp.FileSystemWriter(path)
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    return FsspecWriter(url, **(storage_options or {}))


def reader(url: str, storage_options: dict | None) -> Any:
    fs, path = filesystem(url, storage_options)
    if is_local(fs):
        return dcp.FileSystemReader(path)
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    return FsspecReader(url, **(storage_options or {}))


def save(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    url: str,
    storage_options: dict | None = None,
    background: bool = False,
) -> None:
    """Write this rank's shards to the DCP folder `url` (every rank calls it)."""
    wait()  # one save in flight at most
    state = template(model, optimizer)
    if not background or not dist.is_initialized():
        alone = not dist.is_initialized()  # one process: no group to plan the save over
        dcp.save(state, storage_writer=writer(url, storage_options), no_dist=alone)
        return
    if not _group:  # a collective call: every rank makes it at its first async save
        _group.append(dist.new_group(backend="gloo"))
    _pending.append(
        dcp.async_save(state, storage_writer=writer(url, storage_options), process_group=_group[0])
    )


def wait() -> None:
    """Block until this process's async save (if any) is on storage; raises its error."""
    while _pending:
        _pending.pop().result()


def load(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    url: str,
    storage_options: dict | None = None,
) -> None:
    """Load the DCP folder `url` into `model` (and `optimizer`), resharded to this world."""
    wait()
    state = template(model, optimizer) if optimizer is not None else None
    if state is None:
        state = {"model": get_model_state_dict(model)}
    alone = not dist.is_initialized()  # a resume on one process, no process group
    try:  # a group's load raises its ranks' errors on every rank (CheckpointException)
        dcp.load(state, storage_reader=reader(url, storage_options), no_dist=alone)
    # Why these: what a shard garbled past damage()'s size check (or other tensors) raises.
    except (CheckpointException, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as err:
        first = " ".join(str(err).split())[:200]
        raise ConfigError(
            f"run.resume: {url} does not load ({type(err).__name__}: {first}); move its "
            "step-N.pt out of checkpoints/ to resume from an older one"
        ) from None
    set_model_state_dict(model, state["model"])
    if optimizer is not None:
        set_optimizer_state_dict(model, optimizer, state["optimizer"])


def read_full(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, url: str, storage_options: Any
) -> dict[str, Any]:
    """The DCP folder `url`'s model and optimizer state, whole on every rank, the optimizer's
    keyed by position (for optim.zero, which DCP cannot load into): read through a plain
    AdamW over `optimizer`'s param groups (the unsharded parameters of ddp), then dropped."""
    core = getattr(model, "module", model)
    plain = torch.optim.AdamW([dict(group) for group in optimizer.param_groups])  # its settings
    load(model, plain, url, storage_options)
    return {"model": core.state_dict(), "optimizer": plain.state_dict()}


def damage(checkpoint: str, ckpt: dict[str, Any], storage_options: dict | None) -> str | None:
    """Why a loaded `step-<N>.pt`'s DCP folder (if it names one) cannot be loaded, or None:
    no `.metadata` (a save cut short), one that does not unpickle, or a shard file shorter
    than the items `.metadata` places in it (truncated, emptied). Reads sizes, not shards."""
    if "sharded" not in ckpt:
        return None
    url = folder_of(checkpoint, ckpt)
    fs, path = filesystem(url, storage_options)
    if not fs.exists(posixpath.join(path, METADATA)):
        return "its DCP folder is incomplete (no .metadata)"
    try:
        metadata = reader(url, storage_options).read_metadata()
    # Why these: what unpickling a cut or garbled file raises.
    except (EOFError, pickle.UnpicklingError, AttributeError, ValueError, TypeError) as err:
        return f"its DCP .metadata is unreadable ({type(err).__name__})"
    needed: dict[str, int] = {}
    for item in metadata.storage_data.values():
        end = item.offset + item.length
        needed[item.relative_path] = max(needed.get(item.relative_path, 0), end)
    for name, size in sorted(needed.items()):
        shard = posixpath.join(path, name)
        have = fs.size(shard) if fs.exists(shard) else None
        if have is None or have < size:
            got = "missing" if have is None else f"{have} of {size} bytes"
            return f"its DCP shard {name} is cut short ({got})"
    return None

"""Where training stands (`LoopState`): step, epoch, the loader's position in the epoch and
the unusable data seen so far; what of it a checkpoint stores (`loader_state`), and the loop's
questions about it (finished, a checkpoint due by the clock, an epoch carried over a re-split).
trainer/resume.py saves and restores it."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from mmcurate.trainer.config import RunConfig, TrainConfig
from mmcurate.trainer.data.manifest import read_manifest
from mmcurate.trainer.data.resplit import Split
from mmcurate.trainer.dist.world import Dist

log = logging.getLogger(__name__)


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
    skipped_steps: int = 0  # steps health skipped (non-finite), since the start of training
    restores: int = 0  # times health reloaded the last good checkpoint
    manifest_digest: str | None = None  # the data's shards and weights (`manifest_digest`)
    carried: list[Split] = field(default_factory=list)  # this epoch's earlier layouts


def manifest_digest(cfg: TrainConfig) -> str:
    """A digest of what the loader's plan is made of: every manifest's shards (names relative
    to it, sample counts, sha256) and weight, `data.manifest` then `data.mix` in order."""
    digest = hashlib.sha256()
    sources = [(cfg.data.manifest, cfg.data.weight)]
    sources += [(entry.manifest, entry.weight) for entry in cfg.data.mix]
    for url, weight in sources:
        manifest = read_manifest(url, cfg.storage_options)
        folder = manifest.url.rsplit("/", 1)[0] + "/"
        shards = [[s.url.removeprefix(folder), s.samples, s.sha256] for s in manifest.shards]
        digest.update(json.dumps([weight, shards]).encode() + b"\n")
    return digest.hexdigest()[:16]


def loader_state(
    state: LoopState, cfg: TrainConfig, world: int, manifest_samples: int
) -> dict[str, Any]:
    digest = {} if state.manifest_digest is None else {"manifest_digest": state.manifest_digest}
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
        "skipped_steps": state.skipped_steps,
        "restores": state.restores,
        "carried": [split.saved() for split in state.carried],
    } | digest


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


def finished(run: RunConfig, state: LoopState) -> bool:
    """Whether `run.max_steps` (or, without it, `run.epochs`) is reached."""
    if run.max_steps is not None:
        return state.step >= run.max_steps
    return state.epoch >= run.epochs


def carry_epoch(dataset: Any, state: LoopState) -> None:
    """A resume that re-splits its epoch over another layout: the dataset plans the rest
    (trainer/data/resplit.py); a rest too short for one step of every rank moves on to the next
    epoch (its samples left out, as an epoch's tail is)."""
    if state.carried and dataset.carry(state.epoch, state.carried) == 0:
        log.warning("run.resume: the rest of epoch %d holds no full step: next epoch", state.epoch)
        state.epoch, state.carried = state.epoch + 1, []


def minutes_due(run: RunConfig, place: Dist, since: float) -> bool:
    """run.checkpoint_minutes: whether that long has passed since `since` (a monotonic time)
    by rank 0's clock, the same answer on every rank (one broadcast a step when set)."""
    every = run.checkpoint_minutes
    if every is None:
        return False
    due = torch.tensor([time.monotonic() - since >= every * 60], device=place.device)
    if place.world > 1:
        dist.broadcast(due, 0)
    return bool(due.item())

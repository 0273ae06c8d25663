"""How a run survives a stop: checkpoints hold the model, optimizer, schedule, scaler, the
loader's position and layout (trainer/loop_state.py) and the resolved config; a resume restores
them so that the run continues with exactly the samples not yet trained on. Also which
checkpoint a run resumes from, and what run.overwrite and a torchrun restart do."""

from __future__ import annotations

import logging
import posixpath
from pathlib import Path
from typing import Any

from mmcurate.core.config_io import ConfigError
from mmcurate.core.storage import join
from mmcurate.trainer.checkpoint import (
    CHECKPOINT_FORMAT,
    CheckpointUnreadable,
    checkpoint_exists,
    checkpoint_path,
    list_checkpoints,
    load_checkpoint,
    missing_train_keys,
    read_checkpoint,
    save_checkpoint,
    sweep_partial_saves,
)
from mmcurate.trainer.config import TrainConfig
from mmcurate.trainer.data.resplit import Split, saved_splits
from mmcurate.trainer.dist import sharded
from mmcurate.trainer.dist.fsdp import is_fsdp, load_weights_and_optimizer, weights_and_optimizer
from mmcurate.trainer.dist.world import Dist, barrier, from_rank0
from mmcurate.trainer.loop_state import LoopState, loader_state, manifest_digest
from mmcurate.trainer.models import open_clip_state_dict
from mmcurate.trainer.outputs import remove_run
from mmcurate.trainer.step import Learner

log = logging.getLogger(__name__)

# Loader settings a mid-epoch resume must share with the run that wrote the checkpoint.
LOADER_LAYOUT = (
    *("seed", "batch_size", "workers", "world", "shuffle_buffer", "accum_freq"),
    "manifest_samples",  # a changed manifest would change the plan
    "manifest_digest",  # and so would other shards of the same total (older checkpoints: none)
)
RESPLIT = {"world", "workers"}  # changed mid-epoch, the rest of the epoch is re-split


def save_state(
    learner: Learner,
    state: LoopState,
    cfg: TrainConfig,
    world: int,
    manifest_samples: int,
    staging: Path | None = None,
    gathered: tuple[dict[str, Any], dict[str, Any] | None] | None = None,
    sharded: str | None = None,
) -> str:
    """Checkpoint model, optimizer, schedule, loader position and the resolved config. The
    weights are also under `state_dict` as plain open_clip loads them (the same tensors: saved
    once), so `create_model_and_transforms(name, pretrained=PATH)` takes the file as it is.
    `gathered`: (model, optimizer) state already gathered from the ranks (strategy fsdp:
    no optimizer, it is in the DCP folder `sharded`, trainer/dist/sharded.py)."""
    weights, optimizer = gathered or weights_and_optimizer(learner)
    where = {"optimizer": optimizer} if sharded is None else {"sharded": sharded}
    return save_checkpoint(
        checkpoint_path(cfg.run.output, state.step),
        {
            "format": CHECKPOINT_FORMAT,
            "step": state.step,
            "model": weights,
            "state_dict": open_clip_state_dict(weights, cfg.model.name),
            **where,
            "scheduler": learner.scheduler.state_dict(),
            "scaler": learner.scaler.state_dict(),
            "loader": loader_state(state, cfg, world, manifest_samples),
            "config": cfg.redacted(),
        },
        cfg.storage_options,
        staging,
    )


def restore_state(
    learner: Learner,
    path: str,
    cfg: TrainConfig,
    world: int,
    manifest_samples: int,
    digest: str | None = None,
) -> LoopState:
    """Load a checkpoint into `learner` and return where the data continues. Mid-epoch, the
    loader layout must match the one that wrote it (else the plan would differ); `digest` is
    the data's `manifest_digest` now (a checkpoint written without one is not compared)."""
    ckpt = read_resumable(path, cfg)
    saved = ckpt["loader"]
    now = loader_state(LoopState(manifest_digest=digest), cfg, world, manifest_samples)
    changed = [k for k in LOADER_LAYOUT if k in saved and k in now and saved[k] != now[k]]
    consumed, carried = saved.get("batches_in_epoch", 0), saved_splits(saved)
    if consumed and changed and set(changed) <= RESPLIT:  # the rest re-split over the new one
        carried.append(Split(saved["world"], saved["workers"], consumed))
        consumed, changed = 0, []
        was = f"{saved['world']} ranks x {saved['workers']} workers"
        log.info("run.resume: the rest of epoch %d, left by %s, is re-split", saved["epoch"], was)
    if changed and consumed:
        was = ", ".join(f"{k}={saved.get(k)}" for k in changed)
        got = ", ".join(f"{k}={now[k]}" for k in changed)
        why = (
            " (the shards of data.manifest and data.mix differ: names, sample counts, sha256 "
            "or weights)"
            if "manifest_digest" in changed
            else ""
        )
        raise ConfigError(
            f"run.resume: {posixpath.basename(path)} stopped mid-epoch with {was}; an exact "
            f"resume needs the same loader layout (now {got}){why}"
        )
    load_weights_and_optimizer(learner, ckpt, path, cfg.storage_options)
    learner.scheduler.load_state_dict(ckpt["scheduler"])
    learner.scaler.load_state_dict(ckpt["scaler"])
    log.info("resumed from %s at step %d", path, ckpt["step"])
    return LoopState(
        step=ckpt["step"],
        epoch=saved["epoch"],
        samples_seen=saved["samples_seen"],
        batches_in_epoch=consumed,
        skipped_shards=set(saved.get("skipped_shards", ())),
        replaced_samples=saved.get("replaced_samples", 0),
        skipped_steps=saved.get("skipped_steps", 0),
        restores=saved.get("restores", 0),
        manifest_digest=digest,
        carried=carried,
    )


def read_resumable(path: str, cfg: TrainConfig, lazy: bool = False) -> dict[str, Any]:
    """A training checkpoint to resume from; ConfigError (one line) for one that torch cannot
    read, that is not a training checkpoint (an exported model written over a step file) or
    that trained another model.name."""
    try:
        ckpt = read_checkpoint(path, cfg.storage_options, lazy=lazy)
    except CheckpointUnreadable as err:
        raise ConfigError(f"run.resume: {err}") from None
    missing = missing_train_keys(ckpt)
    if missing or not isinstance(ckpt["loader"], dict):
        raise ConfigError(
            f"run.resume: {path} is not an mmcurate train checkpoint (it lacks "
            f"{', '.join(missing or ['loader state'])}); move it out of checkpoints/ to resume "
            "from an older one"
        )
    trained = ckpt.get("config", {}).get("model", {}).get("name", cfg.model.name)
    if trained != cfg.model.name:  # its tensors would not fit this model's
        raise ConfigError(
            f"model.name: {cfg.model.name!r}, but the run in run.output trained {trained!r} "
            f"({posixpath.basename(path)}); resume with its model.name, or start another run"
        )
    return ckpt


def reload_weights(learner: Learner, path: str, cfg: TrainConfig) -> None:
    """Load a checkpoint's model, optimizer and scaler into `learner` (health's restore); the
    schedule, the learning rate and the loader go on where they are."""
    ckpt = load_checkpoint(path, cfg.storage_options)
    rates = [group["lr"] for group in learner.optimizer.param_groups]
    load_weights_and_optimizer(learner, ckpt, path, cfg.storage_options)
    for group, lr in zip(learner.optimizer.param_groups, rates, strict=True):
        group["lr"] = lr
    learner.scaler.load_state_dict(ckpt["scaler"])
    log.warning("health: restored the weights of %s", path)


def previous_checkpoint(cfg: TrainConfig, output: str, place: Dist) -> str | None:
    """The checkpoint to resume from, chosen by rank 0 for every rank (each must read it).
    A run already in `output` is continued only with run.resume, replaced only with
    run.overwrite (by `clear_previous_run`, once everything else has been checked), and
    otherwise refused: starting afresh beside its checkpoints would let a later resume pick
    up the old run's."""
    chosen, problem = None, None
    if place.rank == 0:
        for name in sweep_partial_saves(output, cfg.storage_options):
            log.warning("removed %s: a checkpoint save that was killed midway", name)
        found = list_checkpoints(output, cfg.storage_options)
        chosen = found[0] if found else None
        if chosen and cfg.run.overwrite:
            chosen = None
        elif chosen and not cfg.run.resume:
            problem = (
                f"run.output: {output} holds a run (newest checkpoint "
                f"{posixpath.basename(chosen)}); set run.resume=true to continue it or "
                "run.overwrite=true to replace it"
            )
        elif chosen:
            try:
                chosen = newest_intact(found, cfg)
            except ConfigError as err:
                problem = str(err)
    chosen, problem = from_rank0(place, chosen, problem)
    if problem:
        raise ConfigError(problem)
    if chosen and not checkpoint_exists(chosen, cfg.storage_options):
        raise ConfigError(
            f"run.output: rank {place.rank} cannot read {chosen}; resuming needs "
            "run.output on object storage or a filesystem every node shares"
        )
    return chosen


def newest_intact(found: list[str], cfg: TrainConfig) -> str:
    """The newest of `found` (newest first) that loads: an unreadable one (a stop or power
    loss that cut it short) is passed over with a warning; ConfigError when none loads, or
    when the newest that loads is not a training checkpoint."""
    first_problem = None
    for path in found:
        try:
            ckpt = read_checkpoint(path, cfg.storage_options, lazy=True)
            why = isinstance(ckpt, dict) and sharded.damage(path, ckpt, cfg.storage_options)
            if why:
                raise CheckpointUnreadable(f"{path} is unreadable ({why})")
        except CheckpointUnreadable as err:
            first_problem = first_problem or f"run.resume: {err}"
            log.warning("run.resume: %s; trying the next newest checkpoint", err)
            continue
        read_resumable(path, cfg, lazy=True)  # a readable file must be a train checkpoint
        return path
    raise ConfigError(f"{first_problem}; no older checkpoint is intact")


def start_state(
    learner: Learner, previous: str | None, cfg: TrainConfig, place: Dist, manifest_samples: int
) -> LoopState:
    """A fresh state, or the one `previous` restores into `learner`. Rank 0 alone carries the
    earlier run's replaced samples on (the total is a sum over ranks)."""
    digest = manifest_digest(cfg)
    if previous is None:
        return LoopState(manifest_digest=digest)
    state = restore_state(learner, previous, cfg, place.world, manifest_samples, digest)
    if place.rank:
        state.replaced_samples = 0
    return state


def clear_previous_run(cfg: TrainConfig, place: Dist) -> None:
    """run.overwrite: delete what a run in run.output wrote, as late as possible - after the
    model, its weights, the data and the loader have all been set up - so a run that fails
    its checks (a wrong model.pretrained, a bad cache folder) leaves the old one whole."""
    if cfg.run.overwrite and place.rank == 0:
        remove_run(cfg.run.output, cfg.storage_options)
    barrier(place)  # no rank writes into run.output before the old run's files are gone


def restarted_config(cfg: TrainConfig, place: Dist) -> TrainConfig:
    """After torchrun (`--max-restarts`) or Ray Train (`launch.max_failures`) restarted the
    ranks (a rank was lost) the run goes on from its own newest checkpoint: run.resume on,
    run.overwrite off (it would delete it)."""
    if not place.restarts or (cfg.run.resume and not cfg.run.overwrite):
        return cfg
    log.warning("restart %d: resuming from the newest checkpoint", place.restarts)
    run = cfg.run.model_copy(update={"resume": True, "overwrite": False})
    return cfg.model_copy(update={"run": run})


def announce_restart(alerts: Any, place: Dist, state: LoopState, previous: str | None) -> None:
    """The `restart` alert (rank 0's sender) of a run torchrun or Ray Train restarted."""
    if place.restarts:
        where = posixpath.basename(previous) if previous else "the start (no checkpoint yet)"
        message = f"restart {place.restarts} after a lost rank: resumed from {where}"
        alerts.send("restart", state.step, message, {"restarts": place.restarts})


def save_shards(learner: Learner, cfg: TrainConfig, step: int) -> str | None:
    """strategy fsdp: every rank writes its model and optimizer shards to the step's DCP
    folder (trainer/dist/sharded.py); returns its name for rank 0's `step-<N>.pt`."""
    if not is_fsdp(learner.model):
        return None
    name = sharded.folder_name(step)
    url = join(cfg.run.output, "checkpoints", name)
    sharded.save(
        learner.model, learner.optimizer, url, cfg.storage_options, cfg.run.async_checkpoint
    )
    return name

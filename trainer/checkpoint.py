"""Atomic training checkpoints: `<output>/checkpoints/step-<N>.pt`, on a local disk or on object
storage (any fsspec URL: s3://, gs://, ...).

A local checkpoint is synced to disk before it is renamed into place, and its folder after,
so a host that loses power keeps either the whole file or none. A resume reads them through
`read_checkpoint`, which says in one line (CheckpointUnreadable) what torch cannot read."""

from __future__ import annotations

import contextlib
import errno
import os
import pickle
import posixpath
import re
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import torch
from mmcurate.core.atomic import pid_gone, put_file_atomic
from mmcurate.core.formats import CHECKPOINT_FORMAT
from mmcurate.core.storage import filesystem, is_local, join

_NAME = re.compile(r"^step-(\d+)\.pt$")
_PARTIAL = re.compile(r"^\.step-\d+\.pt\.tmp-(\d+)$")  # save_checkpoint's temporary name
PARTIAL_AGE_S = 300  # a partial untouched this long whose writer is gone is a dead save's
# What a resume needs in a training checkpoint (an open_clip export has none of them).
TRAIN_KEYS = ("step", "model", "optimizer", "scheduler", "scaler", "loader")


class CheckpointUnreadable(ValueError):
    """A checkpoint file torch cannot load (truncated, empty, not a checkpoint at all)."""


def checkpoint_path(output: str, step: int) -> str:
    return join(str(output), "checkpoints", f"step-{step}.pt")


def save_checkpoint(
    url: str,
    state: dict[str, Any],
    storage_options: dict | None = None,
    staging: Path | None = None,
) -> str:
    """Write `state` with torch.save so that readers never see half a checkpoint: a local
    file is written under a temporary name and renamed; for object storage it is written
    whole to `staging` (a local folder) and then uploaded, and a store publishes an object
    only when its upload completes. A save that fails midway leaves nothing behind."""
    fs, path = filesystem(url, storage_options)
    local = is_local(fs)
    folder = Path(os.path.dirname(path)) if local else Path(staging or tempfile.gettempdir())
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{posixpath.basename(path)}.tmp-{os.getpid()}"
    try:
        torch.save(state, tmp)
        if local:
            fsync(tmp)  # its bytes on disk before its name: never a short file under it
            os.replace(tmp, path)
            fsync(folder)  # and the rename itself
        else:
            put_file_atomic(fs, str(tmp), path)
    finally:
        tmp.unlink(missing_ok=True)
    return url


def sweep_partial_saves(output: str, storage_options: dict | None = None) -> list[str]:
    """Delete what saves killed midway left in a local `<output>/checkpoints` (a rank
    SIGTERMed by torchrun while writing): temporaries whose writing process is gone and that
    are untouched for PARTIAL_AGE_S (a writer in another pid namespace on a shared disk
    still touches its file). Returns the names removed."""
    fs, path = filesystem(join(str(output), "checkpoints"), storage_options)
    folder = Path(path)
    if not is_local(fs) or not folder.is_dir():
        return []
    removed = []
    for entry in folder.iterdir():
        match = _PARTIAL.match(entry.name)
        if not match or not pid_gone(int(match.group(1))):
            continue
        with contextlib.suppress(FileNotFoundError):
            if time.time() - entry.stat().st_mtime > PARTIAL_AGE_S:
                entry.unlink()
                removed.append(entry.name)
    return removed


def fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def checkpoint_step(url: str) -> int:
    """The step in a checkpoint's name (`step-<N>.pt`)."""
    match = _NAME.match(posixpath.basename(str(url)))
    if not match:
        raise ValueError(f"not a checkpoint name: {url}")
    return int(match.group(1))


def latest_checkpoint(output: str, storage_options: dict | None = None) -> str | None:
    """The checkpoint with the highest step in `<output>/checkpoints`, or None."""
    found = list_checkpoints(output, storage_options)
    return found[0] if found else None


def list_checkpoints(output: str, storage_options: dict | None = None) -> list[str]:
    """The checkpoints in `<output>/checkpoints`, newest (highest step) first."""
    folder = join(str(output), "checkpoints")
    fs, path = filesystem(folder, storage_options)
    fs.invalidate_cache(path)  # another run may have written since this process listed it
    try:
        names = [posixpath.basename(name) for name in fs.ls(path, detail=False)]
    except FileNotFoundError:
        return []
    found = sorted((int(m.group(1)), name) for name in names if (m := _NAME.match(name)))
    return [join(folder, name) for _, name in reversed(found)]


def checkpoint_exists(url: str, storage_options: dict | None = None) -> bool:
    fs, path = filesystem(url, storage_options)
    return fs.isfile(path)


def load_checkpoint(url: str, storage_options: dict | None = None) -> dict[str, Any]:
    fs, path = filesystem(str(url), storage_options)
    with fs.open(path, "rb") as f:
        # weights_only: our checkpoints hold only tensors and plain Python values.
        return torch.load(f, map_location="cpu", weights_only=True)


def read_checkpoint(url: str, storage_options: dict | None = None, lazy: bool = False) -> Any:
    """load_checkpoint for a resume: CheckpointUnreadable, one line, for a file torch cannot
    load. `lazy`: a local file's tensors are mapped, not read (a cheap check of the file)."""
    fs, path = filesystem(str(url), storage_options)
    if fs.size(path) == 0:
        raise CheckpointUnreadable(f"{url} is unreadable (an empty file)")
    try:
        if is_local(fs):
            mmap = lazy and zipfile.is_zipfile(path)
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
        return load_checkpoint(url, storage_options)
    # Why these: torch reports a damaged zip as RuntimeError, a cut pickle as EOFError, one
    # it refuses (weights_only) as UnpicklingError, a seek past a cut file's end as EINVAL.
    except (RuntimeError, EOFError, ValueError, pickle.UnpicklingError, OSError) as err:
        if isinstance(err, OSError) and err.errno != errno.EINVAL:
            raise  # storage trouble (gone, denied, the network): not the file's fault
        first = " ".join(str(err).split()).split(". ")[0][:160]
        why = f"{type(err).__name__}: {first}" if first else type(err).__name__
        if isinstance(err, OSError):
            why = "cut short: a read past its end"
        raise CheckpointUnreadable(f"{url} is unreadable ({why})") from None


def missing_train_keys(state: Any) -> list[str]:
    """What a resume needs that a loaded checkpoint lacks (all of it when not a dict)."""
    if not isinstance(state, dict):
        return list(TRAIN_KEYS)
    # A sharded checkpoint's optimizer state is in its DCP folder (trainer/dist/sharded.py).
    needed = [k for k in TRAIN_KEYS if k != "optimizer" or "sharded" not in state]
    return [key for key in needed if key not in state]


def is_train_checkpoint(state: Any) -> bool:
    """True for a loaded `mmcurate train` checkpoint (its weights under "model")."""
    return isinstance(state, dict) and state.get("format") == CHECKPOINT_FORMAT

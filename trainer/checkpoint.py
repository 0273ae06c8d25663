"""Atomic training checkpoints: `<output>/checkpoints/step-<N>.pt`, on a local disk or on object
storage (any fsspec URL: s3://, gs://, ...)."""

from __future__ import annotations

import os
import posixpath
import re
import tempfile
from pathlib import Path
from typing import Any

import torch

from core.formats import CHECKPOINT_FORMAT
from core.storage import filesystem, is_local, join, put_file_atomic

_NAME = re.compile(r"^step-(\d+)\.pt$")


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
            os.replace(tmp, path)
        else:
            put_file_atomic(fs, str(tmp), path)
    finally:
        tmp.unlink(missing_ok=True)
    return url


def checkpoint_step(url: str) -> int:
    """The step in a checkpoint's name (`step-<N>.pt`)."""
    match = _NAME.match(posixpath.basename(str(url)))
    if not match:
        raise ValueError(f"not a checkpoint name: {url}")
    return int(match.group(1))


def latest_checkpoint(output: str, storage_options: dict | None = None) -> str | None:
    """The checkpoint with the highest step in `<output>/checkpoints`, or None."""
    folder = join(str(output), "checkpoints")
    fs, path = filesystem(folder, storage_options)
    fs.invalidate_cache(path)  # another run may have written since this process listed it
    try:
        names = [posixpath.basename(name) for name in fs.ls(path, detail=False)]
    except FileNotFoundError:
        return None
    found = [(int(m.group(1)), name) for name in names if (m := _NAME.match(name))]
    return join(folder, max(found)[1]) if found else None


def checkpoint_exists(url: str, storage_options: dict | None = None) -> bool:
    fs, path = filesystem(url, storage_options)
    return fs.isfile(path)


def load_checkpoint(url: str, storage_options: dict | None = None) -> dict[str, Any]:
    fs, path = filesystem(str(url), storage_options)
    with fs.open(path, "rb") as f:
        # weights_only: our checkpoints hold only tensors and plain Python values.
        return torch.load(f, map_location="cpu", weights_only=True)


def is_train_checkpoint(state: Any) -> bool:
    """True for a loaded `mmcurate train` checkpoint (its weights under "model")."""
    return isinstance(state, dict) and state.get("format") == CHECKPOINT_FORMAT

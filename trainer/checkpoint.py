"""Atomic training checkpoints: `<output>/checkpoints/step-<N>.pt`."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch

_NAME = re.compile(r"^step-(\d+)\.pt$")


def checkpoint_path(output: str | Path, step: int) -> Path:
    return Path(output) / "checkpoints" / f"step-{step}.pt"


def save_checkpoint(path: Path, state: dict[str, Any]) -> Path:
    """Write `state` with torch.save to a temp file, then rename: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def checkpoint_step(path: Path) -> int:
    """The step in a checkpoint's name (`step-<N>.pt`)."""
    match = _NAME.match(path.name)
    if not match:
        raise ValueError(f"not a checkpoint name: {path.name}")
    return int(match.group(1))


def latest_checkpoint(output: str | Path) -> Path | None:
    """The checkpoint with the highest step in `<output>/checkpoints`, or None."""
    folder = Path(output) / "checkpoints"
    found = [
        (int(m.group(1)), p)
        for p in (folder.iterdir() if folder.is_dir() else [])
        if (m := _NAME.match(p.name))
    ]
    return max(found)[1] if found else None


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    # weights_only: our checkpoints hold only tensors and plain Python values.
    return torch.load(path, map_location="cpu", weights_only=True)

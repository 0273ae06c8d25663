"""mmcurate's own open_clip architectures (`mmcurate-tiny`: trains on a CPU in seconds), made
known to open_clip by `register()`; training, evaluation and the model stages all call it."""

from __future__ import annotations

from pathlib import Path

MODEL_CONFIG_DIR = Path(__file__).parent


def register() -> None:
    """Add this folder's configs to open_clip's registry (idempotent)."""
    import open_clip

    open_clip.add_model_config(MODEL_CONFIG_DIR)

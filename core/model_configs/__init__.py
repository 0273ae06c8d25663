"""mmcurate's own open_clip architectures (`mmcurate-tiny`: trains on a CPU in seconds), made
known to open_clip by `register()`; training, evaluation and the model stages all call it."""

from __future__ import annotations

from pathlib import Path

MODEL_CONFIG_DIR = Path(__file__).parent


def register() -> None:
    """Add this folder's configs to open_clip's registry (idempotent)."""
    import open_clip

    open_clip.add_model_config(MODEL_CONFIG_DIR)


def check_local_dir(name: str) -> None:
    """For open_clip's `local-dir:FOLDER` names: the Hugging Face text tower the folder's
    config names (`text_cfg.hf_model_name`) must be a local folder, so nothing is fetched from
    a hub. Raises ValueError in one line; other names pass."""
    if not name.startswith("local-dir:"):
        return
    import json

    folder = Path(name.removeprefix("local-dir:")).expanduser()
    try:
        config = json.loads((folder / "open_clip_config.json").read_text())
        text = config.get("model_cfg", config).get("text_cfg", {})
    except (OSError, ValueError, AttributeError) as err:
        raise ValueError(
            f"{name}: no readable open_clip_config.json ({type(err).__name__})"
        ) from None
    hf_model = text.get("hf_model_name") if isinstance(text, dict) else None
    if hf_model and not Path(str(hf_model)).expanduser().is_dir():
        raise ValueError(
            f"{name}: text_cfg.hf_model_name {hf_model!r} is not a local folder "
            "(nothing is downloaded: give the folder that holds the text model)"
        )

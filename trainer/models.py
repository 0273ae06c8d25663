"""open_clip models by name; registers mmcurate's own tiny configs on import.

`mmcurate-tiny` (model_configs/mmcurate-tiny.json) trains on a CPU in seconds and needs no
download: open_clip's default SimpleTokenizer ships its BPE vocabulary inside the wheel.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import open_clip
import torch

from pipeline.config_io import ConfigError
from trainer.config import ModelConfig

MODEL_CONFIG_DIR = Path(__file__).with_name("model_configs")

open_clip.add_model_config(MODEL_CONFIG_DIR)


def known_model(name: str) -> bool:
    """True for a registered architecture or a schema-prefixed name (hf-hub:, local-dir:)."""
    return name in open_clip.list_models() or name.startswith(("hf-hub:", "local-dir:"))


def build_model(
    cfg: ModelConfig, device: torch.device
) -> tuple[torch.nn.Module, Callable[[Any], torch.Tensor], Callable[..., torch.Tensor]]:
    """Model on `device` in fp32, the training image transform, and the text tokenizer."""
    if not known_model(cfg.name):
        raise ConfigError(f"model.name: unknown open_clip model {cfg.name!r}")
    extra = {}
    if cfg.loss == "siglip":  # SigLIP's learned bias and temperature, at the paper's init
        extra = {"init_logit_bias": -10.0, "init_logit_scale": math.log(10)}
    model, preprocess_train, _ = open_clip.create_model_and_transforms(
        cfg.name, pretrained=cfg.pretrained, device=device, output_dict=True, **extra
    )
    tokenizer = open_clip.get_tokenizer(cfg.name)
    return model, preprocess_train, tokenizer

"""open_clip image embeddings for the stages that need them (semantic_dedupe; clip_score later).

The model loads once per worker process (`load_model` is cached by its arguments). Images are
decoded with PIL, run through the model's own eval transform, and embedded in batches; the
result is L2-normalized float32, one row per image.
"""

from __future__ import annotations

import io
from functools import lru_cache
from typing import Any

import numpy as np
from PIL import Image

from pipeline.config_io import ConfigError


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


@lru_cache(maxsize=2)
def load_model(name: str, pretrained: str | None, device: str) -> tuple[Any, Any]:
    """(model in eval mode on `device`, eval image transform). Unknown names fail in one line."""
    import open_clip
    import torch

    import trainer.models  # noqa: F401  (registers mmcurate-tiny)

    if name not in open_clip.list_models() and not name.startswith(("hf-hub:", "local-dir:")):
        raise ConfigError(f"model: unknown open_clip model {name!r}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)  # without weights, every worker must draw the same random ones
        model, _, preprocess = open_clip.create_model_and_transforms(
            name, pretrained=pretrained, device=device
        )
    model.eval()
    return model, preprocess


def embed_images(
    images: list[bytes], name: str, pretrained: str | None, device: str, batch_size: int
) -> tuple[list[np.ndarray | None], list[str | None]]:
    """Per image: a normalized embedding or None, and None or a drop reason."""
    import torch

    device = resolve_device(device)
    model, preprocess = load_model(name, pretrained, device)
    tensors: list[Any] = []
    reasons: list[str | None] = []
    for data in images:
        try:
            with Image.open(io.BytesIO(data)) as image:
                tensors.append(preprocess(image.convert("RGB")))
            reasons.append(None)
        except (OSError, ValueError, Image.DecompressionBombError):
            tensors.append(None)
            reasons.append("decode_error")
    good = [i for i, t in enumerate(tensors) if t is not None]
    embeddings: list[np.ndarray | None] = [None] * len(images)
    with torch.inference_mode():
        for start in range(0, len(good), batch_size):
            rows = good[start : start + batch_size]
            batch = torch.stack([tensors[i] for i in rows]).to(device)
            features = model.encode_image(batch).float()
            features = torch.nn.functional.normalize(features, dim=-1).cpu().numpy()
            for i, vector in zip(rows, features, strict=True):
                embeddings[i] = vector.astype(np.float32)
    return embeddings, reasons

"""The LAION aesthetic predictor heads, loaded from a local file and folded into one linear map.

- v1 (LAION-Aesthetics v1, `sa_0_4_vit_b_32_linear.pth`, `sa_0_4_vit_l_14_linear.pth`): one
  `nn.Linear(dim, 1)`, state-dict keys `weight` [1, dim] and `bias` [1].
- v2 (improved-aesthetic-predictor, `sac+logos+ava1-l14-linearMSE.pth`): an `nn.Sequential` of
  Linear(768, 1024), Dropout, Linear(1024, 128), Dropout, Linear(128, 64), Dropout,
  Linear(64, 16), Linear(16, 1), keys `layers.0`, `layers.2`, `layers.4`, `layers.6`,
  `layers.7` (`.weight`, `.bias`). It has no activations and dropout is the identity at
  inference, so the chain is one affine map: W = W7 W6 W4 W2 W0, b folded alongside (in float64,
  then float32). Scoring a batch is then one matrix-vector product.
Input is the L2-normalised CLIP image embedding: LAION trained on normalised embeddings, and
raw ones give scores of 20-30.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np

LAYER_KEY = re.compile(r"layers\.(\d+)\.(weight|bias)")


@dataclass(frozen=True)
class AestheticHead:
    weight: np.ndarray  # float32 [dim]
    bias: float
    kind: str  # "linear" (v1) or "mlp" (v2, folded)

    @property
    def dim(self) -> int:
        return int(self.weight.shape[0])

    def score(self, embeddings: np.ndarray) -> np.ndarray:
        """Scores of row embeddings (normalised here, in float32)."""
        rows = np.asarray(embeddings, np.float32)
        rows = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
        return rows @ self.weight + np.float32(self.bias)


def read_state(path: str) -> dict[str, np.ndarray]:
    """A state dict from .safetensors or a torch file (.pth/.pt/.bin), as float64 arrays."""
    path = os.path.expanduser(path)
    if path.endswith(".safetensors"):
        from safetensors.numpy import load_file

        state = load_file(path)
    else:
        import torch

        state = torch.load(path, map_location="cpu", weights_only=True)
        if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
            state = state["state_dict"]
        if not isinstance(state, dict):
            raise ValueError(f"{type(state).__name__}, not a state dict")
        state = {k: v.detach().cpu().double().numpy() for k, v in state.items()}
    return {k.removeprefix("module."): np.asarray(v, np.float64) for k, v in state.items()}


def fold(state: dict[str, np.ndarray]) -> AestheticHead:
    """One affine map from a v1 or v2 state dict; ValueError naming what is wrong."""
    if set(state) == {"weight", "bias"}:
        weight, bias, kind = state["weight"], state["bias"], "linear"
    else:
        layers: dict[int, dict[str, np.ndarray]] = {}
        for key, value in state.items():
            match = LAYER_KEY.fullmatch(key)
            if match is None:
                raise ValueError(f"unexpected key {key!r} (LAION heads: weight/bias or layers.N.*)")
            layers.setdefault(int(match.group(1)), {})[match.group(2)] = value
        if not layers or any(set(p) != {"weight", "bias"} for p in layers.values()):
            raise ValueError("every layers.N needs a weight and a bias")
        weight, bias, kind = None, None, "mlp"
        for index in sorted(layers):
            w, b = layers[index]["weight"], layers[index]["bias"]
            if weight is not None and w.shape[1] != weight.shape[0]:
                raise ValueError(f"layers.{index}: {w.shape[1]} inputs, given {weight.shape[0]}")
            weight = w if weight is None else w @ weight
            bias = b if bias is None else w @ bias + b
    if weight.ndim != 2 or weight.shape[0] != 1 or np.size(bias) != 1:
        raise ValueError(f"the head maps to {weight.shape[:1]} outputs, not one score")
    return AestheticHead(weight[0].astype(np.float32), float(np.ravel(bias)[0]), kind)


def load_head(path: str) -> AestheticHead:
    """The head in a local file; ValueError with a one-line reason when it cannot be used."""
    if not os.path.isfile(os.path.expanduser(path)):
        raise ValueError(f"weights file not found: {path}")
    import pickle

    from safetensors import SafetensorError

    try:
        state = read_state(path)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError, SafetensorError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"cannot read {path}: {first}") from None
    return fold(state)

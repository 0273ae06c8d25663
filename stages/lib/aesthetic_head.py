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

Files as users hand them in load: bf16 and fp16 tensors (converted), a checkpoint holding one
nested state dict (`{"model": {...}, "epoch": 3}`: unwrapped, other values set aside). Any
other content is one ValueError line that says what the file is not (never a hint to turn off
torch's `weights_only`), and so is a head whose weights or scores are NaN or inf: it would
keep every sample with a null score.
"""

from __future__ import annotations

import os
import re
import warnings
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


TORCH_ZIP, PICKLE = b"PK\x03\x04", b"\x80"  # how a torch.save file starts (zip; legacy)
WRAPPERS = ("state_dict", "model", "model_state_dict", "module", "net", "ema")


def read_state(path: str) -> dict[str, np.ndarray]:
    """A state dict from .safetensors or a torch file (.pth/.pt/.bin), as float64 arrays
    (bf16 and half converted); ValueError saying what the file is not."""
    path = os.path.expanduser(path)
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file  # torch's reader: numpy has no bfloat16

        state: object = load_file(path)
    else:
        state = read_torch(path)
    return tensors_of(state)


def read_torch(path: str) -> object:
    """What torch.load finds in a file of tensors. weights_only stays on: a file that needs it
    off is not a weights file, and is said to be so (never a hint to turn the check off)."""
    import pickle

    import torch

    with open(path, "rb") as f:
        magic = f.read(4)
    if not magic.startswith(PICKLE) and magic != TORCH_ZIP:
        raise ValueError("not a PyTorch weights file (neither torch.save's zip nor a pickle)")
    try:
        with warnings.catch_warnings():  # torch warns of pickle protocols it may not read
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(err))
        if found:
            raise ValueError(
                f"not a state dict of tensors: it holds a Python object ({found.group(1)}); "
                "save the head's state_dict() instead"
            ) from None
        detail = re.search(r"WeightsUnpickler error: \s*(.+)", str(err))
        why = f": {detail.group(1).strip()}" if detail else ""
        raise ValueError(f"not a PyTorch weights file (a pickle torch cannot read{why})") from None


def tensors_of(state: object) -> dict[str, np.ndarray]:
    """The head's tensors: a checkpoint holding one nested state dict (`{"model": {...}}`,
    `{"state_dict": ...}`) is unwrapped; other values (`epoch: 3`) are set aside."""
    import torch

    if not isinstance(state, dict):
        raise ValueError(f"holds a {type(state).__name__}, not a state dict")
    tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    nested = {k: v for k, v in state.items() if isinstance(v, dict) and v}
    if not tensors and nested:
        if len(nested) > 1:
            named = [k for k in WRAPPERS if k in nested]
            if not named:
                keys = ", ".join(map(str, nested))
                raise ValueError(f"holds several nested dicts ({keys}), not one state dict")
            nested = {named[0]: nested[named[0]]}
        return tensors_of(next(iter(nested.values())))
    for key, value in state.items():
        if key not in tensors and str(key).rsplit(".", 1)[-1] in ("weight", "bias"):
            raise ValueError(f"{key!r} is a {type(value).__name__}, not a tensor")
    if not tensors:
        raise ValueError("holds no tensors")
    return {
        str(k).removeprefix("module."): v.detach().cpu().double().numpy()
        for k, v in tensors.items()
    }


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
    head = AestheticHead(weight[0].astype(np.float32), float(np.ravel(bias)[0]), kind)
    check_finite(head)
    return head


def check_finite(head: AestheticHead) -> None:
    """ValueError for a head that is NaN or inf, or yields a non-finite score: every sample
    would be kept with `aesthetic_score: null` and no word. Probed with the unit vectors that
    score highest and lowest (±w/|w|), each axis and the mean direction."""
    if not (np.isfinite(head.weight).all() and np.isfinite(head.bias)):
        raise ValueError("the head's weights hold NaN or inf")
    dim = head.dim
    weight = head.weight.astype(np.float64)
    norm = float(np.linalg.norm(weight))
    extremes = weight / norm if norm > 0 else np.zeros(dim)
    probe = np.vstack([extremes, -extremes, np.eye(dim), np.ones(dim), -np.ones(dim)])
    with np.errstate(over="ignore", invalid="ignore"):
        scores = head.score(probe)
    if not np.isfinite(scores).all():
        raise ValueError("the head yields non-finite scores (its weights overflow float32)")


def load_head(path: str) -> AestheticHead:
    """The head in a local file; ValueError with a one-line reason when it cannot be used."""
    if not os.path.isfile(os.path.expanduser(path)):
        raise ValueError(f"weights file not found: {path}")
    from safetensors import SafetensorError

    try:
        state = read_state(path)
    except (OSError, RuntimeError, EOFError, SafetensorError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"cannot read {path}: {first}") from None
    except ValueError as err:  # what the file is not, from read_state
        raise ValueError(f"{path}: {err}") from None
    return fold(state)

"""open_clip models for the model stages (clip_score, semantic_dedupe): load, prepare, encode.

Work is split so that the expensive part can live elsewhere: `prepare` (in the Ray task, on
CPU) decodes each image and applies the model's own geometric transform (resize, crop, RGB)
to a uint8 array; `encode` (in the task, or in a GPU actor) normalizes and runs the model,
returning L2-normalized float32 embeddings. Only uint8 pixels cross to an actor.

`pretrained` may be an open_clip tag (`laion2b_s34b_b79k`), a local open_clip checkpoint file,
an mmcurate training checkpoint (`runs/x/checkpoints/step-100.pt`, or the run folder `runs/x/`:
its newest checkpoint, as `mmcurate eval` reads it), or None: random weights,
seeded, so every worker holds the same model. `hf-hub:org/name` model names work as in open_clip.
"""

from __future__ import annotations

import logging
import os
import pickle
import re
from functools import lru_cache
from typing import Any

import numpy as np
from mmcurate.core.config_io import ConfigError
from mmcurate.core.formats import CHECKPOINT_FORMAT
from mmcurate.stages.lib.pixels import DECODE_ERRORS, failure_reason, open_image, to_rgb, upright


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def load_open_clip(name: str, pretrained: str | None, device: str) -> tuple[Any, Any, Any]:
    """(model in eval mode, eval transform, tokenizer); raises ConfigError in one line."""
    import open_clip
    import torch
    from mmcurate.core.model_configs import check_local_dir, register

    register()  # mmcurate-tiny

    if name not in open_clip.list_models() and not name.startswith(("hf-hub:", "local-dir:")):
        raise ConfigError(f"unknown open_clip model {name!r}")
    try:
        check_local_dir(name)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if name.startswith(("hf-hub:", "local-dir:")) and not looks_like_path(pretrained):
        pretrained = None  # the folder or repo holds the weights; a tag means nothing there
    state, source = None, pretrained
    if looks_like_path(pretrained):
        state = local_weights(newest_checkpoint(pretrained))
        pretrained = None if state is not None else pretrained
    logging.disable(logging.ERROR)  # open_clip logs its errors too; ours is the one line
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)  # without weights, every worker must draw the same random ones
            model, _, preprocess = open_clip.create_model_and_transforms(
                name, pretrained=pretrained, device="cpu"
            )
        if state is not None:
            if "logit_bias" not in model.state_dict():  # SigLIP's bias: unused by a cosine
                state = {k: v for k, v in state.items() if k != "logit_bias"}
            model.load_state_dict(state)
    except (RuntimeError, OSError, ValueError, KeyError, pickle.UnpicklingError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"cannot load {name!r} with pretrained {source!r}: {first}") from None
    finally:
        logging.disable(logging.NOTSET)
    return model.to(device).eval(), preprocess, open_clip.get_tokenizer(name)


def looks_like_path(pretrained: str | None) -> bool:
    if not pretrained:
        return False
    return os.path.sep in pretrained or pretrained.endswith((".pt", ".pth", ".bin", ".safetensors"))


def newest_checkpoint(path: str) -> str:
    """`path` itself, or for a folder (an `mmcurate train` run) its newest (highest step)
    `checkpoints/step-N.pt`: ConfigError when it holds none."""
    folder = os.path.expanduser(path)
    if not os.path.isdir(folder):
        return path
    checkpoints = os.path.join(folder, "checkpoints")
    names = os.listdir(checkpoints) if os.path.isdir(checkpoints) else []
    steps = [(int(m.group(1)), n) for n in names if (m := re.fullmatch(r"step-(\d+)\.pt", n))]
    if not steps:
        raise ConfigError(f"pretrained: {path} holds no checkpoints/step-N.pt")
    return os.path.join(checkpoints, max(steps)[1])


def local_weights(path: str) -> dict | None:
    """An mmcurate training checkpoint's model weights; None for any other file (open_clip
    loads it: its own checkpoints, .safetensors). Read with `weights_only`: a pickle that needs
    more (code run as it loads) is never executed here."""
    import torch

    if not os.path.isfile(os.path.expanduser(path)):
        raise ConfigError(f"pretrained checkpoint not found: {path}")
    try:
        checkpoint = torch.load(os.path.expanduser(path), map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError):
        return None  # not a torch pickle of plain values: not one of our checkpoints
    if isinstance(checkpoint, dict) and checkpoint.get("format") == CHECKPOINT_FORMAT:
        return checkpoint["model"]
    return None


def split_transform(preprocess: Any) -> tuple[Any, np.ndarray, np.ndarray]:
    """The PIL part of an open_clip eval transform (before its to-tensor step), and its
    normalization mean and std."""
    from torchvision import transforms as T

    steps = list(preprocess.transforms)
    cut = next(i for i, s in enumerate(steps) if "ToTensor" in type(s).__name__)
    normalize = next(s for s in steps[cut:] if isinstance(s, T.Normalize))
    return T.Compose(steps[:cut]), np.array(normalize.mean), np.array(normalize.std)


class ClipModel:
    """One loaded model: `prepare` images on CPU, `encode` them (and captions) on its device."""

    def __init__(
        self, name: str, pretrained: str | None, device: str = "auto", precision: str = "auto"
    ) -> None:
        import torch

        self.device = resolve_device(device)
        self.model, preprocess, self.tokenizer = load_open_clip(name, pretrained, self.device)
        self.pil_transform, mean, std = split_transform(preprocess)
        size = self.model.visual.image_size
        self.input_side = max(size) if isinstance(size, tuple | list) else int(size)
        self.mean = torch.tensor(mean, dtype=torch.float32, device=self.device).view(1, 3, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32, device=self.device).view(1, 3, 1, 1)
        self.precision = precision

    def prepare(self, images: list[bytes]) -> tuple[list[np.ndarray | None], list[str | None]]:
        return prepare_images(images, self.pil_transform, self.input_side)

    def encode(
        self, pixels: np.ndarray, texts: list[str] | None = None
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """uint8 [B, H, W, 3] (and B captions) -> normalized float32 image (and text) embeddings."""
        import torch

        with torch.inference_mode(), self.autocast():
            image = np.zeros((0, 0), np.float32)  # no pixels: texts alone (concept prompts)
            if len(pixels):
                batch = torch.from_numpy(pixels).to(self.device).permute(0, 3, 1, 2).float()
                batch = (batch / 255.0 - self.mean) / self.std
                encoded = self.model.encode_image(batch).float()
                image = torch.nn.functional.normalize(encoded, dim=-1).cpu().numpy()
            text = None
            if texts is not None:
                tokens = self.tokenizer(texts).to(self.device)
                text = torch.nn.functional.normalize(self.model.encode_text(tokens).float(), dim=-1)
        return image, None if text is None else text.cpu().numpy()

    def autocast(self) -> Any:
        import contextlib

        import torch

        if self.device != "cuda" or self.precision == "fp32":
            return contextlib.nullcontext()
        dtype = torch.float16 if self.precision == "fp16" else torch.bfloat16
        return torch.autocast("cuda", dtype=dtype)


def prepare_images(
    images: list[bytes], pil_transform: Any, side: int
) -> tuple[list[np.ndarray | None], list[str | None]]:
    """Decode and transform each image to uint8 HWC; None and the drop reason when it fails
    (`too_many_pixels` from the header alone, as decode_image, else `decode_error`).
    JPEGs decode in draft mode at the smallest scale still >= `side` (the model's input)."""
    pixels: list[np.ndarray | None] = []
    reasons: list[str | None] = []
    for data in images:
        try:
            with open_image(data) as image:  # bytes, or a spilled file by its path
                image.draft("RGB", (side, side))
                picture = to_rgb(upright(image))
                pixels.append(np.asarray(pil_transform(picture), np.uint8))
            reasons.append(None)
        except DECODE_ERRORS as err:
            pixels.append(None)
            reasons.append(failure_reason(err))
    return pixels, reasons


@lru_cache(maxsize=2)
def cached_model(name: str, pretrained: str | None, device: str, precision: str) -> ClipModel:
    """One model per worker process and configuration."""
    return ClipModel(name, pretrained, device, precision)


def check_model(name: str, pretrained: str | None, where: str) -> None:
    """Load the model once on CPU (then free it): a bad name, tag or file fails the build
    before any data is read, in one line."""
    try:
        load_open_clip(name, pretrained, "cpu")
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None

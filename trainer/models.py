"""open_clip models by name; registers mmcurate's own tiny configs on import.

`mmcurate-tiny` (core/model_configs/mmcurate-tiny.json) trains on a CPU in seconds and needs no
download: open_clip's default SimpleTokenizer ships its BPE vocabulary inside the wheel.
Multilingual models with a Hugging Face text tower and tokenizer load from a local folder as
open_clip's `local-dir:/path` names (docs/configuration.md): open_clip reads the tokenizer
files from that folder and the text model from `text_cfg.hf_model_name`, with no hub access;
tests/stages/test_multilingual.py trains one.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import pickle
import posixpath
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import open_clip
import torch
from mmcurate.core.config_io import ConfigError
from mmcurate.core.model_configs import check_local_dir
from mmcurate.core.model_configs import register as register_model_configs
from mmcurate.core.storage import absolute, filesystem, is_local, storage_errors
from mmcurate.trainer.checkpoint import (
    checkpoint_step,
    is_train_checkpoint,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from mmcurate.trainer.config import ModelConfig

register_model_configs()  # mmcurate-tiny


def known_model(name: str) -> bool:
    """True for a registered architecture or a schema-prefixed name (hf-hub:, local-dir:)."""
    return name in open_clip.list_models() or name.startswith(("hf-hub:", "local-dir:"))


def check_model_name(name: str) -> None:
    """A model open_clip knows; a `local-dir:` folder whose text tower is local too (nothing is
    fetched from a hub). Raises ConfigError on one line."""
    if not known_model(name):
        raise ConfigError(f"model.name: unknown open_clip model {name!r}")
    try:
        check_local_dir(name)
    except ValueError as err:
        raise ConfigError(f"model.name: {err}") from None


def build_model(
    cfg: ModelConfig, device: torch.device
) -> tuple[torch.nn.Module, Callable[[Any], torch.Tensor], Callable[..., torch.Tensor]]:
    """Model on `device` in fp32, the training image transform, and the text tokenizer."""
    check_model_name(cfg.name)
    extra = {}
    if cfg.loss == "siglip":  # SigLIP's learned bias and temperature, at the paper's init
        extra = {"init_logit_bias": -10.0, "init_logit_scale": math.log(10)}
    try:
        model, preprocess_train, _ = open_clip.create_model_and_transforms(
            cfg.name, pretrained=cfg.pretrained, device=device, output_dict=True, **extra
        )
    except LOAD_ERRORS as err:
        if cfg.pretrained is None:
            raise
        raise load_error(cfg.pretrained, cfg.name, err) from None
    tokenizer = open_clip.get_tokenizer(cfg.name)
    return model, preprocess_train, tokenizer


@dataclass(frozen=True)
class Weights:
    """Where a model's weights come from: none (random init), an open_clip pretrained tag,
    or a file (an `mmcurate train` checkpoint or a plain open_clip .pt; local or a URL)."""

    kind: Literal["none", "tag", "file"]
    source: str | None = None


def resolve_weights(
    name: str, pretrained: str | None, storage_options: dict[str, Any] | None = None
) -> Weights:
    """Check `model.pretrained` without loading anything: a file, a run folder (its newest
    checkpoint), or a tag open_clip knows for `name`. Raises ConfigError on one line."""
    check_model_name(name)
    if pretrained is None:
        return Weights("none")
    fs, path = filesystem(pretrained, storage_options)
    try:
        if fs.isfile(path):
            return Weights("file", absolute(pretrained))
        if fs.isdir(path):
            newest = latest_checkpoint(absolute(pretrained), storage_options)
            if newest is None:
                raise ConfigError(f"model.pretrained: {pretrained} holds no checkpoints/step-N.pt")
            return Weights("file", newest)
    # Why broad: each storage backend raises its own error types (botocore, aiohttp, OSError).
    except Exception as err:  # noqa: BLE001
        if isinstance(err, ConfigError):
            raise
        raise ConfigError(f"model.pretrained: cannot read {pretrained}: {err}") from None
    if ":" not in name and pretrained in open_clip.list_pretrained_tags_by_model(name):
        return Weights("tag", pretrained)
    raise ConfigError(
        f"model.pretrained: {pretrained!r} is not a file, a run folder or a pretrained tag "
        f"of {name}"
    )


def load_eval_model(
    name: str, weights: Weights, device: torch.device, storage_options: dict | None = None
) -> tuple[torch.nn.Module, Callable[[Any], torch.Tensor], Callable[..., torch.Tensor], dict]:
    """(model in eval mode on `device`, the eval image transform, the tokenizer, what was
    loaded: {"kind": none|tag|mmcurate-checkpoint|open_clip-file, "step"?}). Weights that do
    not load raise ConfigError (one line)."""
    try:
        state = read_state(weights, storage_options)
        if is_train_checkpoint(state):
            model, preprocess = from_train_checkpoint(name, weights.source, state)
            info = {"kind": "mmcurate-checkpoint", "step": state.get("step")}
        elif weights.kind == "file":
            # A plain open_clip file: open_clip's own loader (state_dict key, module. prefixes).
            with no_random_init_warning():
                model, _, preprocess = open_clip.create_model_and_transforms(name)
            with local_file(weights.source, storage_options) as path:
                open_clip.load_checkpoint(model, path)
            info = {"kind": "open_clip-file"}
        else:
            tag = weights.source
            model, _, preprocess = open_clip.create_model_and_transforms(name, pretrained=tag)
            info = {"kind": weights.kind}
    except ConfigError:
        raise
    except LOAD_ERRORS as err:
        raise load_error(weights.source, name, err) from None
    return model.to(device).eval(), preprocess, open_clip.get_tokenizer(name), info


# Why these: what torch.load and load_state_dict raise for a file that is not these weights
# (IsADirectoryError, an OSError: a run folder given to open_clip's loader).
LOAD_ERRORS = (
    *(RuntimeError, ValueError, KeyError, EOFError, OSError, pickle.UnpicklingError),
    AssertionError,  # open_clip's resize_pos_embed: another architecture's embedding width
)


def load_error(source: str | None, name: str, err: Exception) -> ConfigError:
    """One line for weights that do not load as model `name`."""
    first = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return ConfigError(
        f"model.pretrained: {source} does not load as {name}: {type(err).__name__}: {first}"
    )


def read_state(weights: Weights, storage_options: dict | None) -> Any:
    """The loaded file when torch reads it as plain data (our checkpoints are), else None:
    open_clip's loader then gets its turn (TorchScript archives, ...)."""
    if weights.kind != "file":
        return None
    try:
        return load_checkpoint(weights.source, storage_options)
    except (RuntimeError, EOFError, pickle.UnpicklingError):
        return None


def from_train_checkpoint(
    name: str, source: str, state: dict[str, Any]
) -> tuple[torch.nn.Module, Callable[[Any], torch.Tensor]]:
    trained = state.get("config", {}).get("model", {}).get("name", name)
    if trained != name:
        raise ConfigError(f"model.name: {name!r}, but {source} trained {trained!r}")
    # SigLIP's learned bias (loss: siglip) needs the parameter to load into.
    extra = {"init_logit_bias": -10.0} if "logit_bias" in state["model"] else {}
    with no_random_init_warning():
        model, _, preprocess = open_clip.create_model_and_transforms(name, **extra)
    model.load_state_dict(state["model"])
    return model, preprocess


@contextlib.contextmanager
def local_file(url: str, storage_options: dict | None) -> Iterator[str]:
    """A local path for open_clip's loader (which reads only local files); a remote file is
    downloaded to a temporary folder, removed afterwards."""
    fs, path = filesystem(url, storage_options)
    if is_local(fs):
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="mmcurate-weights-") as folder:
        target = str(Path(folder) / posixpath.basename(path))
        fs.get_file(path, target)
        yield target


def open_clip_state_dict(state: dict[str, torch.Tensor], name: str) -> dict[str, torch.Tensor]:
    """A model state dict that `open_clip.create_model_and_transforms(name, pretrained=PATH)`
    loads strictly: SigLIP's learned bias is left out when `name`'s own config has none (a
    model trained with `loss: siglip` on a CLIP architecture). The same tensors, not copies."""
    config = open_clip.get_model_config(name) if ":" not in name else None
    keep_bias = config is None or config.get("init_logit_bias") is not None
    return {k: v for k, v in state.items() if keep_bias or k != "logit_bias"}


@contextlib.contextmanager
def no_random_init_warning() -> Iterator[None]:
    """Hide open_clip's "initialized randomly" warning for a model whose weights we load next."""

    def keep(record: logging.LogRecord) -> bool:
        return "initialized randomly" not in record.getMessage()

    root = logging.getLogger()
    root.addFilter(keep)
    try:
        yield
    finally:
        root.removeFilter(keep)


def export_open_clip(
    checkpoint: str, out: str, storage_options: dict | None = None
) -> dict[str, Any]:
    """Write an `mmcurate train` checkpoint's weights as a file plain open_clip loads with
    `create_model_and_transforms(name, pretrained=out)`: {"state_dict": ..., "mmcurate":
    {"name", "step", "source"}}, plus "logit_bias" when SigLIP's bias had to be left out."""
    check_export_target(checkpoint, out, storage_options)
    try:
        state = load_checkpoint(checkpoint, storage_options)
    except (*LOAD_ERRORS, *storage_errors()) as err:
        raise ConfigError(f"--export: cannot read {checkpoint}: {first_line(err)}") from None
    if not is_train_checkpoint(state):
        raise ConfigError(f"--export: {checkpoint} is not an `mmcurate train` checkpoint")
    name = state.get("config", {}).get("model", {}).get("name", "")
    weights = open_clip_state_dict(state["model"], name)
    doc: dict[str, Any] = {
        "state_dict": weights,
        "mmcurate": {"name": name, "step": state.get("step"), "source": checkpoint},
    }
    if "logit_bias" in state["model"] and "logit_bias" not in weights:
        doc["logit_bias"] = state["model"]["logit_bias"]
    try:
        save_checkpoint(out, doc, storage_options)
    except (RuntimeError, *storage_errors()) as err:  # torch.save's failed writes: RuntimeError
        raise ConfigError(f"--export: cannot write {out}: {first_line(err)}") from None
    return {"exported": out, "name": name, "step": state.get("step")}


def check_export_target(checkpoint: str, out: str, storage_options: dict | None) -> None:
    """ConfigError when the export would replace a training checkpoint: OUT is the
    CHECKPOINT itself (through links too), or a `checkpoints/step-N.pt` that a resume or a
    run folder given to eval would take for one."""
    fs_in, path_in = filesystem(checkpoint, storage_options)
    fs_out, path_out = filesystem(out, storage_options)
    if is_local(fs_out):
        path_out = os.path.realpath(path_out)
    if is_local(fs_in) and is_local(fs_out):
        same = os.path.realpath(path_in) == path_out
        with contextlib.suppress(OSError):  # hard links
            same = same or os.path.samefile(path_in, path_out)
    else:
        same = fs_in.protocol == fs_out.protocol and path_in.rstrip("/") == path_out.rstrip("/")
    if same:
        raise ConfigError(f"--export: OUT {out} is the checkpoint itself; write it elsewhere")
    if is_step_file(path_out):
        raise ConfigError(
            f"--export: OUT {out} is where `mmcurate train` keeps a run's checkpoints "
            "(a resume would load it as one); write it elsewhere"
        )


def is_step_file(path: str) -> bool:
    """A `checkpoints/step-N.pt` path: what `latest_checkpoint` picks a run's newest from."""
    try:
        checkpoint_step(path)
    except ValueError:
        return False
    return posixpath.basename(posixpath.dirname(path)) == "checkpoints"


def first_line(err: BaseException) -> str:
    """`Type: the message's first line`, for one-line errors."""
    if isinstance(err, pickle.UnpicklingError):  # torch's own text is pages of advice
        return "UnpicklingError: it holds more than tensors and plain values (no train checkpoint)"
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__

"""The recaption model folder, checked at config time without loading the weights (a real
model is many GB), so a folder that cannot caption fails the build in one line before any
shard is read, not in every task.

What is checked: config.json is there and names an image-to-text model (BLIP-2, or one
`AutoModelForImageTextToText` loads: a CLIP or GPT-2 folder is named as what it is); the
model class builds on the meta device; the processor has an image processor and a tokenizer
with a vocabulary; and the weights file transformers would load, in its own order
(model.safetensors, model.safetensors.index.json, pytorch_model.bin,
pytorch_model.bin.index.json, or config's `transformers_weights`), read only as far as
its structure: a safetensors header (a git-lfs pointer, a header length past the file, a
malformed or truncated header), every shard an index names, a .bin's zip directory and
pickle (tensors memory-mapped, never read).
"""

from __future__ import annotations

import json
import os
import pickle
import struct
import zipfile
from collections.abc import Callable
from typing import Any

from mmcurate.core.config_io import ConfigError

LOAD_ERRORS = (OSError, ValueError, KeyError, TypeError, RuntimeError, AttributeError)
HEADER_MAX = 100_000_000  # safetensors' own cap on a header
LFS_POINTER = b"version https://git-lfs"
# torch.save's legacy (pre-zip) format starts with this pickled magic number (protocol 2)
LEGACY_TORCH_MAGIC = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19."
TORCH_LOAD_ERRORS = (
    pickle.UnpicklingError,
    EOFError,
    RuntimeError,
    ValueError,
    OSError,
    KeyError,
    zipfile.BadZipFile,
)


def model_class(folder: str) -> Any:
    """BLIP-2's own class for a blip-2 folder, else the auto class for image-to-text models;
    ValueError naming what the folder holds when it is neither (a CLIP, a GPT-2)."""
    import transformers
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    if config.model_type == "blip-2":
        return transformers.Blip2ForConditionalGeneration
    auto = getattr(transformers, "AutoModelForImageTextToText", None)
    auto = auto or transformers.AutoModelForVision2Seq
    if type(config) not in auto._model_mapping:
        kind = " or ".join(getattr(config, "architectures", None) or []) or "a model"
        raise ValueError(
            f"it holds {kind} (model_type {config.model_type!r}), not an image-to-text "
            f"model: recaption needs BLIP-2 or a model {auto.__name__} loads"
        )
    return auto


def check_captioner(folder: str) -> None:
    """ConfigError in one line unless `folder` holds a captioner that will load."""
    import torch
    from transformers import AutoConfig

    path = os.path.expanduser(folder)
    if not os.path.isdir(path):
        raise ConfigError(f"captioning model folder not found: {folder}")
    try:
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise ValueError("no config.json in the folder (not a Hugging Face model folder)")
        cls = model_class(path)
        config = AutoConfig.from_pretrained(path, local_files_only=True)
        with torch.device("meta"):  # the architecture, no memory for weights
            if hasattr(cls, "from_config"):  # an auto class
                cls.from_config(config)
            else:
                cls._from_config(config)
        check_processor(path)
        check_weight_files(path, getattr(config, "transformers_weights", None))
    except LOAD_ERRORS as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"cannot load captioning model from {folder}: {first}") from None


def check_processor(path: str) -> None:
    """An image processor for the pixels and a tokenizer with a vocabulary for the captions
    (without tokenizer files transformers makes an empty one that decodes every caption to
    nothing)."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(path, local_files_only=True)
    if getattr(processor, "image_processor", None) is None:
        raise ValueError("its processor has no image processor")
    tokenizer = getattr(processor, "tokenizer", None)
    if tokenizer is None or not tokenizer.vocab_size:
        raise ValueError("its tokenizer has no vocabulary (tokenizer files missing)")


def check_weight_files(path: str, explicit: str | None = None) -> None:
    """The weights file transformers loads from this folder, in its order, checked."""
    names = [explicit] if explicit else []
    names += [
        "model.safetensors",
        "model.safetensors.index.json",
        "pytorch_model.bin",
        "pytorch_model.bin.index.json",
    ]
    for name in names:
        if os.path.isfile(os.path.join(path, name)):
            check_weights(path, name)
            return
    if explicit:
        raise ValueError(f"config.json names weights {explicit}, which is missing")
    raise ValueError(
        "no weights (model.safetensors, pytorch_model.bin or their .index.json) in the folder"
    )


def check_weights(path: str, name: str) -> None:
    """One weights file by its format; an index by every shard it names."""
    if name.endswith(".index.json"):
        check_index(path, name, checker_for(name[: -len(".index.json")]))
    else:
        checker_for(name)(os.path.join(path, name), name)


def checker_for(name: str) -> Callable[[str, str], None]:
    if name.endswith(".safetensors"):
        return check_safetensors
    if name.endswith(".bin"):
        return check_torch_file
    raise ValueError(f"weights {name}: not a .safetensors or .bin file")


def check_index(path: str, name: str, check: Callable[[str, str], None]) -> None:
    """A sharded checkpoint: the index's weight_map, and every shard it names."""
    try:
        with open(os.path.join(path, name), "rb") as f:
            index = json.loads(f.read(HEADER_MAX + 1))
    except ValueError:
        raise ValueError(f"{name} is not a JSON index") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"{name} has no weight_map")
    if not isinstance(index.get("metadata"), dict):  # transformers reads it too
        raise ValueError(f"{name} has no metadata")
    for shard in sorted({str(v) for v in weight_map.values()}):
        file = os.path.join(path, shard)
        if os.path.dirname(os.path.normpath(shard)) or not os.path.isfile(file):
            raise ValueError(f"{name} names {shard}, which is not in the folder")
        check(file, shard)


def check_safetensors(file: str, name: str) -> None:
    """The header read with its length checked first (a git-lfs pointer or a header of
    0xff bytes names a length past the file), then its tensors' byte ranges, then
    safetensors' own open (memory-mapped; nothing of the data is read)."""
    size = os.path.getsize(file)
    with open(file, "rb") as f:
        head = f.read(8)
        if head.startswith(LFS_POINTER[:8]) and f.read(100).startswith(LFS_POINTER[8:]):
            raise ValueError(f"{name} is a git-lfs pointer, not the weights (run git lfs pull)")
        if len(head) < 8:
            raise ValueError(f"{name} is truncated")
        (length,) = struct.unpack("<Q", head)
        if length > min(size - 8, HEADER_MAX):
            raise ValueError(f"{name} is not a safetensors file (header length {length})")
        header = safetensors_header(f.read(length), name)
    ends = [span[1] for span in header.values()]
    if size < 8 + length + max(ends, default=0):
        raise ValueError(f"{name} is truncated")
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(file, framework="pt") as opened:
            opened.keys()
    except SafetensorError as err:
        raise ValueError(f"{name} is not a valid safetensors file ({err})") from None


def safetensors_header(raw: bytes, name: str) -> dict[str, tuple[int, int]]:
    """Tensor name -> (start, end) of its bytes; ValueError if the header is malformed."""
    try:
        header = json.loads(raw)
        spans = {
            key: (int(v["data_offsets"][0]), int(v["data_offsets"][1]))
            for key, v in header.items()
            if key != "__metadata__"
        }
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        raise ValueError(f"{name} has a malformed safetensors header") from None
    if not spans:
        raise ValueError(f"{name} holds no tensors")
    return spans


def check_torch_file(file: str, name: str) -> None:
    """A torch.save zip: its directory and pickle, loaded as transformers does (weights only)
    with the tensors memory-mapped; the legacy format by its magic number alone."""
    import torch

    if not zipfile.is_zipfile(file):
        with open(file, "rb") as f:
            if f.read(len(LEGACY_TORCH_MAGIC)) == LEGACY_TORCH_MAGIC:
                return  # pre-2020 format: reading more means reading it all
        raise ValueError(f"{name} is not a PyTorch checkpoint (neither torch.save format)")
    try:
        state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except TORCH_LOAD_ERRORS as err:
        why = str(err).strip().splitlines()[0][:160] if str(err).strip() else ""
        if isinstance(err, pickle.UnpicklingError) or not why:  # its text advises
            why = type(err).__name__  # weights_only=False: never for a file like this
        raise ValueError(f"{name} is not a readable PyTorch checkpoint ({why})") from None
    tensors = isinstance(state, dict) and any(torch.is_tensor(v) for v in state.values())
    if not tensors:
        raise ValueError(f"{name} holds no state dict of tensors")

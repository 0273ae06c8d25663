"""Image-to-text models from a local Hugging Face folder, for the recaption stage.

BLIP-2 (`Blip2ForConditionalGeneration`) first; any other folder whose config an
`AutoModelForImageTextToText` (older transformers: `AutoModelForVision2Seq`) loads, with an
`AutoProcessor` taking `images=` and `text=`, works the same way. Work is split like
clip_model: `prepare_pixels` (in the task, CPU) decodes and resizes to uint8 with the folder's
own image processor; `Captioner.caption` (in the task or a GPU actor) rescales, normalizes and
generates, so only uint8 pixels cross to an actor.

Sampling is seeded per row: `KeyedSampler` draws each row's next token with its own
generator (seeded from the sample's key), so a caption does not depend on which other samples
share its batch, and a rerun writes the same captions.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from mmcurate.core.config_io import ConfigError
from mmcurate.stages.lib.captioner_check import LOAD_ERRORS, model_class
from mmcurate.stages.lib.captioner_check import check_captioner as check_captioner  # its old home
from mmcurate.stages.lib.pixels import DECODE_ERRORS, open_image, to_rgb, upright
from PIL import Image


@dataclass(frozen=True)
class Generation:
    """How captions are generated (hashable: it keys the per-worker model cache)."""

    max_new_tokens: int = 30
    num_captions: int = 1
    sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    prompt: str | None = None
    seed: int = 0


def caption_seed(seed: int, key: str, index: int) -> int:
    """A sample's own seed for its `index`-th caption: the same on every machine and run."""
    digest = hashlib.sha256(f"{seed}/{key}/{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def model_dtype(device: str, precision: str) -> Any:
    """bf16 (or fp16 if asked) on GPU; fp32 on CPU always (half precision is slow there)."""
    import torch

    if device != "cuda" or precision == "fp32":
        return torch.float32
    return torch.float16 if precision == "fp16" else torch.bfloat16


def load_captioner(folder: str, device: str, precision: str) -> tuple[Any, Any]:
    """(model in eval mode on `device`, processor); ConfigError in one line if the folder is
    not a loadable image-to-text model."""
    from transformers import AutoProcessor
    from transformers.utils import logging as hf_logging

    path = os.path.expanduser(folder)
    if not os.path.isdir(path):
        raise ConfigError(f"captioning model folder not found: {folder}")
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its warnings and progress bars; ours is the one line
    hf_logging.disable_progress_bar()
    try:
        cls = model_class(path)
        model = cls.from_pretrained(
            path, dtype=model_dtype(device, precision), local_files_only=True
        )
        processor = AutoProcessor.from_pretrained(path, local_files_only=True)
        if getattr(processor, "image_processor", None) is None:
            raise ValueError("its processor has no image processor")
    except LOAD_ERRORS as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"cannot load captioning model from {folder}: {first}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    return model.to(device).eval(), processor


@lru_cache(maxsize=2)
def image_processor(folder: str) -> Any:
    """The folder's image processor alone (no weights): what a task needs to prepare pixels."""
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(
        os.path.expanduser(folder), local_files_only=True
    ).image_processor


def prepare_pixels(
    images: list[bytes], processor: Any
) -> tuple[list[np.ndarray | None], list[str | None]]:
    """Decode each image and resize them as the model's processor does, to uint8 HWC; None and
    `decode_error` where decoding fails (rescale and normalize happen beside the model)."""
    pictures: list[Image.Image | None] = []
    for data in images:
        try:
            with open_image(data) as image:  # over decode_image's pixel limit: refused unread
                picture = to_rgb(upright(image))
                picture.load()  # all decoding here, inside the error handling
                pictures.append(picture)
        except DECODE_ERRORS:
            pictures.append(None)
    good = [p for p in pictures if p is not None]
    resized = iter(  # one call for the batch: the processor's own cost is per call
        processor(good, do_rescale=False, do_normalize=False, return_tensors="np")["pixel_values"]
        if good
        else []
    )
    pixels = [
        None
        if p is None
        else np.ascontiguousarray(next(resized).transpose(1, 2, 0)).astype(np.uint8)
        for p in pictures
    ]
    return pixels, [None if p is not None else "decode_error" for p in pixels]


class KeyedSampler:
    """A logits processor that samples each row with its own seeded generator and leaves only
    the drawn token (generate's own sampling then takes it, whatever its global RNG)."""

    def __init__(self, seeds: list[int], gen: Generation) -> None:
        self.seeds = seeds
        self.gen = gen
        self.generators: list[Any] = []

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        if not self.generators:
            self.generators = [
                torch.Generator(device=scores.device).manual_seed(s) for s in self.seeds
            ]
        probs = torch.softmax(self.warped(scores.float()), dim=-1)
        drawn = torch.stack(
            [
                torch.multinomial(row, 1, generator=g)
                for row, g in zip(probs, self.generators, strict=True)
            ]
        )
        chosen = torch.full_like(scores, float("-inf"))
        return chosen.scatter_(1, drawn, 0.0)

    def warped(self, scores: Any) -> Any:
        import torch

        gen = self.gen
        scores = scores / max(gen.temperature, 1e-6)
        if gen.top_k:
            kth = torch.topk(scores, min(gen.top_k, scores.shape[-1]), dim=-1).values[:, -1:]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if gen.top_p is not None and gen.top_p < 1.0:
            ordered, order = torch.sort(scores, descending=True, dim=-1)
            mass = torch.softmax(ordered, dim=-1).cumsum(dim=-1)
            cut = (mass - torch.softmax(ordered, dim=-1)) > gen.top_p  # keeps the first always
            scores = scores.masked_fill(cut.scatter(1, order, cut), float("-inf"))
        return scores


class Captioner:
    """One loaded image-to-text model: `caption` uint8 pixels (from `prepare_pixels`)."""

    def __init__(self, folder: str, device: str = "auto", precision: str = "auto") -> None:
        from mmcurate.stages.lib.clip_model import resolve_device

        self.device = resolve_device(device)
        self.model, self.processor = load_captioner(folder, self.device, precision)
        self.dtype = model_dtype(self.device, precision)

    def inputs(self, pixels: list[np.ndarray], prompt: str | None) -> dict:
        """The processor's tensors for these pixels (already resized) and the prompt."""
        text = {"text": [prompt] * len(pixels)} if prompt else {}
        encoded = self.processor(images=pixels, do_resize=False, return_tensors="pt", **text)
        tensors = {name: value.to(self.device) for name, value in encoded.items()}
        tensors["pixel_values"] = tensors["pixel_values"].to(self.dtype)
        return tensors

    def caption(
        self, pixels: list[np.ndarray], gen: Generation, seeds: list[int] | None = None
    ) -> list[list[str]]:
        """`gen.num_captions` captions per image; sampled rows use `seeds` (one per image and
        caption, image-major), greedy ignores them."""
        import torch

        inputs = self.inputs(pixels, gen.prompt)
        options: dict[str, Any] = {"max_new_tokens": gen.max_new_tokens, "do_sample": False}
        if gen.sample:
            options.update(
                do_sample=True,
                num_return_sequences=gen.num_captions,
                logits_processor=[KeyedSampler(list(seeds or []), gen)],
            )
        with torch.inference_mode():
            tokens = self.model.generate(**inputs, **options)
        texts = self.decode(tokens, inputs.get("input_ids"), gen)
        per = gen.num_captions if gen.sample else 1
        return [texts[i * per : (i + 1) * per] for i in range(len(pixels))]

    def decode(self, tokens: Any, prompt_ids: Any, gen: Generation) -> list[str]:
        """New text only: a decoder-only model returns the prompt's tokens ahead of its own
        (cut off as tokens; all that follows is the model's, even words the prompt holds),
        and a model that writes the prompt out again as text has that leading echo cut."""
        echoed = True
        if prompt_ids is not None and tokens.shape[1] >= prompt_ids.shape[1]:
            width = prompt_ids.shape[1]
            rows = prompt_ids.repeat_interleave(tokens.shape[0] // prompt_ids.shape[0], dim=0)
            if bool((tokens[:, :width] == rows).all()):
                tokens, echoed = tokens[:, width:], False
        texts = self.processor.batch_decode(tokens, skip_special_tokens=True)
        return [strip_prompt(text, gen.prompt if echoed else None) for text in texts]


def strip_prompt(text: str, prompt: str | None) -> str:
    """The caption with spacing normalized and without the prompt's words at its start (whole
    words, any case); the same words later in the caption, or as part of a longer word
    ("a photo" before "a photograph"), are the model's and stay."""
    words = text.split()
    echo = [w.lower() for w in (prompt or "").split()]
    if echo and [w.lower() for w in words[: len(echo)]] == echo:
        words = words[len(echo) :]
    return " ".join(words)


class RecaptionModel:
    """What a recaption actor (or task) holds: the captioner, and the CLIP that scores the
    candidates when a clip_score stage is configured (`clip`: model, pretrained, precision)."""

    def __init__(self, device: str, folder: str, precision: str, clip: tuple | None = None) -> None:
        from mmcurate.stages.lib.clip_model import cached_model

        self.captioner = Captioner(folder, device, precision)
        self.clip = None
        if clip is not None:
            name, pretrained, clip_precision = clip
            self.clip = cached_model(name, pretrained, self.captioner.device, clip_precision)

    def caption(
        self, pixels: list[np.ndarray], gen: Generation, seeds: list[int] | None = None
    ) -> list[list[str]]:
        return self.captioner.caption(pixels, gen, seeds)

    def texts(self, texts: list[str]) -> np.ndarray:
        """L2-normalized CLIP text embeddings (float32)."""
        if self.clip is None:
            raise ValueError("no clip model configured")
        _, embeddings = self.clip.encode(np.zeros((0, 1, 1, 3), np.uint8), texts)
        return embeddings


@lru_cache(maxsize=2)
def cached_recaption_model(
    device: str, folder: str, precision: str, clip: tuple | None
) -> RecaptionModel:
    """One per worker process and configuration (a task's local model)."""
    return RecaptionModel(device, folder, precision, clip)

"""The curation bench's captioner: a tiny BLIP-2 trained here on the seed build (issue 39).

The recaption arm needs a captioner that can name what the generator draws. No published
model knows these shapes-on-backgrounds scenes, and nothing may be downloaded, so this module
builds a small `Blip2ForConditionalGeneration` from `Blip2Config` (as tests/tiny_blip2.py
does), with a word-level tokenizer whose vocabulary is the seed set's caption words, trains it
with teacher forcing on the seed build's shards (the same clean pairs the filter model is
trained on), and saves model and processor with `save_pretrained`: a folder the recaption stage
loads exactly as it would a user's. It is a toy upper bound of sorts: the captioner learned the
generator's own phrasing from the generator's own clean data.

    .venv/bin/python bench/curation_captioner.py SEED_BUILD OUT_FOLDER [--steps N]
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>", "<image>"]
NUM_QUERY_TOKENS = 8
IMAGE_SIDE = 64  # the builds' decode_image size: the processor's resize is then a no-op
WIDTH = 96
PATCH = 8


def read_build(build: Path) -> tuple[list[bytes], list[str]]:
    """(jpg bytes, caption) of every sample in a build's shards."""
    manifest = json.loads((build / "manifest.json").read_text())
    images: dict[str, bytes] = {}
    texts: dict[str, str] = {}
    for shard in manifest["shards"]:
        with tarfile.open(build / shard["name"]) as tar:
            for member in tar.getmembers():
                key, _, ext = member.name.partition(".")
                data = tar.extractfile(member).read()
                if ext == "jpg":
                    images[key] = data
                elif ext == "txt":
                    texts[key] = data.decode().strip()
    keys = sorted(k for k in images if k in texts)
    return [images[k] for k in keys], [texts[k] for k in keys]


def tokenizer_for(captions: list[str]) -> Any:
    """A word-level tokenizer (split on whitespace only, so decoding restores the caption's
    punctuation exactly) over the words of `captions`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = sorted({w for c in captions for w in c.split()})
    vocab = {token: i for i, token in enumerate([*SPECIALS, *words])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 1), ("</s>", 2)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        additional_special_tokens=["<image>"],
    )


def blip2_config(vocab_size: int, image_token: int) -> Any:
    """Small vision, Q-Former and OPT configs: trains on a CPU in minutes."""
    from transformers import Blip2Config

    common = dict(hidden_size=WIDTH, intermediate_size=2 * WIDTH, num_attention_heads=4)
    vision = dict(common, num_hidden_layers=3, image_size=IMAGE_SIDE, patch_size=PATCH)
    qformer = dict(common, num_hidden_layers=2, encoder_hidden_size=WIDTH, vocab_size=vocab_size)
    text = dict(
        model_type="opt",
        hidden_size=WIDTH,
        ffn_dim=2 * WIDTH,
        num_hidden_layers=2,
        num_attention_heads=4,
        vocab_size=vocab_size,
        max_position_embeddings=64,
        word_embed_proj_dim=WIDTH,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return Blip2Config(
        vision_config=vision,
        qformer_config=qformer,
        text_config=text,
        num_query_tokens=NUM_QUERY_TOKENS,
        image_token_index=image_token,
    )


def make_model(captions: list[str], seed: int) -> tuple[Any, Any]:
    """(untrained model, processor) for these captions' vocabulary."""
    import torch
    from transformers import Blip2ForConditionalGeneration, Blip2Processor, BlipImageProcessor

    tokenizer = tokenizer_for(captions)
    torch.manual_seed(seed)
    config = blip2_config(len(tokenizer), tokenizer.convert_tokens_to_ids("<image>"))
    model = Blip2ForConditionalGeneration(config)
    for name, value in (("eos_token_id", 2), ("pad_token_id", 0), ("bos_token_id", 1)):
        setattr(model.generation_config, name, value)
    processor = Blip2Processor(
        BlipImageProcessor(size={"height": IMAGE_SIDE, "width": IMAGE_SIDE}),
        tokenizer,
        num_query_tokens=NUM_QUERY_TOKENS,
    )
    return model, processor


def encode(processor: Any, images: list[bytes], captions: list[str]) -> dict:
    """Pixel and token tensors of the whole set, and labels: the caption tokens (image and
    padding positions -100, so only the caption and its end token are learned)."""
    pictures = [Image.open(io.BytesIO(b)).convert("RGB") for b in images]
    batch = processor(images=pictures, text=captions, padding=True, return_tensors="pt")
    labels = batch["input_ids"].clone()
    image_token = processor.tokenizer.convert_tokens_to_ids("<image>")
    labels[(labels == image_token) | (labels == processor.tokenizer.pad_token_id)] = -100
    return {**batch, "labels": labels}


def train(model: Any, data: dict, steps: int, batch: int, seed: int) -> list[float]:
    """AdamW with a linear warm-up and cosine decay; the loss every 50 steps."""
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    warm = max(steps // 20, 1)
    curve = lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + np.cos(np.pi * s / steps))  # noqa: E731
    sched = torch.optim.lr_scheduler.LambdaLR(opt, curve)
    gen = torch.Generator().manual_seed(seed)
    n, losses = len(data["labels"]), []
    model.train()
    for step in range(steps):
        rows = torch.randint(0, n, (batch,), generator=gen)
        loss = model(**{k: v[rows] for k, v in data.items()}).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == steps - 1:
            losses.append(round(loss.item(), 4))
    return losses


def train_captioner(build: Path, out: Path, steps: int = 1500, batch: int = 64, seed: int = 0):
    """Train on `build`'s pairs, save model and processor into `out`; a summary dict."""
    import torch

    torch.set_num_threads(1)  # one core: the machine's other core runs the other work
    started = time.monotonic()
    images, captions = read_build(build)
    model, processor = make_model(captions, seed)
    losses = train(model, encode(processor, images, captions), steps, batch, seed)
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    seconds = round(time.monotonic() - started, 1)
    return {
        "pairs": len(captions),
        "steps": steps,
        "batch": batch,
        "losses": losses,
        "vocab": len(processor.tokenizer),
        "seconds": seconds,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("build", type=Path, help="a build folder (manifest.json and shards)")
    parser.add_argument("out", type=Path, help="where the model folder goes")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args(argv)
    summary = train_captioner(args.build, args.out, args.steps, args.batch)
    (args.out / "training.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary), file=sys.stdout)


if __name__ == "__main__":
    main()

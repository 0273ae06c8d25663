"""CPU micro-bench: the recaption stage's captions per second against a plain batched
transformers loop (processor, generate, batch_decode) on the same model and images (400-900 px
JPEG photos, bench/photos.py), in the same process, batch by batch in turns
(bench/interleave.py: the order swaps every batch, so both see the same moments of a shared
CPU), at each torch thread count; captions per second (wall) and per CPU-second (this
process's CPU time). Both decode the JPEG bytes; both are greedy; the share of captions the two
agree on is printed as a check that they do the same work.

    .venv/bin/python bench/recaption.py [--images 64] [--batch 16] [--tokens 20] [--rounds 2]
        [--size tiny|small] [--threads 1 2]

`tiny` is the test model (tests/tiny_blip2.py: overheads dominate, the strictest check of the
stage's own cost); `small` widens it (vision 6x256, OPT 4x256) so the model's work shows.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def save_model(folder: Path, size: str) -> Path:
    from tests import tiny_blip2

    if size == "small":
        original = tiny_blip2.tiny_blip2_config

        def wider(vocab: int, image: int):  # same tokenizer and processor, a bigger model
            config = original(vocab, image)
            for part, layers in ((config.vision_config, 6), (config.text_config, 4)):
                part.num_hidden_layers = layers
            config.vision_config.hidden_size = config.vision_config.intermediate_size = 256
            config.vision_config.num_attention_heads = 4
            config.qformer_config.encoder_hidden_size = 256
            text = config.text_config
            text.hidden_size = text.word_embed_proj_dim = text.ffn_dim = 256
            text.num_attention_heads = 4
            return config

        tiny_blip2.tiny_blip2_config = wider
    return tiny_blip2.save_tiny_blip2(folder)


def photos(folder: Path, n: int) -> dict:
    """The stage's input columns for n 400-900 px JPEG photos (bench/photos.py), in memory."""
    from mmcurate.stages.base import DROP, DROP_STAGE
    from photos import make_photos

    make_photos(folder, n, seed=5)
    files = sorted(folder.glob("*.jpg"))
    return {
        "__key__": [f.stem for f in files],
        "jpg": [f.read_bytes() for f in files],
        "txt": [f.with_suffix(".txt").read_text() for f in files],
        "json": [None] * len(files),
        DROP: [None] * len(files),
        DROP_STAGE: [None] * len(files),
    }


def plain_loop(model, processor, images: list[bytes], batch: int, tokens: int) -> list[str]:
    import torch
    from PIL import Image

    captions = []
    for at in range(0, len(images), batch):
        pictures = [Image.open(io.BytesIO(b)).convert("RGB") for b in images[at : at + batch]]
        inputs = processor(images=pictures, return_tensors="pt")
        with torch.inference_mode():
            out = model.generate(**inputs, max_new_tokens=tokens, do_sample=False)
        texts = processor.batch_decode(out, skip_special_tokens=True)
        captions += [" ".join(t.split()) for t in texts]  # the stage's spacing
    return captions


def measure(args, folder: Path, data: dict, threads: int) -> dict:
    import torch
    from interleave import interleaved, summary
    from mmcurate.stages.registry import build_stage
    from transformers import AutoProcessor, Blip2ForConditionalGeneration

    torch.set_num_threads(threads)
    model = Blip2ForConditionalGeneration.from_pretrained(folder).eval()
    processor = AutoProcessor.from_pretrained(folder)
    spec = {"name": "recaption", "model": str(folder), "choose": "synthetic"}
    spec.update(batch_size=args.batch, max_new_tokens=args.tokens, device="cpu")
    stage = build_stage(spec)
    n = len(data["__key__"])
    chunks = [
        {k: v[at : at + args.batch] for k, v in data.items()} for at in range(0, n, args.batch)
    ]
    loops = {
        "plain": lambda c: plain_loop(model, processor, c["jpg"], args.batch, args.tokens),
        "stage": lambda c: stage({k: list(v) for k, v in c.items()})["txt"],
    }
    interleaved(1, chunks[:1], loops)  # warm both: model loads, first calls
    wall, cpu, out = interleaved(args.rounds, chunks, loops)
    plain = [c for batch in out["plain"] for c in batch]
    ours = [c for batch in out["stage"] for c in batch]
    result = {"size": args.size, "images": n, "batch_size": args.batch, "threads": threads}
    result["max_new_tokens"] = args.tokens
    result |= summary(args.rounds * n, wall, cpu, "captions")
    result["same_captions"] = round(sum(a == b for a, b in zip(plain, ours, strict=True)) / n, 3)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--size", choices=("tiny", "small"), default="tiny")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    print(json.dumps({"machine": machine}))
    with tempfile.TemporaryDirectory() as tmp:
        folder = save_model(Path(tmp) / "model", args.size)
        data = photos(Path(tmp) / "photos", args.images)
        for threads in args.threads:
            print(json.dumps(measure(args, folder, data, threads)), flush=True)


if __name__ == "__main__":
    main()

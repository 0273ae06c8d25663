"""GPU check part `caption` (issue 39): BLIP-2 OPT-2.7B-size captioning, the recaption stage's
path against a plain transformers generate loop: images/s per batch size, GPU utilisation.

Model: `Blip2Config` at Salesforce/blip2-opt-2.7b's sizes (EVA ViT-g vision 1408 x 39, Q-Former
768 x 12 with 32 queries, OPT-2.7B 2560 x 32, vocab 50304), random weights made on the device
in bf16 (or fp16), with a word-level tokenizer of the same vocab size built here as
tests/tiny_blip2.py does (nothing is downloaded); saved into a folder and loaded from it by
both loops, as a user's model folder would be. The saved generation config sets
`min_new_tokens = max_new_tokens`, so every caption is exactly `--tokens` tokens long in both
loops (random weights would otherwise stop at an early end-of-text by chance).
- plain: a torch DataLoader whose workers decode (PIL) and run the processor, then
  `generate` (greedy) and `batch_decode`: the loop a user writes.
- stage: the stage's own parts as a build runs them: `prepare_pixels` (decode + the folder's
  resize, to uint8) in a process pool running ahead of the GPU (the partition tasks), then
  `Captioner.caption` (rescale, normalise, generate, decode: what the pool's actor runs).
Per batch size, rounds alternate (plain, stage, stage, plain); the best of each is reported,
with its mean NVML utilisation (None without nvidia-ml-py or a GPU), captions per hour, and
the share of captions the two loops agree on.

    python3 bench/gpu_caption.py [--shards DIR] [--batches 8 32 128] [--tokens 30]
    .venv/bin/python bench/gpu_caption.py --device cpu --tiny     # the same code, tiny sizes
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
import time
from multiprocessing import get_context
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from gpu_util import Utilisation, photo_rows  # noqa: E402
from mmcurate.stages.lib.captioner import Captioner, Generation, image_processor, prepare_pixels  # noqa: E402
from PIL import Image  # noqa: E402

VISION = dict(  # EVA ViT-g/14, as in blip2-opt-2.7b's config.json
    hidden_size=1408,
    intermediate_size=6144,
    num_hidden_layers=39,
    num_attention_heads=16,
    image_size=224,
    patch_size=14,
)
QFORMER = dict(
    hidden_size=768,
    intermediate_size=3072,
    num_hidden_layers=12,
    num_attention_heads=12,
    encoder_hidden_size=1408,
    vocab_size=30522,
)
OPT_2_7B = dict(
    model_type="opt",
    hidden_size=2560,
    ffn_dim=10240,
    num_hidden_layers=32,
    num_attention_heads=32,
    vocab_size=50304,
    max_position_embeddings=2048,
    word_embed_proj_dim=2560,
    bos_token_id=1,  # the ids of the tokenizer built here: <pad> 0, <s> 1, </s> 2
    eos_token_id=2,
    pad_token_id=0,
)
IMAGE_TOKEN = 50265  # where blip2-opt-2.7b's processor puts <image>


def full_tokenizer():  # -> PreTrainedTokenizerFast
    """A word-level tokenizer with OPT-2.7B's vocab size: the test's words, then fillers."""
    from tests.tiny_blip2 import SPECIALS, WORDS, word_tokenizer

    names = [s for s in SPECIALS if s != "<image>"] + WORDS
    names += [f"w{i}" for i in range(IMAGE_TOKEN - len(names))]
    names += ["<image>"] + [f"x{i}" for i in range(OPT_2_7B["vocab_size"] - IMAGE_TOKEN - 1)]
    return word_tokenizer(names)


def save_full(folder: Path, device: str, dtype: torch.dtype) -> Path:
    """The OPT-2.7B-size BLIP-2 with random weights (made on `device`), saved with its
    processor into `folder`."""
    from transformers import (
        Blip2Config,
        Blip2ForConditionalGeneration,
        Blip2Processor,
        BlipImageProcessor,
    )

    config = Blip2Config(
        vision_config=VISION,
        qformer_config=QFORMER,
        text_config=OPT_2_7B,
        num_query_tokens=32,
        image_token_index=IMAGE_TOKEN,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = Blip2ForConditionalGeneration._from_config(config, dtype=dtype).eval()
    model.generation_config.update(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model.save_pretrained(folder)
    del model
    processor = Blip2Processor(
        BlipImageProcessor(size={"height": VISION["image_size"], "width": VISION["image_size"]}),
        full_tokenizer(),
        num_query_tokens=32,
    )
    processor.save_pretrained(folder)
    return folder


def fixed_length(folder: Path, tokens: int) -> None:
    """Every caption exactly `tokens` long, in both loops (the folder's generation config)."""
    from transformers import GenerationConfig

    config = GenerationConfig.from_pretrained(folder)
    config.min_new_tokens = tokens
    config.save_pretrained(folder)


class PlainDataset(torch.utils.data.Dataset):
    def __init__(self, rows: list) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> Image.Image:
        return Image.open(io.BytesIO(self.rows[i][0])).convert("RGB")


class Collate:
    """The processor over a batch of PIL images, in the loader's workers."""

    def __init__(self, processor: object) -> None:
        self.processor = processor

    def __call__(self, pictures: list) -> dict:
        return dict(self.processor(images=pictures, return_tensors="pt"))


def plain_loop(rows: list, parts: tuple, batch: int, args) -> tuple[float, float | None, list]:
    model, processor = parts
    loader = torch.utils.data.DataLoader(
        PlainDataset(rows),
        batch_size=batch,
        num_workers=args.workers,
        collate_fn=Collate(processor),
    )
    captions: list[str] = []
    started = time.perf_counter()
    with Utilisation() as util, torch.inference_mode():
        for inputs in loader:
            inputs = {k: v.to(args.device) for k, v in inputs.items()}
            inputs["pixel_values"] = inputs["pixel_values"].to(model.dtype)
            out = model.generate(**inputs, max_new_tokens=args.tokens, do_sample=False)
            captions += [
                " ".join(c.split()) for c in processor.batch_decode(out, skip_special_tokens=True)
            ]
    return len(rows) / (time.perf_counter() - started), util.mean, captions


_PROCESSOR: list = []


def _init(folder: str) -> None:
    torch.set_num_threads(1)  # as DataLoader workers do: a forked OpenMP pool would hang
    _PROCESSOR[:] = [image_processor(folder)]


def _prepare(chunk: list[bytes]) -> list:
    return prepare_pixels(chunk, _PROCESSOR[0])[0]


def stage_loop(rows: list, parts: tuple, batch: int, args) -> tuple[float, float | None, list]:
    captioner, folder = parts
    gen = Generation(max_new_tokens=args.tokens)
    chunks = [[d for d, _ in rows[i : i + batch]] for i in range(0, len(rows), batch)]
    captions: list[str] = []
    started = time.perf_counter()
    with get_context("fork").Pool(args.workers, _init, (folder,)) as pool, Utilisation() as util:
        for pixels in pool.imap(_prepare, chunks):
            captions += [c[0] for c in captioner.caption(pixels, gen)]
    return len(rows) / (time.perf_counter() - started), util.mean, captions


def measure(rows: list, batch: int, args, loops: dict) -> dict:
    rows = rows[: batch * args.per_batch]
    for fn, parts in loops.values():
        fn(rows[:batch], parts, batch, args)  # warm: workers, kernels
    best: dict[str, tuple] = {}
    for r in range(args.rounds):
        for name in ("plain", "stage") if r % 2 == 0 else ("stage", "plain"):
            fn, parts = loops[name]
            result = fn(rows, parts, batch, args)
            if name not in best or result[0] > best[name][0]:
                best[name] = result
    (plain, plain_util, a), (ours, ours_util, b) = best["plain"], best["stage"]
    return {
        "batch": batch,
        "images": len(rows),
        "plain_img_s": round(plain, 2),
        "stage_img_s": round(ours, 2),
        "ratio": round(ours / plain, 3),
        "plain_gpu_util_pct": plain_util,
        "stage_gpu_util_pct": ours_util,
        "stage_captions_per_hour": round(ours * 3600),
        "same_captions": round(sum(x == y for x, y in zip(a, b, strict=True)) / len(a), 3),
    }


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shards", type=Path, help="gpu_check.sh's shards (else new photos)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--precision", choices=("bf16", "fp16"), default="bf16")
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--per-batch", type=int, default=4, help="batches per timed run")
    parser.add_argument("--tokens", type=int, default=30)
    parser.add_argument("--workers", type=int, default=14)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tiny", action="store_true", help="tests/tiny_blip2.py's model")
    args = parser.parse_args()
    if args.tiny:
        args.batches, args.workers, args.tokens = [4, 16], 2, 12
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here (use --device cpu --tiny)")
    return args


def loaded(folder: Path, args) -> dict:
    """Both loops' models, each loaded from the folder as its user would load it."""
    from transformers import AutoProcessor, Blip2ForConditionalGeneration

    precision = "fp32" if args.device == "cpu" else args.precision
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    model = Blip2ForConditionalGeneration.from_pretrained(folder, dtype=dtype)
    model = model.to(args.device).eval()
    plain = (model, AutoProcessor.from_pretrained(folder))
    stage = (Captioner(str(folder), args.device, precision), str(folder))
    return {"plain": (plain_loop, plain), "stage": (stage_loop, stage)}


def main() -> None:
    args = arguments()
    from tests.tiny_blip2 import save_tiny_blip2

    precision = "fp32" if args.device == "cpu" else args.precision
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    with tempfile.TemporaryDirectory(prefix="gpu-caption-") as tmp:
        need = max(args.batches) * args.per_batch
        rows = photo_rows(args.shards, need, Path(tmp) / "photos")
        rows = (rows * (need // len(rows) + 1))[:need]  # repeated if the shards hold fewer
        started = time.perf_counter()
        folder = Path(tmp) / "model"
        save_tiny_blip2(folder) if args.tiny else save_full(folder, args.device, dtype)
        fixed_length(folder, args.tokens)
        made = time.perf_counter() - started
        loops = loaded(folder, args)
        head = {"part": "caption", "precision": precision, "tokens": args.tokens}
        head["device"] = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
        head["params"] = sum(p.numel() for p in loops["plain"][1][0].parameters())
        head["model_made_and_saved_s"] = round(made, 1)
        print(json.dumps(head), flush=True)
        for batch in args.batches:
            print(json.dumps(measure(rows, batch, args, loops)), flush=True)


if __name__ == "__main__":
    main()

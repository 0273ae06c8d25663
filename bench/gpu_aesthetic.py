"""GPU check part `aesthetic` (issue 38): LAION aesthetic scoring on ViT-L/14, the
aesthetic_score stage's path against a plain open_clip + head loop, images/s and GPU use.

Model: open_clip's own ViT-L-14 config with random weights of the real size (the device has no
network; throughput does not depend on the weights), bf16 (or fp16) autocast on cuda. Head:
LAION's v2 MLP (768-1024-128-64-16-1), random weights saved as .pth. Photos: the shards
gpu_check.sh writes (400-900 px JPEGs), or new ones.
- plain: the loop a user writes around LAION's predictor: a torch DataLoader (workers: PIL
  decode + the model's preprocess), `encode_image` under autocast, L2-normalise, the MLP on
  the GPU.
- stage: the stage's own parts as a build runs them: `prepare_images` (draft-mode decode + the
  model's geometric transform to uint8) in a process pool running ahead of the GPU (the
  partition tasks), `ClipModel.encode` on the GPU (the actor), the head the stage loads
  (`load_head`: folded to one dot product) on the embeddings (the task).
Rounds alternate (plain, stage, stage, plain); the best of each is reported, with the mean
NVML utilisation over that run (None without nvidia-ml-py or a GPU) and how far the two
loops' scores are apart (bf16 and draft decoding move them a little).

    python3 bench/gpu_aesthetic.py [--shards DIR] [--batch 256] [--workers 14] [--rounds 2]
    .venv/bin/python bench/gpu_aesthetic.py --device cpu --tiny     # the same code, tiny sizes
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

import numpy as np  # noqa: E402
import torch  # noqa: E402
from aesthetic import plain_model, save_head  # noqa: E402
from gpu_util import Utilisation, photo_rows  # noqa: E402
from mmcurate.stages.lib.aesthetic_head import load_head  # noqa: E402
from mmcurate.stages.lib.clip_model import ClipModel, prepare_images  # noqa: E402
from PIL import Image  # noqa: E402


class PlainDataset(torch.utils.data.Dataset):
    def __init__(self, rows: list, preprocess: object) -> None:
        self.rows, self.preprocess = rows, preprocess

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.preprocess(Image.open(io.BytesIO(self.rows[i][0])).convert("RGB"))


def autocast(device: str, precision: str):
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    return (
        torch.autocast("cuda", dtype) if device == "cuda" else torch.autocast("cpu", enabled=False)
    )


def plain_loop(rows: list, parts: tuple, args) -> tuple[float, float | None, np.ndarray]:
    model, preprocess, head = parts
    loader = torch.utils.data.DataLoader(
        PlainDataset(rows, preprocess),
        batch_size=args.batch,
        num_workers=args.workers,
        pin_memory=args.device == "cuda",
    )
    scores = []
    started = time.perf_counter()
    with Utilisation() as util, torch.inference_mode(), autocast(args.device, args.precision):
        for images in loader:
            image = model.encode_image(images.to(args.device, non_blocking=True))
            image = torch.nn.functional.normalize(image.float(), dim=-1)
            scores.append(head(image).float().squeeze(-1).cpu())
    seconds = time.perf_counter() - started
    return len(rows) / seconds, util.mean, torch.cat(scores).numpy()


_TRANSFORM: tuple = ()


def _init(transform: object, side: int) -> None:
    global _TRANSFORM
    torch.set_num_threads(1)  # as DataLoader workers do: a forked OpenMP pool would hang
    _TRANSFORM = (transform, side)


def _prepare(chunk: list[bytes]) -> np.ndarray:
    pixels, _ = prepare_images(chunk, *_TRANSFORM)
    return np.stack(pixels)


def stage_loop(rows: list, parts: tuple, args) -> tuple[float, float | None, np.ndarray]:
    model, head = parts
    chunks = [[d for d, _ in rows[i : i + args.batch]] for i in range(0, len(rows), args.batch)]
    scores = []
    started = time.perf_counter()
    pool = get_context("fork").Pool(args.workers, _init, (model.pil_transform, model.input_side))
    with pool, Utilisation() as util:
        for pixels in pool.imap(_prepare, chunks):
            image, _ = model.encode(pixels, None)
            scores.append(head.score(image))
    seconds = time.perf_counter() - started
    return len(rows) / seconds, util.mean, np.concatenate(scores)


def models(args, weights: Path) -> tuple[tuple, tuple]:
    """(plain parts, stage parts): the same random weights in both (mmcurate's seed)."""
    model, preprocess = plain_model(args.model)
    torch_head = save_head(int(model.visual.output_dim), weights)
    plain = (model.to(args.device).eval(), preprocess, torch_head.to(args.device))
    stage = (ClipModel(args.model, None, args.device, args.precision), load_head(str(weights)))
    return plain, stage


def measure(rows: list, args, plain: tuple, stage: tuple) -> dict:
    loops = {"plain": (plain_loop, plain), "stage": (stage_loop, stage)}
    for fn, parts in loops.values():
        fn(rows[: args.batch * 2], parts, args)  # warm: workers, kernels, autotune
    best: dict[str, tuple] = {}
    for r in range(args.rounds):
        for name in ("plain", "stage") if r % 2 == 0 else ("stage", "plain"):
            fn, parts = loops[name]
            result = fn(rows, parts, args)
            if name not in best or result[0] > best[name][0]:
                best[name] = result
    diff = np.abs(best["plain"][2] - best["stage"][2])
    return {
        "plain_img_s": round(best["plain"][0], 1),
        "stage_img_s": round(best["stage"][0], 1),
        "ratio": round(best["stage"][0] / best["plain"][0], 3),
        "plain_gpu_util_pct": best["plain"][1],
        "stage_gpu_util_pct": best["stage"][1],
        "score_max_abs_diff": round(float(diff.max()), 4),
        "score_corr": round(float(np.corrcoef(best["plain"][2], best["stage"][2])[0, 1]), 5),
    }


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shards", type=Path, help="gpu_check.sh's shards (else new photos)")
    parser.add_argument("--photos", type=int, default=4096)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--precision", choices=("bf16", "fp16"), default="bf16")
    parser.add_argument("--model", default="ViT-L-14")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--workers", type=int, default=14)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tiny", action="store_true", help="mmcurate-tiny, 48 photos, 2 workers")
    args = parser.parse_args()
    if args.tiny:
        args.model, args.photos, args.batch, args.workers = "mmcurate-tiny", 48, 16, 2
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here (use --device cpu --tiny)")
    return args


def main() -> None:
    args = arguments()
    with tempfile.TemporaryDirectory(prefix="gpu-aesthetic-") as tmp:
        rows = photo_rows(args.shards, args.photos, Path(tmp) / "photos")
        plain, stage = models(args, Path(tmp) / "head.pth")
        where = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
        head = f"LAION v2 MLP {stage[1].dim}-1024-128-64-16-1 (random, {stage[1].kind})"
        print(json.dumps({"part": "aesthetic", "device": where, "model": args.model, "head": head}))
        result = measure(rows, args, plain, stage)
    result |= {"images": len(rows), "batch": args.batch, "workers": args.workers}
    result["precision"] = args.precision if args.device == "cuda" else "fp32"
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

"""GPU check (one H200): CLIP scoring throughput from shards, decode included, vs a plain loop.

For ViT-B-32 and ViT-L-14 (random weights: the device has no network, and throughput does not
depend on the weights), over the same WebDataset shards of 400-900 px JPEG photos:
- plain: the loop a user writes: a torch DataLoader (workers decode + the model's preprocess),
  the model on the GPU under bf16 autocast, image and text encoders, cosine.
- mmcurate: the clip_score stage's own parts: `prepare` (draft-mode decode + the model's
  geometric transform to uint8) in a process pool, `ClipModel.encode` (normalize on the GPU,
  bf16 autocast) on the GPU, with the pool running ahead of the GPU.
GPU utilisation is sampled with NVML every 0.1 s. Prints one table.

    python3 bench/gpu_check.py --shards DIR [--batch 256] [--workers 14]
"""

from __future__ import annotations

import argparse
import io
import json
import threading
import time
from multiprocessing import Pool
from pathlib import Path

import numpy as np
import torch
from mmcurate.core.tario import iter_tar_samples
from mmcurate.stages.lib.clip_model import ClipModel, prepare_images
from PIL import Image


def samples(folder: Path) -> list[tuple[bytes, str]]:
    rows = []
    for tar in sorted(folder.glob("*.tar")):
        with open(tar, "rb") as f:
            for sample in iter_tar_samples(f):
                rows.append((sample["jpg"], sample["txt"].decode()))
    return rows


class Utilisation:
    def __init__(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        self.nvml, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        self.readings: list[int] = []
        self.stop = threading.Event()

    def __enter__(self) -> Utilisation:
        def watch() -> None:
            while not self.stop.wait(0.1):
                rates = self.nvml.nvmlDeviceGetUtilizationRates(self.handle)
                self.readings.append(rates.gpu)

        self.thread = threading.Thread(target=watch, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    @property
    def mean(self) -> float:
        return float(np.mean(self.readings)) if self.readings else 0.0


class PlainDataset(torch.utils.data.Dataset):
    def __init__(self, rows: list, preprocess: object) -> None:
        self.rows, self.preprocess = rows, preprocess

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> tuple:
        data, caption = self.rows[i]
        return self.preprocess(Image.open(io.BytesIO(data)).convert("RGB")), caption


def plain_loop(rows: list, name: str, batch: int, workers: int) -> tuple[float, float]:
    import open_clip

    model, _, preprocess = open_clip.create_model_and_transforms(name, pretrained=None)
    model = model.cuda().eval()
    tokenizer = open_clip.get_tokenizer(name)
    loader = torch.utils.data.DataLoader(
        PlainDataset(rows, preprocess), batch_size=batch, num_workers=workers, pin_memory=True
    )
    started = time.perf_counter()
    with Utilisation() as util, torch.inference_mode(), torch.autocast("cuda", torch.bfloat16):
        for images, captions in loader:
            image = model.encode_image(images.cuda(non_blocking=True))
            text = model.encode_text(tokenizer(list(captions)).cuda())
            image = torch.nn.functional.normalize(image.float(), dim=-1)
            text = torch.nn.functional.normalize(text.float(), dim=-1)
            (image * text).sum(-1).cpu()
    return len(rows) / (time.perf_counter() - started), util.mean


_TRANSFORM: tuple = ()


def _init(transform: object, side: int) -> None:
    global _TRANSFORM
    _TRANSFORM = (transform, side)


def _prepare(chunk: list[tuple[bytes, str]]) -> tuple[np.ndarray, list[str]]:
    pixels, _ = prepare_images([d for d, _ in chunk], *_TRANSFORM)
    return np.stack(pixels), [c for _, c in chunk]


def mmcurate_loop(rows: list, name: str, batch: int, workers: int) -> tuple[float, float]:
    model = ClipModel(name, None, "cuda", "bf16")
    chunks = [rows[i : i + batch] for i in range(0, len(rows), batch)]
    started = time.perf_counter()
    with (
        Pool(workers, _init, (model.pil_transform, model.input_side)) as pool,
        Utilisation() as util,
    ):
        for pixels, captions in pool.imap(_prepare, chunks):
            image, text = model.encode(pixels, captions)
            (image * text).sum(-1)
    return len(rows) / (time.perf_counter() - started), util.mean


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shards", type=Path, required=True)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--workers", type=int, default=14)
    args = parser.parse_args()
    rows = samples(args.shards)
    print(json.dumps({"gpu": torch.cuda.get_device_name(0), "images": len(rows)}))
    print(f"{'model':10} {'loop':9} {'img/s':>8} {'GPU util %':>10}")
    for name in ("ViT-B-32", "ViT-L-14"):
        for label, loop in (("plain", plain_loop), ("mmcurate", mmcurate_loop)):
            rate, util = loop(rows, name, args.batch, args.workers)
            print(f"{name:10} {label:9} {rate:8.0f} {util:10.0f}", flush=True)


if __name__ == "__main__":
    main()

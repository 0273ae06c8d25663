"""mmcurate's own loader under the same contract as the competitor runners (common.py):
ShardDataset + DataLoader + the device step (uint8 -> normalized float), so each batch it
hands over is the same (float [B, 3, 224, 224], tokens [B, 77]) pair the others produce.

    .venv/bin/python bench/loaders/run_mmcurate.py --shards DIR --work DIR
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import queue
import shutil
import sys
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]

import common  # noqa: E402


def manifest_for(shards: list[str], work: Path) -> Path:
    """The build's manifest.json next to the shards, else one written into `work`."""
    beside = Path(shards[0]).parent / "manifest.json"
    if beside.exists():
        return beside
    entries = []
    for path in shards:
        raw = Path(path).read_bytes()
        samples = sum(1 for _ in common.iter_tar_samples(path))
        entries.append(
            {
                "name": path,
                "samples": samples,
                "bytes": len(raw),
                "sha256": hashlib.sha256(raw).hexdigest(),
            }
        )
    work.mkdir(parents=True, exist_ok=True)
    doc = {"format": "mmcurate/1", "samples": sum(e["samples"] for e in entries), "shards": entries}
    (work / "manifest.json").write_text(json.dumps(doc))
    return work / "manifest.json"


def in_background(batches, depth: int = 2):
    """What torch's pin-memory thread does for a GPU trainer, here on a CPU: batches are
    received on a thread and copied out of the workers' shared memory (into pinned memory, on
    CUDA), so the training thread does not pay the ~3 ms a batch that receiving and freeing
    a batch cost it otherwise (measured here)."""

    from mmcurate.trainer.data.dataset import Batch

    ready: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def fetch() -> None:
        try:
            for batch in batches:
                private = Batch(batch.images.clone(), batch.tokens.clone(), batch.keys)
                del batch  # frees the shared memory here, off the training thread
                while not stop.is_set():
                    with contextlib.suppress(queue.Full):
                        ready.put(private, timeout=0.1)
                        break
                if stop.is_set():
                    return
            ready.put(_END)
        except BaseException as err:  # noqa: BLE001 - re-raised in the training thread
            ready.put(err)

    thread = threading.Thread(target=fetch, name="mmcurate-fetch", daemon=True)
    thread.start()
    try:
        while (item := ready.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()


_END = object()


class Restartable:
    """An iterable that makes a fresh iterator per epoch (as a DataLoader does)."""

    def __init__(self, make) -> None:
        self.make = make

    def __iter__(self):
        return iter(self.make())


def check_uint8_batch(batch, batch_size: int) -> None:
    images, tokens = batch[0], batch[1]
    assert images.dtype.itemsize == 1 and tuple(images.shape) == (batch_size, 3, 224, 224)
    assert tuple(tokens.shape) == (batch_size, 77)


def flag(name: str) -> bool:
    if name in sys.argv:
        sys.argv.remove(name)
        return True
    return False


def main() -> None:
    # --gpu-like: batches stay uint8, as a GPU trainer receives them (it normalizes on the
    # GPU); for the stall measurement of a simulated GPU step on this CPU-only machine.
    # --no-ring: batches in a fresh shared-memory segment each, as a plain DataLoader passes
    # them (for the before/after of trainer/data/ring.py).
    gpu_like, ring = flag("--gpu-like"), not flag("--no-ring")
    if gpu_like:
        common.check_batch = check_uint8_batch
    name = "mmcurate-gpu-like" if gpu_like else "mmcurate"
    args = common.parse_args(name if ring else f"{name}-no-ring")
    import torch
    from mmcurate.trainer.data.dataset import ImageTransform, ShardDataset, make_loader
    from mmcurate.trainer.data.manifest import read_manifest
    from mmcurate.trainer.data.prefetch import DevicePrefetcher

    torch.set_num_threads(1)  # as a training process next to its loader workers would
    preprocess, tokenizer = common.transform(args.model)
    if args.remote:
        url = args.remote.rstrip("/") + "/manifest.json"
        storage = {"endpoint_url": args.endpoint}
        cache = (str(Path(args.work) / "mmcurate-cache"), 100 * 10**9)
        shutil.rmtree(cache[0], ignore_errors=True)  # a cold cache
    else:
        url = str(manifest_for(common.shard_paths(args.shards), Path(args.work) / "mmcurate"))
        storage, cache = {}, None
    transform = ImageTransform(preprocess)
    dataset = None

    def loader():
        nonlocal dataset
        manifest = read_manifest(url, storage)
        dataset = ShardDataset(
            manifest,
            transform,
            tokenizer,
            batch_size=args.batch_size,
            seed=args.seed,
            shuffle_buffer=1000,
            finish_in_workers=not gpu_like,  # normalize in the workers: the CPU trains here
            storage_options=storage,
            cache=cache,
        )
        # hold 2: the measuring loop keeps one batch while it draws the next
        dataset.set_epoch(0, epochs=None)  # epoch after epoch, as the trainer reads them
        batches = make_loader(dataset, args.workers, hold=2 if ring else None)
        if gpu_like and ring:  # uint8 views into the rings: the CUDA trainer's path since
            return batches  # issue 23 (it copies them to the device on a side stream)
        if gpu_like:  # the CUDA trainer's path before issue 23: a pin-memory thread
            return Restartable(lambda: in_background(batches))
        return DevicePrefetcher(batches, torch.device("cpu"), transform)

    common.emit(common.measure(args, loader, packages=("mmcurate",)))


if __name__ == "__main__":
    main()

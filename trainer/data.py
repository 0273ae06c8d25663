"""Stream a build's WebDataset shards (local or any fsspec URL) as ready training batches.

Each loader worker follows its part of the epoch plan (trainer/plan.py), epoch after epoch: it
reads only its shard runs, front to back, holds raw samples until the shuffle buffer emits
them, and yields whole batches: `Batch(images, tokens, keys)`. The workers are the loader's
own processes with reused shared-memory slots (trainer/ring.py) when the CPU trains, and a
DataLoader's with pinned memory on CUDA (`make_loader`). Images leave the workers as uint8 after the
geometric part of the train transform (4x less to pass between processes than float); the
float conversion and normalization run on the training GPU (`ImageTransform.finish`), or in
the workers when training on the CPU.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import tarfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import fsspec
import torch
from PIL import Image
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms import Compose, Normalize, RandomResizedCrop, ToTensor
from torchvision.transforms.functional import pil_to_tensor
from torchvision.transforms.v2.functional import resized_crop

from pipeline.tario import iter_tar_samples
from stages.base import FRAME_COLUMN, IMAGE_COLUMNS
from trainer.batch import Batch
from trainer.cache import ShardCache, ShardCorrupt
from trainer.manifest import Manifest
from trainer.plan import (
    Layout,
    Segment,
    Source,
    WorkerPlan,
    batches_per_rank,
    epoch_pieces,
    worker_plan,
)
from trainer.ring import Ring, RingLoader, SlotRef, batch_priority

log = logging.getLogger(__name__)
RGB = ImageReadMode.RGB

PREFETCH_SHARDS = 2  # shard runs a worker asks the cache to fetch ahead of the one it reads
# Batches each worker may have ready ahead of the training step (torch's default is 2): the
# deeper queue absorbs the workers' jitter (shard opens, slow samples, epoch restarts).
PREFETCH_BATCHES = 4


class ImageTransform:
    """open_clip's train transform, split at ToTensor. In the workers: decode to a uint8
    tensor (libjpeg-turbo through torchvision for JPEG, PIL otherwise), then the transform's
    steps before ToTensor (RandomResizedCrop, ...) on that tensor, with torch's uint8 kernels:
    about 3x faster than PIL's resize here, same crop distribution, bicubic antialiased.
    `finish` (x / 255, Normalize) runs on the training device. A transform that does not end
    in ToTensor + Normalize runs whole, on PIL images, in the workers."""

    def __init__(self, preprocess: Callable[[Image.Image], torch.Tensor]) -> None:
        steps = list(preprocess.transforms) if isinstance(preprocess, Compose) else []
        split = (
            len(steps) >= 2 and isinstance(steps[-2], ToTensor) and isinstance(steps[-1], Normalize)
        )
        self.full = preprocess
        self.pil = Compose([fast_step(step) for step in steps[:-2]]) if split else None
        self.mean = torch.tensor(steps[-1].mean).view(3, 1, 1) if split else None
        self.std = torch.tensor(steps[-1].std).view(3, 1, 1) if split else None

    def __call__(self, data: bytes) -> torch.Tensor:
        """Encoded image bytes -> uint8 [3, H, W] (float when the transform does not split)."""
        if self.pil is None:
            return self.full(open_image(data).convert("RGB"))
        return self.pil(decode_rgb(data))

    def decode_on(self, images: list[torch.Tensor], device: torch.device) -> torch.Tensor:
        """Device decode: the batch's JPEG bytes (1-D) decoded together on `device` (nvJPEG
        on CUDA), then the geometric steps there; other items arrive transformed. A file
        the decoder rejects is replaced by another image of the batch, as in `collate`."""
        encoded = [i for i, image in enumerate(images) if image.dim() == 1]
        out: list[torch.Tensor | None] = [
            None if image.dim() == 1 else image.to(device, non_blocking=True) for image in images
        ]
        try:
            decoded = decode_jpeg([images[i] for i in encoded], mode=RGB, device=device)
        except RuntimeError:  # one bad file fails the batch call: decode one by one on the CPU
            decoded = [decode_or_none(images[i].numpy().tobytes(), device) for i in encoded]
        for i, image in zip(encoded, decoded, strict=True):
            out[i] = None if image is None else self.pil(image)
        good = [image for image in out if image is not None]
        if not good:
            raise RuntimeError("a whole batch of JPEGs failed to decode")
        return torch.stack([image if image is not None else good[0] for image in out])

    def finish_on(
        self, images: torch.Tensor | list[torch.Tensor], device: torch.device
    ) -> torch.Tensor:
        """A batch as the loader yields it -> normalized float on `device`."""
        if isinstance(images, list):  # data.gpu_decode: JPEGs decode here
            return self.finish(self.decode_on(images, device))
        return self.finish(images.to(device, non_blocking=True))

    def finish(self, images: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """uint8 -> normalized float on the images' device (float input passes through),
        written into `out` when it is a float tensor of the same shape."""
        if images.dtype != torch.uint8 or self.mean is None:
            return images.float()
        mean, std = self.mean.to(images.device), self.std.to(images.device)
        if out is not None and out.shape == images.shape and out.dtype == torch.float32:
            scaled = torch.div(images, 255, out=out)
        else:
            scaled = images.float().div_(255)
        return scaled.sub_(mean).div_(std)


class ResizedCropU8:
    """A RandomResizedCrop drawing the same crop (its own `get_params`, the same random
    numbers) and resizing with torchvision v2's uint8 kernel: v1 on a tensor resizes in float,
    about 3x slower."""

    def __init__(self, crop: RandomResizedCrop) -> None:
        self.crop = crop

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        c = self.crop
        top, left, height, width = c.get_params(image, c.scale, c.ratio)
        return resized_crop(
            image, top, left, height, width, c.size, c.interpolation, antialias=c.antialias
        )


def fast_step(step: Callable) -> Callable:
    return ResizedCropU8(step) if type(step) is RandomResizedCrop else step


def decode_or_none(data: bytes, device: torch.device) -> torch.Tensor | None:
    try:
        return decode_rgb(data).to(device)
    except (OSError, ValueError, RuntimeError, Image.DecompressionBombError):
        return None


def decode_rgb(data: bytes) -> torch.Tensor:
    """uint8 [3, H, W] RGB. PIL reads the header first, so its decompression-bomb limit
    applies to JPEGs too."""
    image = Image.open(io.BytesIO(data))
    if image.format == "JPEG":
        with contextlib.suppress(RuntimeError):  # e.g. a CMYK JPEG: PIL handles it below
            return decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=RGB)
    image.load()
    return pil_to_tensor(image if image.mode == "RGB" else image.convert("RGB"))


def frame_columns(sample: dict[str, Any]) -> list[str]:
    """A video sample's sampled frames (`000.jpg`, `001.jpg`, ...) in order."""
    return sorted(c for c in sample if FRAME_COLUMN.match(c))


def open_image(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


@dataclass
class Counters:
    """Per-worker sample accounting (logged when a worker finishes an epoch)."""

    samples: int = 0
    substituted: int = 0  # undecodable or missing samples replaced to keep batches full


class ShardDataset(IterableDataset):
    """Yields `Batch`es of one rank's share of `epochs` epochs from `set_epoch`'s (one by
    default; None: endless), continuing mid-epoch after `resume_at`. Every rank yields the
    same number of batches per epoch (`batches_per_epoch`), whatever the shard sizes.

    The workers go on from one epoch to the next themselves, so one set of workers serves a
    whole run: no fork, no shutdown and no drained queue at epoch boundaries."""

    def __init__(
        self,
        manifest: Manifest | Sequence[tuple[Manifest, float]],
        transform: ImageTransform,
        tokenizer: Callable[..., torch.Tensor],
        batch_size: int,
        seed: int = 0,
        shuffle_buffer: int = 1000,
        rank: int = 0,
        world: int = 1,
        step_batches: int = 1,
        device_decode: bool = False,
        decode_threads: int = 2,
        finish_in_workers: bool = False,
        storage_options: dict[str, Any] | None = None,
        cache: tuple[str, int] | None = None,
    ) -> None:
        # One manifest, or several with weights (samples per epoch = weight x samples).
        mix = [(manifest, 1.0)] if isinstance(manifest, Manifest) else list(manifest)
        self.shards, self.sources = [], []
        for source, weight in mix:
            first = len(self.shards)
            self.shards += source.shards
            sizes = tuple(shard.samples for shard in source.shards)
            self.sources.append(Source(tuple(range(first, len(self.shards))), sizes, weight))
        self.epoch_samples = sum(source.quota for source in self.sources)
        self.transform, self.tokenizer = transform, tokenizer
        self.batch_size, self.seed, self.shuffle_buffer = batch_size, seed, shuffle_buffer
        self.rank, self.world, self.step_batches = rank, world, step_batches
        # Why the check: device decode needs the split transform to crop on the device.
        self.device_decode = device_decode and transform.pil is not None
        # Training on the CPU: normalize in the workers too, so the training process (also
        # on the CPU) gets float batches and only trains.
        self.finish_in_workers = finish_in_workers and not self.device_decode
        self.decode_threads = decode_threads
        # (process id, pool): made on first use in each process. Why the pid: a forked
        # worker inherits the pool object but none of its threads.
        self._pool: tuple[int, ThreadPoolExecutor] | None = None
        self.storage_options = dict(storage_options or {})
        self.cache_spec = cache  # (folder, byte limit): read shards through a local ShardCache
        self._cache: ShardCache | None = None
        self.epoch = 0
        self.epochs: int | None = 1  # epochs one iteration runs through; None: endless
        self.resume: tuple[int, int] | None = None  # (epoch, batches the rank consumed)
        self.counters = Counters()
        # In a RingLoader worker (trainer/ring.py): its place, and its slots.
        self.worker_place: tuple[int, int] | None = None
        self.ring_slots, self.ring_free = 0, None
        self._ring: Ring | None = None  # this worker's, made with its first batch

    def __getstate__(self) -> dict[str, Any]:
        # Why: a thread pool cannot be pickled (a spawned worker makes its own).
        return {**self.__dict__, "_pool": None}

    def start_worker(self, worker: int, workers: int, slots: int, free: Any) -> None:
        """Called in a RingLoader worker: its place, and the slots of its ring."""
        self.worker_place = (worker, workers)
        self.ring_slots, self.ring_free = slots, free

    def set_epoch(self, epoch: int, epochs: int | None = 1) -> None:
        """The next iteration starts at `epoch` and runs through `epochs` epochs (None:
        endless). Why before iter(loader): the workers copy these values when they start."""
        if epochs is None and self.batches_per_epoch() == 0:  # would spin, yielding nothing
            raise ValueError(
                f"no full step ({self.step_batches} batches of {self.batch_size}) in an epoch of "
                f"{self.epoch_samples} samples for each of {self.world} ranks: an endless stream "
                "would never yield"
            )
        self.epoch, self.epochs = epoch, epochs

    def resume_at(self, epoch: int, consumed_batches: int) -> None:
        """Continue `epoch` after the rank's first `consumed_batches` batches."""
        self.resume = (epoch, consumed_batches)

    def batches_per_epoch(self) -> int:
        """Batches this rank yields in a full epoch (the same on every rank)."""
        return batches_per_rank(self.epoch_samples, self.world, self.batch_size, self.step_batches)

    def plan(self, epoch: int, layout: Layout, consumed: int) -> WorkerPlan:
        return worker_plan(
            epoch_pieces(self.sources, self.seed, epoch),
            self.seed,
            epoch,
            layout,
            self.batch_size,
            self.shuffle_buffer,
            consumed_batches=consumed,
            multiple=self.step_batches,
        )

    def __iter__(self) -> Iterator[Batch | SlotRef]:
        # Why not a generator: the start is fixed here, when the DataLoader calls iter().
        consumed = self.resume[1] if self.resume and self.resume[0] == self.epoch else 0
        return self.stream(self.epoch, consumed, self.epochs)

    def stream(self, epoch: int, consumed: int, epochs: int | None) -> Iterator[Batch | SlotRef]:
        """This worker's batches, epoch after epoch. The DataLoader takes batches from its
        workers round-robin, starting at worker 0, so the epoch plan's worker ids are rotated
        by the batches taken before each epoch: after a resume (the `consumed` batches) and
        at every later epoch, the next batch then comes from the worker the plan gives it."""
        info = get_worker_info()
        worker, workers = self.worker_place or ((info.id, info.num_workers) if info else (0, 1))
        taken = -consumed  # batches all workers yielded in this iteration before `epoch`
        last = None if epochs is None else epoch + epochs - 1
        while last is None or epoch <= last:
            layout = Layout(self.rank, self.world, (worker - taken) % workers, workers)
            yield from self.batches(self.plan(epoch, layout, consumed), epoch)
            taken += self.batches_per_epoch()
            epoch, consumed = epoch + 1, 0

    def batches(self, plan: WorkerPlan, epoch: int) -> Iterator[Batch | SlotRef]:
        samples = self.emitted(plan)
        last: Batch | None = None
        for _ in range(plan.batches):
            raws = [next(samples) for _ in range(self.batch_size)]
            ring = self._ring
            slot = ring.claim() if ring else None
            last = self.collate(raws, last, epoch, ring.out(slot) if slot is not None else None)
            if ring is None and self.ring_free is not None and Ring.holds(last):
                ring = self._ring = Ring(self.ring_slots, last, self.ring_free)
                slot = ring.claim()
            sent = ring.store(slot, last) if slot is not None else None
            if slot is not None and sent is None:  # sent whole: it may lie in the freed slot
                last = Batch(last.images.clone(), last.tokens.clone(), last.keys)
            yield sent or last
        if self.counters.substituted:
            log.warning(
                "epoch %d: %d of %d samples were unusable and replaced by others of their batch",
                epoch,
                self.counters.substituted,
                self.counters.samples,
            )

    def emitted(self, plan: WorkerPlan) -> Iterator[tuple[int, dict[str, Any] | None]]:
        """(position, raw sample) in the plan's emission order, holding read-ahead samples
        until their turn; None for a position its shard did not hold."""
        reader = self.read_positions(plan.segments)
        wanted, pending = set(plan.emit), {}
        for position in plan.emit:
            while position not in pending:
                found = next(reader)  # every planned position comes, None when unreadable
                if found[0] in wanted:
                    pending[found[0]] = found[1]
            yield position, pending.pop(position)

    def read_positions(
        self, runs: Sequence[Segment]
    ) -> Iterator[tuple[int, dict[str, Any] | None]]:
        for index, run in enumerate(runs):
            if self.cache_spec:
                ahead = runs[index + 1 : index + 1 + PREFETCH_SHARDS]
                self.cache().prefetch([self.shard_entry(r.shard) for r in ahead])
            delivered = 0
            try:
                with self.open_shard(run.shard) as f:
                    for sample in iter_tar_samples(f, run.start, run.stop):
                        yield run.position + delivered, sample
                        delivered += 1
            # Why broad: storage backends raise their own errors; the cache already retried.
            except (OSError, tarfile.TarError, ShardCorrupt) as err:
                log.warning(
                    "%s: %s; its unread samples are replaced", self.shards[run.shard].url, err
                )
            for offset in range(delivered, run.stop - run.start):  # short or unreadable shard
                yield run.position + offset, None

    def cache(self) -> ShardCache:
        """This process's handle on the node's shard cache (made after the worker forks)."""
        if self._cache is None:
            folder, limit = self.cache_spec
            self._cache = ShardCache(folder, limit, self.storage_options)
        return self._cache

    def shard_entry(self, index: int) -> tuple[str, str | None, int]:
        shard = self.shards[index]
        return shard.url, shard.sha256, shard.bytes

    def open_shard(self, index: int) -> Any:
        if self.cache_spec:
            return self.cache().open(*self.shard_entry(index))
        return fsspec.open(self.shards[index].url, "rb", **self.storage_options)

    def collate(
        self,
        raws: list[tuple[int, dict[str, Any] | None]],
        previous: Batch | None,
        epoch: int,
        out: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> Batch:
        """Decode one batch, its images stacked into `out` (a ring slot) when they fit. An
        unusable sample is replaced by a usable one of the same batch (or of the previous
        batch), so every rank still yields full, equal batches."""
        items = self.decode_all(raws)
        good = [item for item in items if item is not None]
        self.counters.samples += len(items)
        self.counters.substituted += len(items) - len(good)
        if not good:
            if previous is None:
                raise RuntimeError(f"epoch {epoch}: a whole batch of samples is unusable")
            # A copy: `previous` may be a view into a ring slot that is reused later.
            images = previous.images
            images = list(images) if isinstance(images, list) else images.clone()
            return Batch(images, previous.tokens.clone(), previous.keys)
        filled = [item if item is not None else good[i % len(good)] for i, item in enumerate(items)]
        images = [image for image, _ in filled]
        if not any(image.dim() == 1 for image in images):  # nothing left for the device
            images = self.stack(images, out[0] if out else None)
        tokens = self.tokenizer([text for _, text in filled])
        keys = [raw["__key__"] if raw is not None else "" for _, raw in raws]
        return Batch(images, tokens, keys)

    def decode_all(self, raws: list[tuple[int, dict[str, Any] | None]]) -> list:
        """Each sample decoded, in order. With several threads (decode and resize run
        without the GIL), a worker can use a core another worker leaves idle: the DataLoader
        takes batches from workers in turn, so one running late holds up the rest. Measured
        at 90% demand on 2 cores: fewer waits, and 10-15% more batches per second."""
        samples = [raw for _, raw in raws]
        if self.decode_threads <= 1:
            return [self.decode_or_skip(raw) for raw in samples]
        if self._pool is None or self._pool[0] != os.getpid():
            self._pool = (os.getpid(), ThreadPoolExecutor(self.decode_threads, "mmcurate-decode"))
        return list(self._pool[1].map(self.decode_or_skip, samples))

    def decode_or_skip(self, sample: dict[str, Any] | None) -> tuple[torch.Tensor, str] | None:
        return self.decode(sample) if sample is not None else None

    def stack(self, images: list[torch.Tensor], out: torch.Tensor | None) -> torch.Tensor:
        if self.finish_in_workers:
            return self.transform.finish(torch.stack(images), out)
        shape = (len(images), *images[0].shape)
        if out is not None and out.shape == shape and out.dtype == images[0].dtype:
            return torch.stack(images, out=out)
        return torch.stack(images)

    def decode(self, sample: dict[str, Any]) -> tuple[torch.Tensor, str] | None:
        """(image or clip tensor, caption), or None when the sample is unusable."""
        if "txt" not in sample:
            return None
        try:
            text = sample["txt"].decode("utf-8")
            frames = frame_columns(sample)
            if frames:
                return torch.stack([self.transform(sample[c]) for c in frames]), text
            column = next((c for c in IMAGE_COLUMNS if c in sample), None)
            if column is None:
                return None
            if self.device_decode and column == "jpg":
                Image.open(io.BytesIO(sample[column]))  # header and bomb checks only
                return torch.frombuffer(bytearray(sample[column]), dtype=torch.uint8), text
            return self.transform(sample[column]), text
        except (OSError, ValueError, RuntimeError, Image.DecompressionBombError):
            return None  # Why: one bad sample must not stop training


def make_loader(
    dataset: ShardDataset, workers: int, pin_memory: bool = False, hold: int | None = None
) -> RingLoader | Batches:
    """Loader worker processes that build whole batches; batches come from the workers in
    turn, which the resume arithmetic relies on.

    With `hold` (the training loop), the loader's own workers pass batches through reused
    shared-memory slots (trainer/ring.py): each batch's tensors are then views that stay
    valid until `hold` more batches are drawn; pass the most batches the caller keeps at
    once. Without it (or with device decode, whose batches vary in size, or no workers), a
    DataLoader passes them the ordinary way."""
    if workers:
        # Why process-wide: torch has no per-loader option. Tensors pass as named shared
        # memory files instead of file descriptors, which the training process would have to
        # fetch from each busy worker's sharing thread (about 5 ms a batch measured here).
        torch.multiprocessing.set_sharing_strategy("file_system")
    if hold and workers and not dataset.device_decode:
        return RingLoader(dataset, workers, hold, PREFETCH_BATCHES)
    loader = DataLoader(
        dataset,
        batch_size=None,
        num_workers=workers,
        pin_memory=pin_memory,
        prefetch_factor=PREFETCH_BATCHES if workers else None,
        in_order=True,
        worker_init_fn=batch_priority,
    )
    return Batches(loader)


class Batches:
    """A DataLoader whose iterators can be closed (which stops its workers) like a
    RingLoader's."""

    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[Batch]:
        return closable(iter(self.loader))


def closable(items: Iterator[Batch]) -> Iterator[Batch]:
    yield from items

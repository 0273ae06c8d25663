"""Batches onto the training device: the host-to-device copy and the last step of the image
transform (normalization), overlapped with the running step on CUDA; and the data-wait clock
of the stall meter.

The loader is the same on the CPU and on CUDA (trainer/data/ring.py `transport`): batches are views
into the loader workers' shared-memory rings. Only the copy differs, and the CUDA part of it is
`SideStreamCopies`, used only when the device is CUDA."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from mmcurate.trainer.data.dataset import Batch, ImageTransform
from mmcurate.trainer.data.ring import DEVICE_HOLD

if TYPE_CHECKING:
    from mmcurate.trainer.run_log import Meter

log = logging.getLogger(__name__)


class DevicePrefetcher:
    """Batches on the training device, normalized. On CUDA the next batch is copied and
    normalized on a side stream while the current step runs (`SideStreamCopies`); on CPU it
    only finishes the transform. `hold`: the views the loader lets the caller keep (on CUDA,
    trainer/data/ring.py DEVICE_HOLD, as `transport` gives the loader)."""

    def __init__(
        self,
        loader: Any,
        device: torch.device,
        transform: ImageTransform,
        hold: int = DEVICE_HOLD,
    ) -> None:
        self.loader, self.device, self.transform, self.hold = loader, device, transform, hold

    def to_device(self, batch: Batch) -> Batch:
        tokens = batch.tokens.to(self.device, non_blocking=True)
        return batch._replace(
            images=self.transform.finish_on(batch.images, self.device), tokens=tokens
        )

    def __iter__(self) -> Iterator[Batch]:
        if self.device.type != "cuda":
            for batch in self.loader:
                yield self.to_device(batch)
            return
        yield from SideStreamCopies(self.device, self.hold).batches(self.loader, self.to_device)


class SideStreamCopies:
    """CUDA only. Each batch is copied to the device (and normalized there) on a side stream
    while the current step runs; the step's stream waits for it. A batch that lies in a loader
    ring is copied straight from the ring's shared memory, which is registered with CUDA (page
    locked) when its first batch arrives, so the copy is asynchronous. Each copy records an
    event, and before the next draw (which gives the oldest held view's slot back to its worker,
    trainer/data/ring.py) the host waits for that view's copy: a worker never overwrites a slot that
    a copy still reads. Other batches (a DataLoader's, pinned) are copied as they are."""

    def __init__(self, device: torch.device, hold: int) -> None:
        self.device, self.hold = device, hold
        self.stream = torch.cuda.Stream(device)
        self.copies: deque[torch.cuda.Event] = deque()  # one per drawn, still-held view
        # Registered ring storages by address (kept alive until unregistered); None: refused.
        self.pinned: dict[int, torch.UntypedStorage | None] = {}

    def batches(self, loader: Any, to_device: Callable[[Batch], Batch]) -> Iterator[Batch]:
        draws = iter(loader)
        try:
            upcoming = self.preload(draws, to_device)
            while upcoming is not None:
                main = torch.cuda.current_stream(self.device)
                main.wait_stream(self.stream)
                for tensor in (upcoming.images, upcoming.tokens):  # freed only after `main`
                    tensor.record_stream(main)
                ready, upcoming = upcoming, self.preload(draws, to_device)
                yield ready
        finally:
            self.stream.synchronize()  # no copy still reads a ring when it is unregistered
            for address, storage in self.pinned.items():
                if storage is not None:
                    torch.cuda.cudart().cudaHostUnregister(address)
            self.pinned.clear()

    def preload(self, draws: Iterator[Batch], to_device: Callable[[Batch], Batch]) -> Batch | None:
        while len(self.copies) >= self.hold:  # the next draw frees the oldest view's slot
            self.copies.popleft().synchronize()
        batch = next(draws, None)
        if batch is None:
            return None
        for tensor in (batch.images, batch.tokens):
            self.pin(tensor)
        with torch.cuda.stream(self.stream):
            moved = to_device(batch)
            copied = torch.cuda.Event()
            copied.record(self.stream)
        self.copies.append(copied)
        return moved

    def pin(self, tensor: torch.Tensor | list[torch.Tensor]) -> None:
        """Register the ring `tensor` lies in with CUDA, once. A ring: a shared storage larger
        than the batch (its slots); anything else is left as it is."""
        if not isinstance(tensor, torch.Tensor) or tensor.is_cuda:
            return
        storage = tensor.untyped_storage()
        address = storage.data_ptr()
        if address in self.pinned or not storage.is_shared() or storage.nbytes() <= tensor.nbytes:
            return
        cudart = torch.cuda.cudart()
        code = int(cudart.cudaHostRegister(address, storage.nbytes(), 0))
        self.pinned[address] = storage if code == 0 else None
        if code:
            if hasattr(cudart, "cudaGetLastError"):
                cudart.cudaGetLastError()  # Why: the refusal must not fail a later CUDA check
            log.warning(
                "cudaHostRegister refused a loader ring (%d bytes, CUDA error %d): its batches "
                "are copied from pageable memory (slower)",
                storage.nbytes(),
                code,
            )


def timed(batches: Iterator[Batch], meter: Meter) -> Iterator[Batch]:
    """Yield batches, adding the time spent waiting for each to `meter.wait_s`."""
    it = iter(batches)
    while True:
        start = time.perf_counter()
        batch = next(it, None)
        if batch is None:
            return
        meter.wait_s += time.perf_counter() - start
        yield batch

"""Batches onto the training device: the host-to-device copy and the last step of the image
transform (normalization), overlapped with the running step on CUDA; and the data-wait clock
of the stall meter."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from trainer.data import Batch, ImageTransform

if TYPE_CHECKING:
    from trainer.run_log import Meter


class DevicePrefetcher:
    """Batches on the training device, normalized. On CUDA the next batch is copied (from
    pinned memory) and normalized on a side stream while the current step runs; on CPU it
    only finishes the transform."""

    def __init__(self, loader: Any, device: torch.device, transform: ImageTransform) -> None:
        self.loader, self.device, self.transform = loader, device, transform

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
        stream = torch.cuda.Stream(self.device)
        batches = iter(self.loader)
        upcoming = self.preload(batches, stream)
        while upcoming is not None:
            torch.cuda.current_stream(self.device).wait_stream(stream)
            ready = upcoming
            for tensor in (ready.images, ready.tokens):  # freed only after the main stream
                tensor.record_stream(torch.cuda.current_stream(self.device))
            upcoming = self.preload(batches, stream)
            yield ready

    def preload(self, batches: Iterator[Batch], stream: torch.cuda.Stream) -> Batch | None:
        batch = next(batches, None)
        if batch is None:
            return None
        with torch.cuda.stream(stream):
            return self.to_device(batch)


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

"""The shared-memory batch tensors a video loader worker writes its windows into, reused once
no other process holds them.

Why reuse: a fresh shared-memory batch is faulted in page by page as the decoder's frames are
copied into it, and its pages are freed again by whichever process lets go of it last. At
640x360 the copy into a fresh batch took 6.6 ms of a clip's 30 ms, into a reused one 1.2 ms
(bench/video_loader.py's build, profiled): about a fifth of the loader's work.

When a buffer is reused: torch's `file_system` sharing keeps, in each shared segment's header
(`RefcountedMapAllocator`: an int 64 bytes before the data), how many processes have it
mapped; the worker that made it counts 1. A batch waiting in the worker's queue counts 1 too
until the queue's feeder thread pickles it, so each batch carries a `Sent` marker after its
`video`: pickled after the tensor, it marks the buffer as handed over. A buffer is written
again only when it was handed over and the count is back to 1: a batch the training script
(or any process it passed the batch to) still holds is never overwritten. `BatchBuffers`
probes once that this torch keeps the count there; where it does not, every batch gets a
fresh buffer, as before.

Memory: at most `most` buffers are kept (the loader passes its prefetch depth + 3: the batch
being decoded, the queued ones and the two the training step may hold), as many as the
worker kept before to free them itself; a buffer in use when it is let go is freed by its
last holder.
"""

from __future__ import annotations

import ctypes
import math
from collections import deque
from typing import Any

import torch

HEADER = 64  # bytes between a shared segment's process count and its data (torch's layout)
SENT_KEY = "_sent"  # the batch dict's marker; the training process's loader removes it


def shared_tensor(shape: tuple[int, ...]) -> torch.Tensor:
    """An uninitialised uint8 tensor in shared memory (the DataLoader sends it without a copy)."""
    storage = torch.UntypedStorage._new_shared(math.prod(shape))
    return torch.empty(0, dtype=torch.uint8).set_(storage).view(shape)


def holders(tensor: torch.Tensor) -> int:
    """How many processes have this shared tensor's segment mapped (file_system sharing)."""
    return ctypes.c_int.from_address(tensor.untyped_storage().data_ptr() - HEADER).value


def counts_readable() -> bool:
    """Whether `holders` reads the count here: `file_system` sharing (the `file_descriptor`
    strategy's segments have no header) and a count that follows an extra reference."""
    if torch.multiprocessing.get_sharing_strategy() != "file_system":
        return False
    probe = shared_tensor((HEADER,))
    storage = probe.untyped_storage()
    first = holders(probe)
    storage._shared_incref()
    second = holders(probe)
    storage._shared_decref()
    return (first, second, holders(probe)) == (1, 2, 1)


class Buffer:
    """One batch tensor and whether its last batch has been handed over (pickled)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
        self.sent = False

    def free(self) -> bool:
        return self.sent and holders(self.tensor) == 1


class Sent:
    """The marker a batch carries after its `video`: pickling it (after the tensor, whose
    pickling counts the training process in) marks the buffer as handed over."""

    def __init__(self, buffer: Buffer) -> None:
        self.buffer = buffer

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        self.buffer.sent = True
        return (tuple, ())


class BatchBuffers:
    """A worker's batch tensors by shape (module docstring)."""

    def __init__(self, most: int) -> None:
        self.most = max(1, most)
        self.reuse = counts_readable()
        self.held: deque[Buffer] = deque()

    def take(self, shape: tuple[int, ...]) -> Buffer:
        """A buffer of `shape` nobody else holds, else a new one (the oldest let go)."""
        if self.reuse:
            for buffer in self.held:
                if tuple(buffer.tensor.shape) == shape and buffer.free():
                    self.held.remove(buffer)
                    self.held.append(buffer)
                    buffer.sent = False
                    return buffer
        buffer = Buffer(shared_tensor(shape))
        self.held.append(buffer)
        while len(self.held) > self.most:
            # A free one first: this worker then frees its pages, not the training step.
            free = [b for b in self.held if b is not buffer and self.reuse and b.free()]
            self.held.remove(free[0] if free else self.held[0])
        return buffer

    @staticmethod
    def unused(buffer: Buffer) -> None:
        """A buffer whose batch was not sent (skipped): free for the next batch."""
        buffer.sent = True

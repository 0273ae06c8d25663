"""How a loader worker turns raw samples into one batch: each sample decoded (on decode
threads, into its ring slot's row when it fits), unusable ones replaced by usable ones of the
same batch, images stacked, captions tokenized. ShardDataset (trainer/data/dataset.py) decides
which samples, in which order; this part only what becomes of them."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from mmcurate.core.formats import FRAME_COLUMN, IMAGE_COLUMNS
from mmcurate.trainer.data.batch import Batch, used_keys
from mmcurate.trainer.data.manifest import NoUsableData
from mmcurate.trainer.data.transform import DECODE_ERRORS, check_image_header, frame_columns


class BatchDecoding:
    """ShardDataset's batch making. Uses the dataset's `transform`, `tokenizer`,
    `batch_size`, `device_decode`, `finish_in_workers`, `decode_threads`, `counters`, `shards`
    and `reader()`; keeps its decode thread pool in `_pool`."""

    def collate(
        self,
        raws: list[tuple[int, dict[str, Any] | None]],
        previous: Batch | None,
        epoch: int,
        out: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> Batch:
        """Decode one batch, its images stacked into `out` (a ring slot) when they fit. An
        unusable sample is replaced by a usable one of the same batch; a batch with none is
        the previous batch again, or, in a worker's first batch, made of stand-ins. So every
        rank still yields full, equal batches."""
        items = self.decode_all(raws, out[0] if out else None)
        good = [item for item in items if item is not None]
        self.counters.samples += len(items)
        self.counters.substituted += len(items) - len(good)
        keys = [raw["__key__"] if raw is not None else "" for _, raw in raws]  # as planned
        if not good and previous is not None:
            # A copy: `previous` may be a view into a ring slot that is reused later.
            images = previous.images
            images = list(images) if isinstance(images, list) else images.clone()
            used = list(previous.used or previous.keys)
            return Batch(images, previous.tokens.clone(), keys, used=used)
        used = used_keys(keys, items)
        if not good:
            good = self.stand_ins(epoch)
        filled = [item if item is not None else good[i % len(good)] for i, item in enumerate(items)]
        images = [image for image, _ in filled]
        if not any(image.dim() == 1 for image in images):  # nothing left for the device
            images = self.stack(images, out[0] if out else None)
        return Batch(images, self.tokenizer([text for _, text in filled]), keys, used=used)

    def stand_ins(self, epoch: int) -> list[tuple[torch.Tensor, str]]:
        """Usable samples (a batch's worth at most) from the first shards, in manifest order,
        that hold any: for a worker's first batch when none of its own samples is usable.
        NoUsableData when no shard holds one: training cannot go on."""
        reader, found = self.reader(), []
        for index in range(len(self.shards)):
            for sample in reader.samples(index):
                item = self.decode(sample)
                if item is not None:
                    found.append(item)
                if len(found) == self.batch_size:
                    return found
        if found:
            return found
        raise NoUsableData(
            f"no usable data: none of the {len(self.shards)} shards holds a sample that can be "
            f"read and decoded (epoch {epoch}; {len(reader.logged)} shards skipped, see the "
            "warnings above)"
        )

    def decode_all(self, raws: list[tuple[int, dict[str, Any] | None]], out: Any = None) -> list:
        """Each sample decoded, in order, into its row of `out` (a ring slot) when it fits.
        With several threads (decode, resize and writes run without the GIL) a worker uses a
        core another leaves idle; batches come from the workers in turn, so one running late
        holds up the rest. At 90% demand on 2 cores: fewer waits, 10-15% more batches/s."""
        samples = [raw for _, raw in raws]
        rows = list(out) if out is not None and len(out) == len(raws) else [None] * len(raws)
        if self.decode_threads <= 1:
            return list(map(self.decode_or_skip, samples, rows))
        if self._pool is None or self._pool[0] != os.getpid():
            self._pool = (os.getpid(), ThreadPoolExecutor(self.decode_threads, "mmcurate-decode"))
        return list(self._pool[1].map(self.decode_or_skip, samples, rows))

    def decode_or_skip(
        self, sample: dict[str, Any] | None, row: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, str] | None:
        item = self.decode(sample) if sample is not None else None
        if item is None or row is None:
            return item
        return self.transform.place(item[0], row, self.finish_in_workers), item[1]

    def stack(self, images: list[torch.Tensor], out: torch.Tensor | None) -> torch.Tensor:
        """One tensor: `out` (a ring slot) when every image fits its row. The decode threads
        wrote most rows (so no stacked copy, and they normalize); replacements go in here."""
        finish = self.finish_in_workers
        if out is not None and len(out) == len(images):
            rows = list(out)
            images = [self.transform.place(i, r, finish) for i, r in zip(images, rows, strict=True)]
            if all(image is row for image, row in zip(images, rows, strict=True)):
                return out
            out = None  # one does not fit: a new tensor (each finished, placed rows already)
            images = [self.transform.finish(image) for image in images] if finish else images
        if finish:
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
                check_image_header(sample[column])
                return torch.frombuffer(bytearray(sample[column]), dtype=torch.uint8), text
            return self.transform(sample[column]), text
        except DECODE_ERRORS:
            return None  # Why: one bad sample must not stop training


def trained_member(ext: str) -> bool:
    """Whether `decode` can use a member of this extension (others are read past, not kept:
    a video sample's mp4 and json)."""
    return ext == "txt" or ext in IMAGE_COLUMNS or bool(FRAME_COLUMN.match(ext))

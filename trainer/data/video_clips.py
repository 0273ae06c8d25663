"""The clips a video loader worker reads (trainer/data/video_loader.py): `ClipReader` streams
a shard's samples with each clip as bytes, or as a local file when it is bigger than the
worker's clip budget (never whole in memory); `read_index` finds every sample's bucket and
frame count when the loader is made; `ClipStore` holds clips read before their batch, at most
a byte budget of them in memory, the rest in files.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.util import Finalize
from typing import IO, Any

import fsspec
import pyarrow.parquet as pq
from mmcurate.core.manifest import Shard
from mmcurate.core.spill import Spilled, release, remove_folder, spill_bytes, spill_folder
from mmcurate.core.storage import storage_errors
from mmcurate.core.tario import SpillTo, iter_tar_samples
from mmcurate.trainer.data.buckets import metadata_url
from mmcurate.trainer.data.reader import ShardReader
from mmcurate.trainer.data.video_windows import (
    VIDEO_MEMBERS,
    ClipIndex,
    ClipInfo,
    index_clips,
    probe_clip,
)

INDEX_THREADS = 4  # shards indexed at once when the loader is made
CLIP_MEMBERS = VIDEO_MEMBERS | {"txt", "json"}  # what a worker reads of a sample


class ClipReader(ShardReader):
    """A ShardReader whose samples hold a video member bigger than `clip_bytes` as a local
    file (a Spilled), streamed to disk as the tar is read; smaller ones as bytes."""

    def __init__(self, *args: Any, clip_bytes: int = -1, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.clip_bytes = clip_bytes  # -1: every clip to disk
        self.folder: tuple[int, str] | None = None  # (process id, spill folder)

    def folder_path(self) -> str:
        """This process's folder for clip files (made after a worker forks)."""
        if self.folder is None or self.folder[0] != os.getpid():
            self.folder = (os.getpid(), spill_folder())
            # Why multiprocessing's Finalize: it runs when the reader goes and also when a
            # loader worker process ends (weakref.finalize's exit hook does not run there:
            # a worker ends with os._exit, which left an empty folder per worker and epoch).
            Finalize(self, remove_folder, args=(self.folder[1],), exitpriority=0)
        return self.folder[1]

    def parse(self, f: IO[bytes], start: int, stop: int | None) -> Iterator[dict]:
        spill = SpillTo(self.folder_path(), self.clip_bytes, VIDEO_MEMBERS)
        return iter_tar_samples(f, start, stop, spill=spill, columns=CLIP_MEMBERS)


def video_member(sample: dict[str, Any]) -> Any:
    return next((sample[ext] for ext in sorted(VIDEO_MEMBERS) if ext in sample), None)


def release_sample(sample: dict[str, Any] | None) -> None:
    if sample is not None:
        release(sample.values())


def clip_path(value: Any, folder: str) -> tuple[str, Spilled | None]:
    """A local path for a clip value, and the file made for it (bytes: written out)."""
    if isinstance(value, Spilled):
        return value.path, None
    made = spill_bytes(bytes(value), folder)
    return made.path, made


def probe_sample(sample: dict[str, Any] | None, folder: str) -> ClipInfo:
    """What one sample's clip is (its first frame decoded), or why it is none."""
    if sample is None:
        return ClipInfo(None, reason="unreadable")
    value = video_member(sample)
    if value is None:
        release_sample(sample)
        return ClipInfo(None, reason="no_video")
    path, made = clip_path(value, folder)
    try:
        bucket, frames = probe_clip(path)
        return ClipInfo(bucket, frames)
    except Exception:  # noqa: BLE001 - decord raises its own errors for every bad file
        return ClipInfo(None, reason="unreadable")
    finally:
        release_sample(sample)
        release([made])


def metadata_clips(shard: Shard, storage_options: dict[str, Any]) -> list[ClipInfo] | None:
    """The shard's clips from its metadata parquet (a video_buckets build); None without."""
    try:
        with fsspec.open(metadata_url(shard), "rb", **storage_options) as f:
            table = pq.ParquetFile(f)
            if not {"bucket", "num_frames"} <= set(table.schema_arrow.names):
                return None
            rows = table.read(columns=["bucket", "num_frames"]).to_pylist()
    except Exception:  # noqa: BLE001 - no parquet, or unreadable: index from the tar instead
        return None
    if len(rows) != shard.samples or any(r["bucket"] is None for r in rows):
        return None
    return [ClipInfo(r["bucket"], int(r["num_frames"] or 0)) for r in rows]


def shard_clips(reader: ClipReader, index: int, storage_options: dict[str, Any]) -> list[ClipInfo]:
    shard = reader.shards[index]
    found = metadata_clips(shard, storage_options)
    if found is not None:
        return found
    folder = reader.folder_path()
    clips = [probe_sample(sample, folder) for sample in reader.samples(index)]
    return clips + [ClipInfo(None, reason="unreadable")] * (shard.samples - len(clips))


def read_index(
    shards: Sequence[Shard],
    storage_options: dict[str, Any] | None = None,
    cache: tuple[str, int] | None = None,
    verify: bool = True,
) -> ClipIndex:
    """Every shard's clips (metadata parquets, else the shards read once; several at once)."""
    options = dict(storage_options or {})
    reader = ClipReader(shards, options, cache, verify)
    with ThreadPoolExecutor(INDEX_THREADS, "mmcurate-clips") as pool:
        found = list(pool.map(lambda i: shard_clips(reader, i, options), range(len(shards))))
    return index_clips(found)


class ClipStore:
    """Samples waiting for their batch, by position: their clips in memory up to `limit`
    bytes in all, further ones moved to files (taken back as files: decoded by path)."""

    def __init__(self, limit: int, folder: str) -> None:
        self.limit, self.folder = limit, folder
        self.held: dict[int, dict[str, Any] | None] = {}
        self.bytes = 0  # clip bytes in memory now

    def __contains__(self, position: int) -> bool:
        return position in self.held

    def put(self, position: int, sample: dict[str, Any] | None) -> None:
        value = video_member(sample) if sample is not None else None
        if isinstance(value, bytes | bytearray):
            if self.bytes + len(value) > self.limit:
                ext = next(e for e in VIDEO_MEMBERS if sample.get(e) is value)
                sample[ext] = spill_bytes(bytes(value), self.folder)
            else:
                self.bytes += len(value)
        self.held[position] = sample

    def pop(self, position: int) -> dict[str, Any] | None:
        sample = self.held.pop(position)
        value = video_member(sample) if sample is not None else None
        if isinstance(value, bytes | bytearray):
            self.bytes -= len(value)
        return sample

    def close(self) -> None:
        for sample in self.held.values():
            release_sample(sample)
        self.held.clear()
        self.bytes = 0


def warm_imports() -> None:
    """Import in the training process what each loader worker would otherwise import when
    it starts (once a run: the workers live across epochs, trainer/data/video_epochs.py; again
    after a resume): decord, and the storage
    clients' error types a shard read catches (core.storage.storage_errors: botocore,
    aiohttp; about 1.5 s of each worker's first batch, measured with py-spy)."""
    import decord  # noqa: F401

    storage_errors()

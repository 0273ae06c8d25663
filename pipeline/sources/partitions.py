"""Sources: one object per source kind that both plans input partitions on the driver (pure)
and reads one partition in a task (as Ray Data's Datasource plans read tasks and reads them).
`SOURCES`, keyed by the config's `source.kind`, is the one table; a partition record
(pipeline/sources/records.py) names the source that reads it (`source_kind`).

Reading a partition yields batches (dicts of column lists) with `__key__`, `__part__`,
`__index__` (position, which fixes output order), `__source__`, `txt`, `json`, the media
columns, and `__drop__`/`__drop_stage__` for samples the source rejects.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from mmcurate.core.storage import filesystem, is_glob
from mmcurate.pipeline.config import SourceConfig
from mmcurate.pipeline.sources.images import image_chunks, plan_images
from mmcurate.pipeline.sources.records import (
    FolderPartition,
    Partition,
    TarPartition,
    UrlPartition,
    VideoListPartition,
)
from mmcurate.pipeline.sources.samples import WHOLE, Reading, whole_batch
from mmcurate.pipeline.sources.urls import plan_urls, read_urls
from mmcurate.pipeline.sources.videos import (
    VIDEO_EXTS,
    is_list_file,
    plan_video_glob,
    plan_video_list,
    video_list_chunks,
)
from mmcurate.pipeline.sources.webdataset import plan_webdataset, webdataset_chunks
from mmcurate.stages.base import Columns


class Source(Protocol):
    """What every source kind does: plan (driver) and read one of its partitions (task)."""

    def plan(self, cfg: SourceConfig, storage_options: dict[str, Any]) -> list[Partition]: ...

    def read(
        self, part: Partition, storage_options: dict[str, Any], reading: Reading
    ) -> Iterator[Columns]: ...


class ImageFolderSource:
    """`images`: a folder of media files with sidecar captions and metadata (images.py)."""

    def plan(self, cfg: SourceConfig, storage_options: dict[str, Any]) -> list[Partition]:
        return list(plan_images(cfg, storage_options))

    def read(
        self, part: Partition, storage_options: dict[str, Any], reading: Reading
    ) -> Iterator[Columns]:
        assert isinstance(part, FolderPartition)
        return image_chunks(part, storage_options, reading)


class VideoSource:
    """`videos`: a folder or a glob with sidecar .txt captions (read as a folder of images
    is: bytes go to the column of their extension), or a list file of paths and captions
    (videos.py)."""

    def plan(self, cfg: SourceConfig, storage_options: dict[str, Any]) -> list[Partition]:
        if is_list_file(cfg.path):
            return list(plan_video_list(cfg, storage_options))
        if is_glob(*filesystem(cfg.path, storage_options)):
            return list(plan_video_glob(cfg, storage_options))
        return list(plan_images(cfg, storage_options, VIDEO_EXTS))

    def read(
        self, part: Partition, storage_options: dict[str, Any], reading: Reading
    ) -> Iterator[Columns]:
        if isinstance(part, VideoListPartition):
            return video_list_chunks(part, storage_options, reading)
        assert isinstance(part, FolderPartition)
        return image_chunks(part, storage_options, reading)


class WebDatasetSource:
    """`webdataset`: tar shards, one partition each, streamed (webdataset.py)."""

    def plan(self, cfg: SourceConfig, storage_options: dict[str, Any]) -> list[Partition]:
        return list(plan_webdataset(cfg, storage_options))

    def read(
        self, part: Partition, storage_options: dict[str, Any], reading: Reading
    ) -> Iterator[Columns]:
        assert isinstance(part, TarPartition)
        return webdataset_chunks(part, storage_options, reading)


class UrlSource:
    """`urls`: LAION-style URL lists, a partition a range of rows (urls.py)."""

    def plan(self, cfg: SourceConfig, storage_options: dict[str, Any]) -> list[Partition]:
        return list(plan_urls(cfg, storage_options))

    def read(
        self, part: Partition, storage_options: dict[str, Any], reading: Reading
    ) -> Iterator[Columns]:
        """URL rows hold no media (download fetches it, a chunk at a time): read whole, split."""
        assert isinstance(part, UrlPartition)
        return iter_chunks(read_urls(part, storage_options), reading.batch_size)


SOURCES: dict[str, Source] = {
    "images": ImageFolderSource(),
    "videos": VideoSource(),
    "webdataset": WebDatasetSource(),
    "urls": UrlSource(),
}


def plan_source(cfg: SourceConfig, storage_options: dict[str, Any]) -> list[Partition]:
    return SOURCES[cfg.kind].plan(cfg, storage_options)


def read_chunks(
    part: Partition, storage_options: dict[str, Any], reading: Reading
) -> Iterator[Columns]:
    """One partition in chunks (`Reading`): output order, keys, `__index__` and drop reasons
    are the same for any chunk size."""
    return SOURCES[part.source_kind].read(part, storage_options, reading)


def read_partition(part: Partition, storage_options: dict[str, Any]) -> Columns:
    """One partition as one batch, nothing spilled (for tools and tests; a build reads it in
    chunks)."""
    return whole_batch(read_chunks(part, storage_options, WHOLE))


def iter_chunks(batch: Columns, size: int) -> Iterator[Columns]:
    """Split a batch into batches of at most `size` rows."""
    total = len(batch["__key__"])
    for start in range(0, total, size):
        yield {col: values[start : start + size] for col, values in batch.items()}

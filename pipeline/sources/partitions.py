"""Sources: plan input partitions on the driver (pure), read one partition in a task, for
every source kind (each kind in its own module: images.py, webdataset.py, urls.py, videos.py).

A partition is a small JSON-able dict. Reading it yields a batch (dict of column lists) with
`__key__`, `__part__`, `__index__` (position, which fixes output order), `__source__`, `txt`,
`json`, the image columns, and `__drop__`/`__drop_stage__` for samples the source rejects.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from mmcurate.core.storage import (
    filesystem,
    is_glob,
)
from mmcurate.pipeline.config import SourceConfig
from mmcurate.pipeline.sources.images import image_chunks, plan_images
from mmcurate.pipeline.sources.samples import (
    WHOLE,
    Reading,
    whole_batch,
)
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


def plan_videos(cfg: SourceConfig, storage_options: dict[str, Any]) -> list[dict[str, Any]]:
    """Video files (mp4, webm, avi, mkv, mov): a folder or a glob with sidecar .txt captions,
    or a list file of paths and captions (pipeline/sources/videos.py)."""
    if is_list_file(cfg.path):
        return plan_video_list(cfg, storage_options)
    if is_glob(*filesystem(cfg.path, storage_options)):
        return plan_video_glob(cfg, storage_options)
    return plan_images(cfg, storage_options, VIDEO_EXTS)


def url_chunks(
    part: dict[str, Any], storage_options: dict[str, Any], reading: Reading
) -> Iterator[Columns]:
    """URL rows hold no media (download fetches it, a chunk at a time): read whole, split."""
    return iter_chunks(read_urls(part, storage_options), reading.batch_size)


PLANNERS = {
    "images": plan_images,
    "videos": plan_videos,
    "webdataset": plan_webdataset,
    "urls": plan_urls,
}
CHUNK_READERS = {
    "images": image_chunks,
    "videos": image_chunks,  # the same folder reader: bytes go to the column of their extension
    "video_list": video_list_chunks,
    "webdataset": webdataset_chunks,
    "urls": url_chunks,
}


def plan_source(cfg: SourceConfig, storage_options: dict[str, Any]) -> list[dict[str, Any]]:
    return PLANNERS[cfg.kind](cfg, storage_options)


def read_chunks(
    part: dict[str, Any], storage_options: dict[str, Any], reading: Reading
) -> Iterator[Columns]:
    """One partition in chunks (`Reading`): output order, keys, `__index__` and drop reasons
    are the same for any chunk size."""
    return CHUNK_READERS[part["kind"]](part, storage_options, reading)


def read_partition(part: dict[str, Any], storage_options: dict[str, Any]) -> Columns:
    """One partition as one batch, nothing spilled (for tools and tests; a build reads it in
    chunks)."""
    return whole_batch(read_chunks(part, storage_options, WHOLE))


def iter_chunks(batch: Columns, size: int) -> Iterator[Columns]:
    """Split a batch into batches of at most `size` rows."""
    total = len(batch["__key__"])
    for start in range(0, total, size):
        yield {col: values[start : start + size] for col, values in batch.items()}

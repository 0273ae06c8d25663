"""Reading a partition's files (folder and video-list sources) in byte-bounded groups.

Small files are read a group at a time with one batched `cat` (an object store reads them
concurrently); a file above `spill_bytes` is never read into memory: a local one is passed by
path (`Spilled(..., owned=False)`: the build did not write it and never deletes it), a remote
one is streamed into the task's spill folder.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from mmcurate.core.spill import Spilled, spill_stream
from mmcurate.core.storage import cat_many, is_local, transient_errors, with_retries
from mmcurate.pipeline.sources.samples import Reading

Fetched = bytes | Spilled | Exception


def file_groups(sizes: list[int | None], reading: Reading) -> Iterator[range]:
    """Consecutive index ranges of at most `batch_size` files holding about `chunk_bytes`
    in memory (a group ends at the file that reaches it; spilled files and files of unknown
    size count nothing)."""
    start, held = 0, 0
    for i, size in enumerate(sizes):
        if not reading.spills(size):
            held += size or 0
        full = reading.chunk_bytes is not None and held >= reading.chunk_bytes
        if i + 1 - start >= reading.batch_size or full:
            yield range(start, i + 1)
            start, held = i + 1, 0
    if start < len(sizes):
        yield range(start, len(sizes))


def file_sizes(fs: Any, paths: list[str]) -> list[int | None]:
    """Current sizes (None where unknown: such a file is read whole, as before): one stat a
    local file, one concurrent batch of requests on a store."""
    if is_local(fs):
        return [local_size(path) for path in paths]
    try:
        return [int(s) if s is not None else None for s in fs.sizes(paths)]
    except (*transient_errors(), ValueError):
        return [None] * len(paths)


def local_size(path: str) -> int | None:
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def fetch_files(
    fs: Any, paths: list[str], sizes: list[int | None], reading: Reading
) -> dict[str, Fetched]:
    """Each file's bytes, or its Spilled when its size is above `spill_bytes`; a file that
    cannot be read maps to its exception (a transient one after retries)."""
    big = {p for p, size in zip(paths, sizes, strict=True) if reading.spills(size)}
    blobs: dict[str, Fetched] = dict(cat_many(fs, [p for p in paths if p not in big]))
    for path, value in blobs.items():  # a storage hiccup must not turn into read_error drops
        if isinstance(value, Exception) and not isinstance(value, FileNotFoundError):
            blobs[path] = read_or_error(fs, path)
    for path in big:
        blobs[path] = spilled_file(fs, path, reading)
    return blobs


def read_or_error(fs: Any, path: str) -> bytes | Exception:
    try:
        return with_retries(lambda: fs.cat_file(path))
    except transient_errors() as err:
        return err


def spilled_file(fs: Any, path: str, reading: Reading) -> Spilled | Exception:
    """A big file as a Spilled: a local one in place, a remote one streamed to the folder."""
    if is_local(fs):
        try:
            return Spilled(path, os.stat(path).st_size, owned=False)
        except OSError as err:
            return err
    assert reading.folder is not None, "a spilling Reading names its folder"
    folder = reading.folder

    def stream() -> Spilled:
        with fs.open(path, "rb") as f:
            return spill_stream(f, int(fs.size(path)), folder)

    try:
        return with_retries(stream)
    except (*transient_errors(), EOFError) as err:
        return err

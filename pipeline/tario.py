"""Reading and writing WebDataset tar shards: pure helpers over file objects.

Members are `<key>.<ext>`; a sample is the run of consecutive members sharing a key. Written
tars are deterministic (sorted extensions, zero mtimes and owners) so a rerun is byte-identical.
"""

from __future__ import annotations

import io
import re
import tarfile
from collections.abc import Iterable, Iterator
from typing import IO, Any

# Columns that become tar members; everything else stays in the signatures table.
MEMBER_COLUMNS = (
    *("jpg", "png", "webp", "gif", "bmp", "tiff", "txt", "json", "cls"),
    *("mp4", "webm", "avi", "mkv", "mov"),
)
FRAME_MEMBER = re.compile(r"^\d{3}\.jpg$")  # sampled video frames: <key>.000.jpg, ...
EXT_ALIASES = {"jpeg": "jpg", "tif": "tiff"}


def split_member_name(name: str) -> tuple[str, str]:
    """`dir/abc.def.jpg` -> (`dir/abc`, `def.jpg`): WebDataset's key/extension rule."""
    folder, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    key = f"{folder}/{stem}" if folder else stem
    return key, ext.lower() if dot else ""


def iter_tar_samples(
    fileobj: IO[bytes], start: int = 0, stop: int | None = None
) -> Iterator[dict[str, Any]]:
    """Stream samples [start, stop) from a tar: dicts of `__key__` plus raw bytes per
    extension. Earlier samples are skipped without reading their data; reading ends at `stop`."""
    index, key, current = -1, None, None
    with tarfile.open(fileobj=fileobj, mode="r|*") as tar:
        for member in tar:
            if not member.isfile():
                continue
            name, ext = split_member_name(member.name)
            if name != key:
                if current is not None:
                    yield current
                index, key, current = index + 1, name, None
                if stop is not None and index >= stop:
                    return
                if index >= start:
                    current = {"__key__": name}
            if current is not None:
                current[EXT_ALIASES.get(ext, ext)] = tar.extractfile(member).read()
    if current is not None:
        yield current


def sample_members(sample: dict[str, Any]) -> list[tuple[str, bytes]]:
    """The (member name, bytes) pairs a sample writes, extensions sorted."""
    members = []
    columns = [c for c in sample if c in MEMBER_COLUMNS or FRAME_MEMBER.match(c)]
    for col in sorted(c for c in columns if sample.get(c) is not None):
        value = sample[col]
        data = value.encode("utf-8") if isinstance(value, str) else bytes(value)
        members.append((f"{sample['__key__']}.{col}", data))
    return members


def add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o444
    info.mtime = 0
    tar.addfile(info, io.BytesIO(data))


def write_tar(samples: Iterable[dict[str, Any]], fileobj: IO[bytes]) -> list[tuple[int, int]]:
    """Write samples as one tar (PAX, uncompressed); returns each sample's (offset, length).

    A sample's span holds its members' headers and padded data, so spans can be copied from
    one tar into another byte for byte (the final shards are assembled that way).
    """
    spans = []
    with tarfile.open(fileobj=fileobj, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for sample in samples:
            start = tar.offset
            for name, data in sample_members(sample):
                add_member(tar, name, data)
            spans.append((start, tar.offset - start))
    return spans

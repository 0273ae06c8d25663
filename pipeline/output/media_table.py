"""The table of a run's stored payloads (digest -> partition, offset, size) behind content-
addressed media (pipeline/output/media_index.py), bounded by `output.copies_index_bytes`, and
the digests and names it is keyed by."""

from __future__ import annotations

import hashlib
import threading

from mmcurate.core.spill import COPY_BLOCK, Media, Spilled
from mmcurate.core.tar_writer import BLOCK, member_header
from mmcurate.pipeline.output.names import part_file

ENTRY_BYTES = 200  # about what one digest and its location hold in the table (measured)


DIGEST_BYTES = 16  # of sha256: a collision needs ~2**64 distinct payloads


MIN_PAYLOAD = 512  # smaller payloads are always stored: a reference would save next to nothing


Location = tuple[int, int, int]  # (partition, payload offset in its candidate tar, size)


def media_name(part: int) -> str:
    """`candidates/part-000000.media.parquet`: a partition's payload digests and references."""
    return part_file(part, "media.parquet")


def payload_digest(data: Media) -> bytes:
    """sha256 (first DIGEST_BYTES) of a member's payload; a spilled file read in blocks."""
    digest = hashlib.sha256()
    if isinstance(data, Spilled):
        with data.open() as f:
            while block := f.read(COPY_BLOCK):
                digest.update(block)
    else:
        digest.update(data)
    return digest.digest()[:DIGEST_BYTES]


def record_bytes(name: str, size: int) -> int:
    """Bytes of one tar member: header, payload, padding."""
    return len(member_header(name, size)) + size + -size % BLOCK


class MediaTable:
    """digest -> Location of stored payloads. A partition's task registers its payloads as
    pending; the driver commits them when the task's result arrives, so a task that runs
    again (its worker died after it wrote) replaces its pending entries, and nothing ever
    refers to a tar that its rerun rewrites. The first committed location of a digest wins.
    At `limit` entries it takes no more (its memory stays bounded; later payloads are stored)."""

    def __init__(self, limit: int = 5_000_000) -> None:
        self.found: dict[bytes, Location] = {}
        self.limit = limit
        self.pending: dict[int, list[tuple[bytes, int, int, int]]] = {}
        self.lock = threading.Lock()

    def lookup(self, digests: list[bytes]) -> list[Location | None]:
        with self.lock:
            return [self.found.get(d) for d in digests]

    def register(self, request: tuple[int, list[tuple[bytes, int, int, int]]]) -> int:
        part, entries = request
        with self.lock:
            self.pending[part] = entries
            return len(entries)

    def commit(self, parts: list[int]) -> int:
        with self.lock:
            for part in parts:
                for digest, *loc in self.pending.pop(part, []):
                    if len(self.found) < self.limit:
                        self.found.setdefault(digest, (loc[0], loc[1], loc[2]))
            return len(self.found)

    def load(self, entries: list[tuple[bytes, int, int, int]]) -> int:
        """Done partitions' payloads (resume): committed at once."""
        with self.lock:
            for digest, part, offset, size in entries[: max(0, self.limit - len(self.found))]:
                self.found.setdefault(digest, (part, offset, size))
            return len(self.found)

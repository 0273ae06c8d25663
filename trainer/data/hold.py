"""Raw samples a loader worker keeps until their turn, bounded in bytes.

The shuffle buffer holds read-ahead samples until the plan emits them, and a streamed shard
being verified holds its samples until the shard's bytes have matched the manifest. Both are
a `SampleStore`: samples stay in memory while the store's in-memory bytes are within its
limit; the media of further samples wait in files of a local folder (core/spill.py) and are
read back when taken. So the order of emission never depends on sample sizes (an exact
resume needs only the count of batches taken), and the memory held does not grow with them.
"""

from __future__ import annotations

from typing import Any

from mmcurate.core.spill import (
    Spilled,
    media_bytes,
    release,
    remove_folder,
    spill_bytes,
    spill_folder,
)

DEFAULT_LIMIT = 64 << 20  # in-memory bytes of one store when no limit is given
SMALL = 512  # values up to this size stay in memory even past the limit (captions, keys)


def sample_bytes(sample: dict[str, Any] | None) -> int:
    """In-memory bytes of a raw sample's values (what holding it costs)."""
    if sample is None:
        return 0
    return sum(len(v) for v in sample.values() if isinstance(v, (bytes, bytearray, str)))


class SampleStore:
    """Samples by key (a position), in memory up to `limit` bytes, then their media on disk."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = DEFAULT_LIMIT if limit is None else limit
        self.held: dict[int, dict[str, Any] | None] = {}
        self.bytes = 0  # in memory now
        self.peak = 0  # the most in memory at once
        self.spilled = 0  # samples whose media went to disk
        self._sizes: dict[int, int] = {}  # in-memory bytes of each held sample
        self._folder: str | None = None

    def __contains__(self, key: int) -> bool:
        return key in self.held

    def __len__(self) -> int:
        return len(self.held)

    def put(self, key: int, sample: dict[str, Any] | None) -> None:
        size = sample_bytes(sample)
        if sample is not None and self.bytes + size > self.limit:
            sample = self._spill(sample)
            size = sample_bytes(sample)
        self.held[key] = sample
        self._sizes[key] = size
        self.bytes += size
        self.peak = max(self.peak, self.bytes)

    def pop(self, key: int) -> dict[str, Any] | None:
        sample = self.held.pop(key)
        self.bytes -= self._sizes.pop(key)
        if sample is None or not any(isinstance(v, Spilled) for v in sample.values()):
            return sample
        back = {name: media_bytes(value) for name, value in sample.items()}
        release(sample.values())
        return back

    def _spill(self, sample: dict[str, Any]) -> dict[str, Any]:
        if self._folder is None:
            self._folder = spill_folder()
        out = {}
        for name, value in sample.items():
            big = isinstance(value, (bytes, bytearray)) and len(value) > SMALL
            out[name] = spill_bytes(bytes(value), self._folder) if big else value
        self.spilled += any(isinstance(v, Spilled) for v in out.values())
        return out

    def close(self) -> None:
        """Remove what is on disk (the store is empty afterwards)."""
        for sample in self.held.values():
            if sample is not None:
                release(sample.values())
        self.held.clear()
        self._sizes.clear()
        self.bytes = 0
        if self._folder is not None:
            remove_folder(self._folder)
            self._folder = None

"""What a final shard is called, how its tar ends, and what a planned shard is (`ShardSpec`):
the facts the shard plan (pipeline/output/layout.py), the shard writer
(pipeline/output/shards.py), the grow commands and publishing (pipeline/output/publish.py)
share. Below all of them, so the plan and publishing need not import the writer (which would
close a cycle through its task markers and the build's claim)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

TAR_END_BYTES = 1024  # two zero blocks close a tar

Span = tuple[str, int, int]  # a sample's (key, offset, length) in its candidate tar
PartSpans = tuple[int, list[Span]]  # a candidate partition and its samples' spans, in order
Refs = dict[int, dict[str, list[dict[str, Any]]]]  # partition -> key -> its references
PERSISTED = ("name", "samples", "start", "stop", "parts", "fields", "json_keys")


def shard_name(index: int) -> str:
    return f"shard-{index:06d}.tar"


@dataclass(frozen=True)
class ShardSpec:
    """One planned shard. The build's plan gives `start`/`stop` (a range of positions in the
    kept rows, output order); its shard task resolves them into `parts` (and `refs`, the
    references of samples whose payloads are stored elsewhere, pipeline/output/shard_refs.py).
    The grow commands plan `parts` directly. `fields`/`json_keys`: the build's one metadata
    schema and json key set (pipeline/output/shard_metadata.py); None: this shard's own."""

    name: str
    samples: int
    start: int | None = None
    stop: int | None = None
    parts: tuple[PartSpans, ...] = ()
    fields: dict[str, str] | None = None
    json_keys: list[str] | None = None
    refs: Refs = field(default_factory=dict)

    def replace(self, **changes: Any) -> ShardSpec:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form a grow plan stores (plan.json, read back by a resume): the keys the
        spec dicts had, in their order, those unset left out; never `refs` (made per task)."""
        values = {name: getattr(self, name) for name in PERSISTED}
        values["parts"] = [[part, [list(span) for span in spans]] for part, spans in self.parts]
        return {name: value for name, value in values.items() if value is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ShardSpec:
        parts = tuple(
            (int(part), [(str(k), int(o), int(n)) for k, o, n in spans])
            for part, spans in data.get("parts") or []
        )
        known = {name: data.get(name) for name in ("start", "stop", "fields", "json_keys")}
        return cls(data["name"], int(data["samples"]), parts=parts, **known)

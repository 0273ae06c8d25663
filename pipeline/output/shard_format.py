"""What a final shard is called and how its tar ends: the facts the shard plan
(pipeline/output/layout.py), the shard writer (pipeline/output/shards.py) and publishing
(pipeline/output/publish.py) share. Below all three, so the plan and publishing need not
import the writer (which would close a cycle through its task markers and the build's claim)."""

from __future__ import annotations

TAR_END_BYTES = 1024  # two zero blocks close a tar


def shard_name(index: int) -> str:
    return f"shard-{index:06d}.tar"

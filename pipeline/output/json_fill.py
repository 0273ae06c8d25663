"""Stable json keys across a build: every sample's `.json` in the final shards carries the
union of the build's json keys, a key a sample lacks written as null (as img2dataset does).

Why: Hugging Face `datasets` reads a webdataset's features from its first shard's samples;
a key that first appears in a later shard (a sidecar's `license` in some samples only) comes
back None for every sample, with no word. With one key set in every json, the first shard
already names them all.

How, without moving media: phase A records where each live sample's json member starts in
its record (`__json_at__`, candidate metadata; members are in sorted extension order) and
the json keys of each partition (the metadata file's footer). Before phase C the driver
merges the partitions' key lists (O(partitions) footers, never the rows). A shard task then
rebuilds only the records whose json lacks a key: the candidate's bytes before the json
member, a new json member (header, text, padding), the candidate's bytes after it. A sample
with no json gets one (all keys null); a json that is not an object is left as it is.
"""

from __future__ import annotations

import json
from typing import Any

from mmcurate.core.formats import meta_json
from mmcurate.core.tar_writer import BLOCK, member_header

JSON_AT = "__json_at__"  # candidate metadata: the json member's offset in the sample's record
Piece = tuple[int, int, int] | bytes  # (candidate partition, start, end), or bytes to write
Fill = tuple[int, int, bytes]  # (json member's offset in the record, its old bytes, new member)


def json_keys(text: str | None) -> list[str]:
    """The keys of a json text that is an object; [] for anything else."""
    try:
        value = json.loads(text) if text else None
    except (ValueError, RecursionError):
        return []
    return list(value) if isinstance(value, dict) else []


def filled_json(text: str | None, keys: list[str]) -> str | None:
    """The json text with every one of `keys` it lacks added as null (after its own keys, in
    the given order); None when nothing is missing or the text is not a JSON object."""
    if not keys:
        return None
    if not text:
        return meta_json(dict.fromkeys(keys))
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict):
        return None
    missing = [key for key in keys if key not in value]
    return meta_json(value | dict.fromkeys(missing)) if missing else None


def member_record(name: str, data: bytes) -> bytes:
    """A whole tar member: header, data, padding (as core.tar_writer writes it)."""
    return member_header(name, len(data)) + data + b"\0" * (-len(data) % BLOCK)


def record_fill(record: dict[str, Any], keys: list[str]) -> Fill | None:
    """How one sample's record changes (None: it does not). Needs its `__json_at__`
    (candidates written before it was recorded are left as they are)."""
    at, text = record.get(JSON_AT), record.get("json")
    new = None if at is None else filled_json(text, keys)
    if new is None:
        return None
    name = f"{record['__key__']}.json"
    old = len(member_record(name, text.encode("utf-8"))) if text else 0
    return int(at), old, member_record(name, new.encode("utf-8"))


def shard_fills(
    parts: list[tuple[int, list]], records: dict[int, dict[str, dict]], keys: list[str]
) -> dict[int, dict[str, Fill]]:
    """Per partition of a shard spec, the fills of its samples whose json lacks a key."""
    fills: dict[int, dict[str, Fill]] = {}
    for part, spans in parts:
        for key, _, _ in spans:
            fill = record_fill(records[part][key], keys)
            if fill is not None:
                fills.setdefault(part, {})[key] = fill
    return fills


def piece_size(piece: Piece) -> int:
    return len(piece) if isinstance(piece, bytes) else piece[2] - piece[1]


def slice_pieces(pieces: list[Piece], start: int, end: int) -> list[Piece]:
    """Bytes [start, end) of the record the pieces make, as pieces."""
    out: list[Piece] = []
    pos = 0
    for piece in pieces:
        size = piece_size(piece)
        lo, hi = max(start, pos) - pos, min(end, pos + size) - pos
        if lo < hi:
            out.append(
                piece[lo:hi]
                if isinstance(piece, bytes)
                else (piece[0], piece[1] + lo, piece[1] + hi)
            )
        pos += size
    return out


def apply_fill(pieces: list[Piece], fill: Fill) -> list[Piece]:
    """A record's pieces with its json member (`old` bytes at `at`) replaced by the new one."""
    at, old, new = fill
    total = sum(piece_size(p) for p in pieces)
    return [*slice_pieces(pieces, 0, at), new, *slice_pieces(pieces, at + old, total)]

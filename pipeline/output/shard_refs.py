"""Phase C for samples whose media payloads are references (pipeline/output/media_index.py).

A referring sample's span in its own candidate holds its members except the referenced
payloads; its record in a shard is rebuilt in member order: its own bytes up to each
reference's place (`at`), then the member's header (made for the sample's own key exactly as
the tar writer makes it), the payload copied by ranged read from the candidate holding it,
and the padding; then the rest of its own bytes. So the shard is byte for byte what it was
when every payload was written in place (tests/core/test_storage_peak.py).

Which partitions refer to which is in their done markers (`referring`): a candidate that a
later shard reads through a reference is retired only after that shard (pipeline/output/retire.py).
"""

from __future__ import annotations

import bisect
from typing import Any

import pyarrow.compute as pc
from mmcurate.core.storage import join
from mmcurate.core.tar_writer import BLOCK, member_header
from mmcurate.pipeline.output.claim import Claim
from mmcurate.pipeline.output.groups import Groups, read_parquet
from mmcurate.pipeline.output.json_fill import Fill, apply_fill
from mmcurate.pipeline.output.media_table import media_name, record_bytes
from mmcurate.pipeline.output.shard_format import ShardSpec

Piece = tuple[int, int, int] | bytes  # (candidate partition, start, end), or bytes to write
REF_COLUMNS = ["key", "ext", "stored", "part", "offset", "size", "at"]


def referring_parts(claim: Claim) -> dict[int, list[int]]:
    """Partitions holding references -> the other partitions they refer to (done markers)."""
    from mmcurate.pipeline.output.markers import done_records

    found = {}
    for record in done_records(claim, "parts").values():
        if record.get("media_refs"):
            found[int(record["part"])] = [int(p) for p in record.get("refers", [])]
    return found


def read_refs(
    candidates_url: str, part: int, storage_options: dict, keys: set[str] | None = None
) -> dict[str, list[dict[str, Any]]]:
    """A partition's references by sample key, in member order (of `keys` only, if given)."""
    table = read_parquet(join(candidates_url, media_name(part)), storage_options, REF_COLUMNS)
    refs: dict[str, list[dict[str, Any]]] = {}
    for row in table.filter(pc.invert(table["stored"])).to_pylist():
        if keys is None or row["key"] in keys:
            refs.setdefault(row["key"], []).append(row)
    return refs


def with_refs(
    spec: ShardSpec, candidates_url: str, referring: set[int], storage_options: dict
) -> ShardSpec:
    """`spec` with `refs`: per partition of it that refers, its samples' references."""
    refs = {}
    for part, spans in spec.parts:
        if part in referring:
            keys = {key for key, _, _ in spans}
            found = read_refs(candidates_url, part, storage_options, keys)
            if found:
                refs[part] = found
    return spec.replace(refs=refs)


def sample_pieces(part: int, span: tuple[str, int, int], refs: list[dict]) -> list[Piece]:
    """One sample's record as pieces: its own bytes around each referenced member's header,
    payload (from where it is stored) and padding."""
    key, offset, length = span
    own = length - sum(record_bytes(f"{key}.{r['ext']}", r["size"]) for r in refs)
    pieces: list[Piece] = []
    done = 0  # own bytes placed
    for ref in refs:
        if ref["at"] > done:
            pieces.append((part, offset + done, offset + ref["at"]))
            done = ref["at"]
        size = ref["size"]
        pieces.append(member_header(f"{key}.{ref['ext']}", size))
        pieces.append((ref["part"], ref["offset"], ref["offset"] + size))
        if size % BLOCK:
            pieces.append(b"\0" * (-size % BLOCK))
    if own > done:
        pieces.append((part, offset + done, offset + own))
    return pieces


def part_pieces(
    part: int, spans: list, refs: dict[str, list[dict]], fills: dict[str, Fill] | None = None
) -> list[Piece]:
    """A partition's spans as pieces, adjacent ranges of one candidate joined; a sample with
    a fill gets its new json member (pipeline/output/json_fill.py)."""
    pieces: list[Piece] = []
    for span in spans:
        found = refs.get(span[0])
        more = sample_pieces(part, span, found) if found else [(part, span[1], span[1] + span[2])]
        if fills and span[0] in fills:
            more = apply_fill(more, fills[span[0]])
        for piece in more:
            last = pieces[-1] if pieces else None
            if isinstance(piece, tuple) and isinstance(last, tuple) and last[0] == piece[0]:
                if last[2] == piece[1]:
                    pieces[-1] = (last[0], last[1], piece[2])
                    continue
            pieces.append(piece)
    return pieces


def runs_of(pieces: list[Piece]) -> list[tuple[int, list[tuple[int, int]]] | bytes]:
    """Pieces grouped for copying: consecutive ranges of one candidate as (part, runs)."""
    groups: list[tuple[int, list[tuple[int, int]]] | bytes] = []
    for piece in pieces:
        if isinstance(piece, bytes):
            groups.append(piece)
            continue
        last = groups[-1] if groups else None
        if isinstance(last, tuple) and last[0] == piece[0]:
            last[1].append((piece[1], piece[2]))
        else:
            groups.append((piece[0], [(piece[1], piece[2])]))
    return groups


# ---- retirement: which shards read a candidate through references ---------------------------


def referred_shards(
    groups: Groups, group: int, parts: list[int], first: int, shard_starts: list[int]
) -> tuple[dict[int, list[int]], list[int]]:
    """Task body: for the group's referring `parts`, the other candidates their kept samples
    read payloads from -> the shards (indexes) that read them; and which of `parts` have a
    kept sample with references (only those partitions' references are read in phase C; a
    dedupe's dropped copies cost nothing there). `first`: the group's first global kept
    position."""
    kept = read_parquet(groups.kept_url(group), groups.storage_options, ["__key__", "__part__"])
    wanted = set(parts)
    owners, keys = kept["__part__"].to_pylist(), kept["__key__"].to_pylist()
    position = {(p, k): i for i, (p, k) in enumerate(zip(owners, keys, strict=True)) if p in wanted}
    candidates = join(groups.work_url, "candidates")
    found: dict[int, set[int]] = {}
    reading = set()  # partitions with a kept sample that has references: shards read their refs
    for part in parts:
        for key, refs in read_refs(candidates, part, groups.storage_options).items():
            at = position.get((part, key))
            if at is None:
                continue  # dropped
            reading.add(part)
            shard = bisect.bisect_right(shard_starts, first + at) - 1
            for ref in refs:
                if ref["part"] != part:
                    found.setdefault(ref["part"], set()).add(shard)
    return {q: sorted(shards) for q, shards in found.items()}, sorted(reading)

"""Phase A's candidate tar, written as a partition's chunks arrive (pipeline/phase_a.py).

Only light rows stay in memory: every sample's row without its media, a live one with its
byte span in the candidate; each chunk's media is written, its spilled files released, and
the chunk emptied before the next is read. A media payload the build already stored (in a
done partition's candidate, or earlier in this one) is not written again: the sample refers
to it (pipeline/output/media_index.py), and its span's `__bytes__` still counts the whole record it
takes in a shard, so shard planning is the same as when every payload is written in place.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from mmcurate.core.atomic import open_atomic
from mmcurate.core.formats import is_media_column
from mmcurate.core.spill import Media, Spilled, media_size, release
from mmcurate.core.storage import filesystem
from mmcurate.core.tar_writer import BLOCK, TarWriter, sample_media, write_member
from mmcurate.pipeline.output.claim import Claim
from mmcurate.pipeline.output.json_fill import JSON_AT
from mmcurate.pipeline.output.media_index import PartitionMedia, addressed
from mmcurate.pipeline.output.media_table import payload_digest, record_bytes
from mmcurate.pipeline.sources.samples import spilled_in
from mmcurate.stages.base import DROP, Stage


class ClaimLost(Exception):
    """Raised inside the candidate's open_atomic block: another run holds the output now, so
    the candidate is not published."""


def noted(chunk: dict, inputs: deque[list[Spilled]]) -> dict:
    """Note a chunk's Spilled values before the stages run (one that drops a sample clears
    its media, and the file must still be released)."""
    inputs.append(spilled_in(chunk))
    return chunk


def write_candidate(
    chunks: Iterator[dict],
    inputs: deque[list[Spilled]],
    url: str,
    storage_options: dict,
    claim: Claim,
    media: PartitionMedia | None = None,
) -> list[dict[str, Any]]:
    """The partition's live samples as one tar, written a chunk at a time as chunks arrive
    (each chunk's spilled files released once it is written); returns every sample's row
    without its media, a live one with its byte span (`__offset__`, `__bytes__`: the bytes
    its record takes in a shard). Published only if this run still holds the output when the
    tar is complete. With `media`, payloads already stored are referred to, not written."""
    fs, path = filesystem(url, storage_options)
    rows: list[dict[str, Any]] = []
    with open_atomic(fs, path) as out:
        writer = TarWriter(out)
        for chunk in chunks:
            rows.extend(write_chunk(writer, chunk, media))
            release([*inputs.popleft(), *spilled_in(chunk)])
            chunk.clear()  # its media: gone before the next chunk is read
        writer.close()
        if not claim.holds():
            raise ClaimLost  # inside the block: the temporary is dropped, nothing published
    return rows


def write_chunk(
    writer: TarWriter, chunk: dict, media: PartitionMedia | None = None
) -> list[dict[str, Any]]:
    """Write a chunk's live samples; returns its rows without media (a dropped one without
    its caption and json either: only live samples' go into the candidate metadata)."""
    samples = [
        dict(zip(chunk, values, strict=True)) for values in zip(*chunk.values(), strict=True)
    ]
    members = None if media is None else addressed_members(samples)
    found = {} if media is None else media.look_up([d for m in members for *_, d in m if d])
    rows = []
    for i, sample in enumerate(samples):
        live = sample[DROP] is None
        row = {
            c: v
            for c, v in sample.items()
            if not is_media_column(c) and (live or c not in ("txt", "json"))
        }
        if live:
            row[JSON_AT] = json_offset(sample)
        if live and media is None:
            row["__offset__"], row["__bytes__"] = writer.add(sample)
        elif live:
            span = add_addressed(writer, sample["__key__"], members[i], media, found)
            row["__offset__"], row["__bytes__"] = span
        rows.append(row)
    return rows


Member = tuple[str, str, Media, bytes | None]  # name, extension, payload, digest


def json_offset(sample: dict[str, Any]) -> int:
    """Where the sample's json member starts in its record, or would start (members are in
    sorted extension order): phase C rewrites it there without reading the tar
    (pipeline/output/json_fill.py)."""
    at, cut = 0, len(sample["__key__"]) + 1
    for name, data in sample_media(sample):
        if name[cut:] >= "json":
            break
        at += record_bytes(name, media_size(data))
    return at


def addressed_members(samples: list[dict[str, Any]]) -> list[list[Member]]:
    """Per sample (none for a dropped one), its members in tar order, media payloads with
    their digests."""
    out: list[list[Member]] = []
    for sample in samples:
        members: list[Member] = []
        if sample[DROP] is None:
            cut = len(sample["__key__"]) + 1
            for name, data in sample_media(sample):
                ext = name[cut:]
                wanted = is_media_column(ext) and addressed(data)
                members.append((name, ext, data, payload_digest(data) if wanted else None))
        out.append(members)
    return out


def add_addressed(
    writer: TarWriter, key: str, members: list[Member], media: PartitionMedia, found: dict
) -> tuple[int, int]:
    """One sample: each payload already stored becomes a reference (placed by the bytes of the
    sample's own span before it), the rest is written. Returns (offset, bytes in a shard)."""
    start, referred = writer.offset, 0
    for name, ext, data, digest in members:
        size = media_size(data)
        loc = None if digest is None else media.place(digest, size, found)
        if loc is not None:
            media.referred(key, ext, digest, loc, writer.offset - start)
            referred += record_bytes(name, size)
            continue
        at = writer.offset
        written = write_member(writer.fileobj, name, data)
        writer.offset += written
        if digest is not None:  # the payload starts after the header
            media.stored(key, ext, digest, at + written - size - (-size % BLOCK), size)
    return start, writer.offset - start + referred


def apply(chunk: dict, stages: list[Stage]) -> dict:
    for stage in stages:
        chunk = stage(chunk)
    return chunk


def run_chain(chunks: Iterator[dict], stages: list[Stage]) -> Iterator[dict]:
    """Run the stages over chunks, one output chunk per input chunk, in order; leading
    I/O-bound stages (download) work one chunk ahead in a thread, so the network wait
    overlaps the CPU work on the previous chunk."""
    lead = 0
    while lead < len(stages) and stages[lead].io_bound:
        lead += 1
    if lead == 0:  # map, not a generator expression: it holds no chunk while reading the next
        yield from map(partial(apply, stages=stages), chunks)
        return
    with ThreadPoolExecutor(1, thread_name_prefix="io-ahead") as ahead:
        pending = None
        for chunk in chunks:
            submitted = ahead.submit(apply, chunk, stages[:lead])
            if pending is not None:
                yield apply(pending.result(), stages[lead:])
            pending = submitted
        if pending is not None:
            yield apply(pending.result(), stages[lead:])

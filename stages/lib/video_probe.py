"""Look at a video's header without reading the video: a media value (bytes or a Spilled
file) is opened as a file object (`core.spill.open_media`) and only the boxes a probe needs
are read, so a multi-GB file costs a few reads. Decoders open it by `media_source`.

- `refuse_images`: a still image under a video's name (its first 16 bytes)
- `may_be_rotated`: the rotation screen (MP4/MOV track headers, a Matroska's first MiB)
- `display_rotation`: the first frame's rotation, decoded by PyAV
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import IO

from mmcurate.core.spill import Media, Spilled, media_size, open_media

# An MP4/MOV track header's matrix when the track is shown as stored (16.16 and 2.30 fixed)
IDENTITY = bytes.fromhex("00010000" + "00000000" * 3 + "00010000" + "00000000" * 3 + "40000000")
ISO_BOXES = (b"ftyp", b"moov", b"mdat", b"free", b"wide", b"skip")
EBML_MAGIC = b"\x1a\x45\xdf\xa3"
PROJECTION_POSE_ROLL = b"\x76\x75"  # Matroska's element for a rotated picture
MATROSKA_CLUSTER = b"\x1f\x43\xb6\x75"  # the media starts here
MATROSKA_HEAD = 1 << 20  # the track headers are looked for in the first MiB
TKHD_BYTES = 4 + 32 + 16 + 36  # version/flags, v1 times, reserved/layer/group/volume, matrix


class NoVideoStream(Exception):
    pass


def media_source(value: Media) -> str | IO[bytes]:
    """What decord and PyAV open: a Spilled file by its path (FFmpeg reads and seeks in it
    natively, nothing is copied), bytes as an in-memory file."""
    return value.path if isinstance(value, Spilled) else io.BytesIO(value)


def head_bytes(value: Media, size: int) -> bytes:
    with open_media(value) as f:
        return f.read(size)


def refuse_images(value: Media) -> None:
    """NoVideoStream for a still image under a video's name (a JPEG saved as .mp4): FFmpeg
    opens it as a one-frame video, and the build kept a `.mp4` member holding a JPEG."""
    from mmcurate.stages.lib.http_fetch import sniff  # the image signatures downloads check

    if sniff(head_bytes(value, 16)) is not None:
        raise NoVideoStream("an image, not a video")


def may_be_rotated(value: Media) -> bool:
    """A screen that spares most videos the decode `display_rotation` needs: False only where
    no rotation can be recorded: an MP4/MOV whose every track header (`moov/trak/tkhd`, found
    by walking the boxes, never reading the media) holds the identity matrix, a
    Matroska/WebM without the element that records a roll. Anything unclear says True."""
    with open_media(value) as f:
        head = f.read(8)
        if head[4:8] in ISO_BOXES:
            headers = list(track_headers(f, media_size(value)))
            return not headers or any(not identity_matrix(tkhd) for tkhd in headers)
        if head.startswith(EBML_MAGIC):  # the track headers come before the first cluster
            data = head + f.read(MATROSKA_HEAD - len(head))
            first_cluster = data.find(MATROSKA_CLUSTER)
            return PROJECTION_POSE_ROLL in data[: first_cluster if first_cluster > 0 else None]
    return True


def iso_boxes(f: IO[bytes], start: int, end: int) -> Iterator[tuple[bytes, int, int]]:
    """(type, payload start, end) of the ISO BMFF boxes between `start` and `end`, reading
    only each box's header (a seek past its payload)."""
    at = start
    while at + 8 <= end:
        f.seek(at)
        head = f.read(16)
        size, kind, header = int.from_bytes(head[:4], "big"), head[4:8], 8
        if len(head) < 8:
            return
        if size == 1:  # a 64-bit size follows
            size, header = int.from_bytes(head[8:16], "big"), 16
        elif size == 0:  # to the end
            size = end - at
        if size < header:
            return
        yield kind, at + header, min(at + size, end)
        at += size


def track_headers(f: IO[bytes], size: int) -> Iterator[bytes]:
    """The first bytes (up to the matrix) of each `moov/trak/tkhd` payload."""
    for kind, start, end in iso_boxes(f, 0, size):
        if kind != b"moov":
            continue
        for trak, t_start, t_end in iso_boxes(f, start, end):
            if trak != b"trak":
                continue
            for box, at, box_end in iso_boxes(f, t_start, t_end):
                if box == b"tkhd":
                    f.seek(at)
                    yield f.read(min(TKHD_BYTES, box_end - at))


def identity_matrix(payload: bytes) -> bool:
    """Whether a tkhd payload shows its track as stored."""
    times = 32 if payload[:1] == b"\x01" else 20  # version 1: 64-bit times
    start = 4 + times + 16  # version/flags, times, reserved, layer, group, volume
    return payload[start : start + 36] == IDENTITY


def display_rotation(value: Media) -> int:
    """The first frame's display rotation in degrees (0 for none, or when PyAV cannot read
    the file: then decord, and PyAV after it, report the error)."""
    import av

    try:
        with av.open(media_source(value)) as box:
            if not box.streams.video:
                return 0
            frame = next(box.decode(box.streams.video[0]), None)
    except av.error.FFmpegError:
        return 0
    return int(round(getattr(frame, "rotation", 0) or 0)) % 360 if frame is not None else 0

"""Test and demo videos made with PyAV: moving pictures with the frame number drawn in.

Each frame shows a moving gradient and, in its top band, the frame number as 12 black/white
blocks (bit 11 first), big enough to survive lossy codecs, so a test can read back which frame
a decoder returned. Broken kinds: truncated, zero-byte, audio-only, and an AVI whose header
claims far more frames than it holds.
"""

from __future__ import annotations

import io
import struct
from fractions import Fraction

import av
import numpy as np

BITS = 12
BLOCK = 16  # px per bit block (width needs BITS * BLOCK)


def frame_pixels(index: int, width: int, height: int, scene: int = 0) -> np.ndarray:
    """An RGB frame: a gradient that moves with `index`, the number in blocks at the top.
    Each `scene` has its own look (colours, direction), so scene changes are hard cuts."""
    x = np.arange(width)[None, :]
    y = np.arange(height)[:, None]
    base = ((x * (2 + scene) + y * (1 + 3 * scene) + index * 7) % 256).astype(np.uint8)
    channels = [base, np.roll(base, index * 3, axis=1), 255 - base]
    channels = channels[scene % 3 :] + channels[: scene % 3]
    if scene % 2:
        channels = [c // 3 for c in channels]
    frame = np.stack(channels, axis=-1)
    frame[:BLOCK] = 128
    for bit in range(BITS):
        on = (index >> (BITS - 1 - bit)) & 1
        frame[:BLOCK, bit * BLOCK : (bit + 1) * BLOCK] = 255 if on else 0
    return frame


def read_frame_number(pixels: np.ndarray) -> int:
    """The number drawn by `frame_pixels`, from a frame at its original size."""
    value = 0
    for bit in range(BITS):
        block = pixels[2 : BLOCK - 2, bit * BLOCK + 2 : (bit + 1) * BLOCK - 2]
        value = value * 2 + int(block.mean() > 128)
    return value


def encode_video(
    frames: int = 48,
    fps: int = 24,
    size: tuple[int, int] = (256, 144),
    codec: str = "libx264",
    container: str = "mp4",
    pixel_format: str = "yuv420p",
    cuts: tuple[int, ...] = (),
) -> bytes:
    """A video of `frames` numbered frames, in memory; a new scene starts at each of `cuts`."""
    out = io.BytesIO()
    with av.open(out, "w", format=container) as box:
        stream = box.add_stream(codec, rate=fps)
        stream.width, stream.height = size
        stream.pix_fmt = pixel_format
        if codec == "libx264":
            stream.options = {"preset": "ultrafast", "crf": "18"}
        for index in range(frames):
            scene = sum(1 for cut in cuts if index >= cut)
            pixels = frame_pixels(index, *size, scene=scene)
            image = av.VideoFrame.from_ndarray(pixels, format="rgb24")
            for packet in stream.encode(image):
                box.mux(packet)
        for packet in stream.encode():
            box.mux(packet)
    return out.getvalue()


def audio_only(seconds: float = 1.0) -> bytes:
    out = io.BytesIO()
    with av.open(out, "w", format="mp4") as box:
        stream = box.add_stream("aac", rate=44100)
        samples = int(44100 * seconds)
        tone = (np.sin(np.arange(samples) / 20.0) * 0.2).astype(np.float32)[None, :]
        frame = av.AudioFrame.from_ndarray(tone, format="fltp", layout="mono")
        frame.sample_rate = 44100
        frame.time_base = Fraction(1, 44100)
        frame.pts = 0
        for packet in stream.encode(frame):
            box.mux(packet)
        for packet in stream.encode():
            box.mux(packet)
    return out.getvalue()


def lying_avi(frames: int = 48, claimed: int = 5000) -> bytes:
    """An MPEG-4 AVI whose header (avih and strh) claims `claimed` frames."""
    data = bytearray(encode_video(frames, codec="mpeg4", container="avi"))
    avih = data.find(b"avih")
    struct.pack_into("<I", data, avih + 8 + 16, claimed)  # dwTotalFrames
    strh = data.find(b"strh")
    struct.pack_into("<I", data, strh + 8 + 32, claimed)  # dwLength
    return bytes(data)


def truncated(data: bytes, keep: float = 0.5) -> bytes:
    return data[: int(len(data) * keep)]


def write_padded(data: bytes, path: str, pad: int) -> int:
    """Write an MP4 to `path` with a top-level `free` box of `pad` bytes (4-byte size, b'free',
    zeros: MP4 readers skip it) just before its `moov`, so a reader must pass it to find the
    index; the zeros are a hole (sparse file), so a 1 GiB pad costs no disk. Sample offsets
    in `moov` point into `mdat`, which stays where it was. Returns the file's size."""
    moov = top_level_box(data, b"moov")
    if moov is None or not 8 <= pad < 1 << 32:
        raise ValueError("needs an MP4 with a moov box and 8 <= pad < 4 GiB")
    with open(path, "wb") as out:
        out.write(data[:moov])
        out.write(struct.pack(">I", pad) + b"free")
        out.seek(pad - 8, io.SEEK_CUR)  # the box's zeros: a hole
        out.write(data[moov:])
    return len(data) + pad


def top_level_box(data: bytes, kind: bytes) -> int | None:
    """Where the first top-level box of `kind` starts (32-bit sizes, as PyAV writes them)."""
    at = 0
    while at + 8 <= len(data):
        size = int.from_bytes(data[at : at + 4], "big")
        if data[at + 4 : at + 8] == kind:
            return at
        if size < 8:
            return None
        at += size
    return None

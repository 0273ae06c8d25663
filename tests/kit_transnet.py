"""Videos with known shot truth for clip_split tests: pans over real photos, cuts, fades, flash."""

import io

import av
import numpy as np
from PIL import Image
from skimage import data

FPS, SIZE = 25, (96, 54)
GRADUAL = 12  # frames of a dissolve or a fade


def pan(photo: np.ndarray, frames: int, step: tuple[int, int], seed: int) -> list[np.ndarray]:
    """A camera panning over `photo`: a 16:9 window a third of its width, moving `step`
    pixels a frame, shrunk to SIZE."""
    height, width = photo.shape[:2]
    crop_w = width // 3
    crop_h = crop_w * 9 // 16
    rng = np.random.default_rng(seed)
    x, y = int(rng.integers(0, width - crop_w)), int(rng.integers(0, height - crop_h))
    out = []
    for _ in range(frames):
        x = min(max(x + step[0], 0), width - crop_w)
        y = min(max(y + step[1], 0), height - crop_h)
        window = Image.fromarray(photo[y : y + crop_h, x : x + crop_w])
        out.append(np.asarray(window.resize(SIZE, Image.Resampling.BILINEAR)))
    return out


def photos() -> list[np.ndarray]:
    return [data.astronaut(), data.coffee(), data.chelsea(), data.rocket(), data.retina()[..., :3]]


def blend(a: np.ndarray, b: np.ndarray, weight: float) -> np.ndarray:
    return np.clip(a * (1 - weight) + b * weight, 0, 255).astype(np.uint8)


def edited_video() -> tuple[list[np.ndarray], list[int | None], list[int], list[range]]:
    """Frames, each frame's shot (None: a blended transition frame), the first frames after
    hard cuts, and the frame ranges of the gradual transitions. Five shots of 30 frames:
    cut, dissolve, cut, fade through black (out GRADUAL / 2 frames, in GRADUAL / 2)."""
    shots = [pan(p, 30 + GRADUAL, (3, 1), seed) for seed, p in enumerate(photos())]
    frames: list[np.ndarray] = []
    owner: list[int | None] = []
    cuts, gradual = [], []

    def add(pixels: list[np.ndarray], who: int | None) -> None:
        frames.extend(pixels)
        owner.extend([who] * len(pixels))

    add(shots[0][:30], 0)
    cuts.append(len(frames))
    add(shots[1][:30], 1)
    gradual.append(range(len(frames), len(frames) + GRADUAL))  # both shots move while mixed
    weights = [(i + 1) / (GRADUAL + 1) for i in range(GRADUAL)]
    add([blend(shots[1][30 + i], shots[2][i], w) for i, w in enumerate(weights)], None)
    add(shots[2][GRADUAL : GRADUAL + 30], 2)
    cuts.append(len(frames))
    add(shots[3][:30], 3)
    half, black = GRADUAL // 2, np.zeros_like(frames[0])
    gradual.append(range(len(frames), len(frames) + 2 * half))
    add([blend(shots[3][30 + i], black, (i + 1) / half) for i in range(half)], None)
    add([blend(black, shots[4][i], (i + 1) / (half + 1)) for i in range(half)], None)
    add(shots[4][half : half + 30], 4)
    return frames, owner, cuts, gradual


def flash_video() -> list[np.ndarray]:
    """One shot with a brightness flash: one frame brightened (x2.5 + 40) and back. Measured:
    a one-frame flash peaks at 0.34; held over 3 frames its edges score up to 0.68, so the
    flash check takes them back (tests/video/test_transnet_first_pass.py)."""
    frames = pan(data.coffee(), 60, (2, 0), 7)
    frames[29] = np.clip(frames[29].astype(np.float32) * 2.5 + 40, 0, 255).astype(np.uint8)
    return frames


def encode(frames: list[np.ndarray]) -> bytes:
    out = io.BytesIO()
    with av.open(out, "w", format="mp4") as box:
        stream = box.add_stream("libx264", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = SIZE[0], SIZE[1], "yuv420p"
        stream.options = {"crf": "18", "preset": "veryfast"}
        for pixels in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                box.mux(packet)
        for packet in stream.encode():
            box.mux(packet)
    return out.getvalue()

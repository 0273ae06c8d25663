"""Videos with known camera motion for motion_score tests: a photo's window moved, H.264 bytes."""

import io
from fractions import Fraction

import av
import numpy as np
from PIL import Image
from skimage import data

W, H, FPS, FRAMES = 128, 96, 25, 40


def photo(name: str = "astronaut", size: tuple[int, int] = (448, 448)) -> np.ndarray:
    return np.asarray(Image.fromarray(getattr(data, name)()).convert("RGB").resize(size))


def path_frames(kind: str, speed: float, name: str = "astronaut", seed: int = 0) -> list:
    """FRAMES crops W x H of a photo whose window moves `speed` px a frame (zoom: the crop
    shrinks `speed` px of width a frame and is resized up; shake: jitter of `speed` px)."""
    image = photo(name)
    cy, cx = image.shape[0] // 2, image.shape[1] // 2
    rng = np.random.default_rng(seed)
    out = []
    for i in range(FRAMES):
        s = (i - FRAMES / 2) * speed
        dx, dy, w = {
            "pan_right": (s, 0, W),
            "pan_left": (-s, 0, W),
            "tilt_down": (0, s, W),
            "tilt_up": (0, -s, W),
            "zoom_in": (0, 0, 2.5 * W - i * speed),
            "zoom_out": (0, 0, 2.5 * W - (FRAMES - i) * speed),
            "static": (0, 0, W),
            "shake": (*rng.uniform(-speed, speed, 2), W),
        }[kind]
        h = w * H / W
        box = (cx + dx - w / 2, cy + dy - h / 2, cx + dx + w / 2, cy + dy + h / 2)
        crop = Image.fromarray(image).resize((W, H), Image.Resampling.BILINEAR, box=box)
        out.append(np.asarray(crop))
    return out


def encode(frames: list, codec: str = "libx264", fmt: str = "mp4", **options: str) -> bytes:
    out = io.BytesIO()
    with av.open(out, "w", format=fmt) as box:
        stream = box.add_stream(codec, rate=Fraction(FPS))
        stream.width, stream.height = frames[0].shape[1], frames[0].shape[0]
        stream.pix_fmt = "yuvj420p" if codec == "mjpeg" else "yuv420p"
        stream.options = options
        for pixels in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                box.mux(packet)
        for packet in stream.encode():
            box.mux(packet)
    return out.getvalue()

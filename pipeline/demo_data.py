"""A small image-text set made offline from the photos scikit-image ships.

Each sample is a random crop / flip / colour jitter / resize of one source photo, with a caption
that always names that photo's subject (so a tiny CLIP can learn the pairing); every fifth
sample's caption is in Chinese (`SUBJECTS_ZH`), as in the multilingual sets this toolkit is
for. On top of the distinct samples come byte-identical copies (for exact dedupe) and broken
files (for decode).
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
from PIL import Image, ImageEnhance, ImageOps

# scikit-image loader name -> fixed caption subject.
SUBJECTS: dict[str, str] = {
    "astronaut": "an astronaut",
    "camera": "a man with a camera",
    "chelsea": "a cat",
    "coffee": "a cup of coffee",
    "coins": "old coins",
    "rocket": "a rocket on a launch pad",
    "moon": "the surface of the moon",
    "grass": "grass",
    "gravel": "gravel",
    "brick": "a brick wall",
    "hubble_deep_field": "galaxies in deep space",
    "immunohistochemistry": "stained tissue under a microscope",
    "retina": "a human retina",
    "clock": "a wall clock",
    "colorwheel": "a colour wheel",
    "stereo_motorcycle": "a motorcycle",
    "page": "a page of printed text",
    "text": "a sign with letters",
}
SUBJECTS_ZH: dict[str, str] = {
    "astronaut": "宇航员",
    "camera": "拿着相机的男人",
    "chelsea": "一只猫",
    "coffee": "一杯咖啡",
    "coins": "古老的硬币",
    "rocket": "发射台上的火箭",
    "moon": "月球表面",
    "grass": "草地",
    "gravel": "碎石",
    "brick": "砖墙",
    "hubble_deep_field": "深空中的星系",
    "immunohistochemistry": "显微镜下染色的组织",
    "retina": "人的视网膜",
    "clock": "挂钟",
    "colorwheel": "色轮",
    "stereo_motorcycle": "一辆摩托车",
    "page": "一页印刷文字",
    "text": "写着字的牌子",
}
TEMPLATES = ("a photo of {}", "a picture of {}", "an image of {}", "{}", "a close-up of {}")
TEMPLATES_ZH = ("{}的照片", "一张{}的图片", "{}的特写", "拍摄的{}")
CHINESE_EVERY = 5  # sample i has a Chinese caption when i % 5 == 2
PNG_FRACTION = 0.04
BROKEN_KINDS = ("truncated", "empty", "text", "random", "header_only")


@dataclass(frozen=True)
class DemoSample:
    """One encoded image with its caption; `ext` is `jpg` or `png`."""

    key: str
    ext: str
    data: bytes
    caption: str
    source: str
    width: int
    height: int

    def metadata(self) -> dict:
        return {
            "source": f"skimage:{self.source}",
            "subject": SUBJECTS[self.source],
            "width": self.width,
            "height": self.height,
        }


@cache
def source_photo(name: str) -> Image.Image:
    """A scikit-image sample photo as a PIL image (L or RGB); cached, callers must not mutate."""
    from skimage import data

    array = getattr(data, name)()
    if isinstance(array, tuple):  # stereo_motorcycle returns (left, right, disparity)
        array = array[0]
    return Image.fromarray(np.ascontiguousarray(array))


def _augment(photo: Image.Image, rng: np.random.Generator) -> tuple[Image.Image, list[str]]:
    """Random crop (40-100% per side), flip, colour jitter, resize (long side 200-400 px)."""
    w, h = photo.size
    cw, ch = (max(8, int(side * rng.uniform(0.4, 1.0))) for side in (w, h))
    x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    image = photo.crop((x, y, x + cw, y + ch))
    notes = ["cropped"] if cw * ch < 0.8 * w * h else []
    if rng.random() < 0.5:
        image = ImageOps.mirror(image)
        notes.append("flipped")
    brightness = rng.uniform(0.7, 1.3)
    image = ImageEnhance.Brightness(image).enhance(brightness)
    image = ImageEnhance.Contrast(image).enhance(rng.uniform(0.8, 1.2))
    if image.mode == "RGB":
        image = ImageEnhance.Color(image).enhance(rng.uniform(0.6, 1.4))
    if brightness < 0.8:
        notes.append("dark")
    elif brightness > 1.2:
        notes.append("bright")
    long_side = int(rng.integers(200, 401))
    scale = long_side / max(image.size)
    size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    return image.resize(size, Image.Resampling.BICUBIC), notes


def _caption(subject: str, notes: list[str], rng: np.random.Generator) -> str:
    text = TEMPLATES[int(rng.integers(len(TEMPLATES)))].format(subject)
    if notes and rng.random() < 0.6:
        text += ", " + notes[int(rng.integers(len(notes)))]
    return text


def _caption_zh(source: str, index: int) -> str:
    """A Chinese caption chosen by the sample's index (the random stream stays as it was)."""
    return TEMPLATES_ZH[(index // CHINESE_EVERY) % len(TEMPLATES_ZH)].format(SUBJECTS_ZH[source])


def _encode(image: Image.Image, ext: str, rng: np.random.Generator) -> bytes:
    buffer = io.BytesIO()
    if ext == "png":
        image.save(buffer, format="PNG")
    else:
        image.save(buffer, format="JPEG", quality=int(rng.integers(85, 96)))
    return buffer.getvalue()


def iter_samples(
    n: int, seed: int = 0, png_fraction: float = PNG_FRACTION, prefix: str = "sample"
) -> Iterator[DemoSample]:
    """`n` samples with pairwise distinct bytes, deterministic for `seed`."""
    rng = np.random.default_rng(seed)
    names = list(SUBJECTS)
    seen: set[bytes] = set()
    index = 0
    while index < n:
        source = names[int(rng.integers(len(names)))]
        image, notes = _augment(source_photo(source), rng)
        ext = "png" if rng.random() < png_fraction else "jpg"
        data = _encode(image, ext, rng)
        caption = _caption(SUBJECTS[source], notes, rng)
        if index % CHINESE_EVERY == 2:
            caption = _caption_zh(source, index)
        if data in seen:  # practically never; redraw keeps "distinct" a guarantee
            continue
        seen.add(data)
        yield DemoSample(f"{prefix}_{index:06d}", ext, data, caption, source, *image.size)
        index += 1


def broken_file(kind: str, good_jpeg: bytes, rng: np.random.Generator) -> tuple[str, bytes]:
    """(extension, bytes) of a file that no image decoder accepts."""
    if kind == "truncated":
        return "jpg", good_jpeg[: len(good_jpeg) // 2]
    if kind == "empty":
        return "jpg", b""
    if kind == "text":
        return "jpg", b"this is not an image, just text saved with a .jpg name\n"
    if kind == "random":
        return "png", rng.bytes(int(rng.integers(200, 2000)))
    if kind == "header_only":
        # SOI + a JFIF APP0 segment, then nothing: no frame, no scan.
        return "jpg", bytes.fromhex("ffd8ffe000104a46494600010100000100010000")
    raise ValueError(f"unknown broken kind {kind!r}; one of {BROKEN_KINDS}")


def _write_pair(folder: Path, key: str, ext: str, data: bytes, caption: str) -> None:
    (folder / f"{key}.{ext}").write_bytes(data)
    (folder / f"{key}.txt").write_text(caption + "\n")


def make_demo_images(
    folder: Path, n: int = 500, exact_copies: int = 5, broken: int = 5, seed: int = 0
) -> dict:
    """Write `<key>.jpg|png` + `<key>.txt` pairs: n distinct samples, copies, broken files."""
    if exact_copies > n:
        raise ValueError(f"exact_copies ({exact_copies}) cannot exceed n ({n})")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    samples = list(iter_samples(n, seed))
    for sample in samples:
        _write_pair(folder, sample.key, sample.ext, sample.data, sample.caption)
    rng = np.random.default_rng([seed, 1])  # separate stream: copies don't shift samples
    for i, pick in enumerate(rng.choice(n, size=exact_copies, replace=False)):
        original = samples[int(pick)]
        _write_pair(
            folder,
            f"copy_{i:06d}",
            original.ext,
            original.data,
            _caption(SUBJECTS[original.source], [], rng),
        )
    jpegs = [s.data for s in samples if s.ext == "jpg"]
    jpegs = jpegs or [next(iter_samples(1, seed, png_fraction=0.0)).data]
    for i in range(broken):
        ext, data = broken_file(BROKEN_KINDS[i % len(BROKEN_KINDS)], jpegs[i % len(jpegs)], rng)
        _write_pair(folder, f"broken_{i:06d}", ext, data, "a photo that will not decode")
    return {
        "samples": n,
        "exact_copies": exact_copies,
        "broken": broken,
        "files": n + exact_copies + broken,
        "distinct_decodable": n,
    }


def make_image_text_pairs(folder: Path, n: int = 20, seed: int = 0) -> Path:
    """Only clean, distinct pairs (no copies, no broken files); returns `folder`."""
    make_demo_images(folder, n=n, exact_copies=0, broken=0, seed=seed)
    return Path(folder)


def write_tar_shards(
    folder: Path, n_shards: int = 2, per_shard: int = 10, seed: int = 0
) -> list[Path]:
    """WebDataset shards `shard-000000.tar`, ... of `<key>.jpg/.txt/.json` (keys unique)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    samples = iter_samples(n_shards * per_shard, seed, png_fraction=0.0)
    paths = []
    for shard in range(n_shards):
        path = folder / f"shard-{shard:06d}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for _ in range(per_shard):
                sample = next(samples)
                meta = json.dumps(sample.metadata(), sort_keys=True).encode()
                for ext, data in (
                    ("jpg", sample.data),
                    ("txt", sample.caption.encode()),
                    ("json", meta),
                ):
                    _add_member(tar, f"{sample.key}.{ext}", data)
        paths.append(path)
    return paths


def _add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o644  # fixed mtime: byte-stable shards
    tar.addfile(info, io.BytesIO(data))

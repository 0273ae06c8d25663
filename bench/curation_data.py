"""Web-like image-text data for the curation bench (bench/curation.py), made offline.

A scene is two groups of coloured shapes, one group in each half of the picture (left/right
or top/bottom); its caption names each group's count, colour, shape and side, e.g. "two red
circles on the left and a blue square on the right". A tiny CLIP can learn that pairing, and
retrieval among a few hundred scenes needs all of it (colour alone does not tell them apart).

`make_sets(root, sizes, seed)` writes, each a folder of `<key>.jpg` + `<key>.txt` pairs:
  eval/    held-out scenes, one fixed caption template, captions pairwise distinct
  seed/    a small clean set to train the filter model on (as LAION used a CLIP trained elsewhere)
  raw/     the web-like set: distinct scenes, a share of them captioned with text about another
           scene (or web boilerplate); exact copies and near-duplicates (re-encoded, resized,
           slightly cropped or brightened), a few scenes copied many times; broken files
  oracle/  hard links to the raw files that are distinct scenes with their true caption
and `truth.json`: every raw key's role (`clean`, `mismatched`, `exact_copy`, `near_copy`,
`broken`), the source scene of each copy, and the counts. Deterministic for a seed.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageEnhance

COLOURS = {
    "red": (215, 35, 35),
    "green": (35, 170, 50),
    "blue": (35, 65, 215),
    "yellow": (240, 215, 40),
    "purple": (140, 45, 175),
    "orange": (245, 135, 25),
    "white": (250, 250, 250),
    "black": (15, 15, 15),
}
SHAPES = ("circle", "square", "triangle", "cross")
COUNTS = ("one", "two", "three")
# Background: (caption words, base RGB, pixel noise std), and object colours it hides.
BACKGROUNDS = {
    "grass": ("on grass", (60, 130, 45), 10),
    "sand": ("on sand", (215, 195, 145), 6),
    "snow": ("on snow", (225, 230, 238), 3),
    "water": ("on water", (40, 90, 170), 6),
    "night": ("at night", (25, 30, 60), 3),
    "wood": ("on a wooden table", (140, 95, 55), 6),
}
HIDDEN = {"grass": "green", "sand": "yellow", "snow": "white", "water": "blue", "night": "black"}
PHRASES = (
    "{g} {b}",
    "a picture of {g} {b}",
    "{b}: {g}",
    "photo of {g} {b}, close-up",
    "{g} {b} in the picture",
)
EVAL_PHRASE = PHRASES[0]
JUNK = (
    "click here to see more",
    "free shipping on all orders",
    "image may contain text",
    "stock photo, royalty free",
    "view full size",
    "thumbnail",
    "download wallpaper hd",
    "untitled",
)
BROKEN_KINDS = ("truncated", "empty", "text")
SIDE_PX = 96


@dataclass(frozen=True)
class Group:
    count: int  # 1..3
    colour: str
    shape: str


@dataclass(frozen=True)
class Scene:
    group: Group
    background: str  # a BACKGROUNDS name


def descriptions() -> list[Scene]:
    """Every distinct scene description (what the eval captions are drawn from)."""
    return [
        Scene(Group(count, colour, shape), background)
        for background in BACKGROUNDS
        for colour in COLOURS
        if HIDDEN.get(background) != colour
        for shape in SHAPES
        for count in (1, 2, 3)
    ]


DESCRIPTIONS = descriptions()


@dataclass(frozen=True)
class Sizes:
    """Counts of each set; shares of the raw set (of its files)."""

    eval: int = 300
    seed: int = 1000
    raw: int = 5000
    mismatched: float = 0.45  # of distinct scenes: caption about something else
    junk: float = 0.2  # of mismatched captions: web boilerplate instead of another scene's
    copies: float = 0.25  # of raw files: exact copies and near-duplicates of a scene
    near: float = 0.5  # of copies: near-duplicates (the rest byte-identical)
    popular: int = 20  # scenes that get half of all copies between them
    broken: float = 0.02  # of raw files: no decoder accepts them

    def __post_init__(self) -> None:
        for name in ("mismatched", "junk", "copies", "near", "broken"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"Sizes.{name} must be a share in [0, 1]")
        if self.eval > len(DESCRIPTIONS):
            raise ValueError(f"Sizes.eval: at most {len(DESCRIPTIONS)} distinct captions")
        if self.copies + self.broken >= 1 or self.raw < 10 or self.popular < 1:
            raise ValueError("Sizes: the raw set needs distinct scenes (raw >= 10, popular >= 1)")


def group_phrase(group: Group) -> str:
    noun = group.shape + ("" if group.count == 1 else "es" if group.shape == "cross" else "s")
    article = "an" if group.colour[0] in "aeiou" else "a"
    return f"{article if group.count == 1 else COUNTS[group.count - 1]} {group.colour} {noun}"


def random_scene(rng: np.random.Generator) -> Scene:
    background = list(BACKGROUNDS)[int(rng.integers(len(BACKGROUNDS)))]
    colours = [c for c in COLOURS if HIDDEN.get(background) != c]
    colour = colours[int(rng.integers(len(colours)))]
    group = Group(int(rng.integers(1, 4)), colour, SHAPES[int(rng.integers(len(SHAPES)))])
    return Scene(group, background)


def caption(scene: Scene, rng: np.random.Generator | None) -> str:
    """A web-like caption (one of a few phrasings); `rng=None`: the fixed eval phrasing."""
    phrase = EVAL_PHRASE if rng is None else PHRASES[int(rng.integers(len(PHRASES)))]
    return phrase.format(g=group_phrase(scene.group), b=BACKGROUNDS[scene.background][0])


def draw(scene: Scene, rng: np.random.Generator, side: int = SIDE_PX) -> Image.Image:
    """The objects anywhere on a noisy, softly shaded background."""
    _, rgb, std = BACKGROUNDS[scene.background]
    base = np.array(rgb) + rng.integers(-15, 16, size=3)
    # Light from a random direction: low-frequency structure, as photos have (pHash needs it).
    angle = rng.uniform(0, 2 * np.pi)
    ramp = np.linspace(-1, 1, side)
    shade = 25 * (np.cos(angle) * ramp[None, :] + np.sin(angle) * ramp[:, None])[:, :, None]
    noise = rng.normal(0, std, size=(side, side, 3))
    image = Image.fromarray(np.clip(base + shade + noise, 0, 255).astype(np.uint8))
    pen = ImageDraw.Draw(image)
    for box in place(scene.group.count, (0, 0, side, side), rng, side):
        shape(pen, scene.group.shape, box, COLOURS[scene.group.colour])
    return image


def place(count: int, area: tuple[int, int, int, int], rng: np.random.Generator, side: int):
    """`count` non-overlapping squares inside `area` (redrawn until they fit)."""
    x0, y0, x1, y1 = area
    size = int(side * 0.22)
    for _ in range(200):
        boxes = []
        for _ in range(count):
            x = int(rng.integers(x0 + 1, x1 - size - 1))
            y = int(rng.integers(y0 + 1, y1 - size - 1))
            boxes.append((x, y, x + size, y + size))
        if all(not overlap(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1 :]):
            return boxes
    return boxes  # practically never: 200 draws of at most 3 boxes in a half


def overlap(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return a[0] < b[2] + 3 and b[0] < a[2] + 3 and a[1] < b[3] + 3 and b[1] < a[3] + 3


def shape(pen: ImageDraw.ImageDraw, name: str, box: tuple[int, ...], fill: tuple) -> None:
    x0, y0, x1, y1 = box
    if name == "circle":
        pen.ellipse(box, fill=fill)
    elif name == "square":
        pen.rectangle(box, fill=fill)
    elif name == "triangle":
        pen.polygon([(x0, y1), (x1, y1), ((x0 + x1) // 2, y0)], fill=fill)
    else:
        t = (x1 - x0) // 3
        pen.rectangle((x0 + t, y0, x1 - t, y1), fill=fill)
        pen.rectangle((x0, y0 + t, x1, y1 - t), fill=fill)


def jpeg(image: Image.Image, quality: int) -> bytes:
    out = io.BytesIO()
    image.save(out, "JPEG", quality=quality)
    return out.getvalue()


def near_variant(image: Image.Image, rng: np.random.Generator) -> bytes:
    """One web transform that keeps what the caption says true (no flips, small crops)."""
    kind = int(rng.integers(4))
    if kind == 1:
        scale = rng.uniform(0.7, 0.95)
        image = image.resize((round(image.width * scale), round(image.height * scale)))
    elif kind == 2:
        cut = int(rng.integers(1, 3))
        image = image.crop((cut, cut, image.width - cut, image.height - cut))
    elif kind == 3:
        image = ImageEnhance.Brightness(image).enhance(rng.uniform(0.9, 1.1))
    return jpeg(image, int(rng.integers(50, 75)))  # below the originals' 75-95: new bytes


def broken_bytes(kind: str, good: bytes) -> bytes:
    if kind == "truncated":
        return good[: len(good) // 3]
    if kind == "empty":
        return b""
    return b"<html><body>404 not found</body></html>\n"


def write_pair(folder: Path, key: str, data: bytes, text: str) -> None:
    (folder / f"{key}.jpg").write_bytes(data)
    (folder / f"{key}.txt").write_text(text + "\n")


def clean_set(folder: Path, n: int, rng: np.random.Generator, fixed: bool) -> None:
    """`n` scenes with true captions; `fixed`: the eval phrasing, captions pairwise distinct
    (two images with one caption would tie, and ties count against the model)."""
    folder.mkdir(parents=True, exist_ok=True)
    used: set[str] = set()
    while len(used) < n:
        scene = random_scene(rng)
        text = caption(scene, None if fixed else rng)
        if fixed and text in used:
            continue
        write_pair(folder, f"{folder.name}_{len(used):06d}", jpeg(draw(scene, rng), 90), text)
        used.add(text if fixed else str(len(used)))


def copy_sources(n_copies: int, n_scenes: int, sizes: Sizes, rng: np.random.Generator):
    """Which scene each copy repeats: half go to `popular` scenes (Zipf), half uniformly."""
    popular = rng.choice(n_scenes, size=min(sizes.popular, n_scenes), replace=False)
    weights = 1.0 / np.arange(1, len(popular) + 1)
    to_popular = n_copies // 2
    picks = list(rng.choice(popular, size=to_popular, p=weights / weights.sum()))
    picks += list(rng.integers(0, n_scenes, size=n_copies - to_popular))
    return [int(p) for p in rng.permutation(np.array(picks, dtype=np.int64))]


def unrelated_caption(scene: Scene, sizes: Sizes, rng: np.random.Generator) -> str:
    """Web boilerplate, or a caption of another scene (never one that describes this one)."""
    if rng.random() < sizes.junk:
        return JUNK[int(rng.integers(len(JUNK)))]
    while True:
        other = random_scene(rng)
        if other != scene:
            return caption(other, rng)


def raw_items(sizes: Sizes, rng: np.random.Generator) -> list[dict]:
    """Every raw file as {data, text, role, ...}; exact counts: round(share x total)."""
    n_broken = round(sizes.raw * sizes.broken)
    n_copies = round(sizes.raw * sizes.copies)
    n_scenes = sizes.raw - n_broken - n_copies
    mismatched = set(rng.choice(n_scenes, size=round(n_scenes * sizes.mismatched), replace=False))
    items, images = [], []
    for i in range(n_scenes):
        scene = random_scene(rng)
        images.append(draw(scene, rng))
        text = unrelated_caption(scene, sizes, rng) if i in mismatched else caption(scene, rng)
        role = "mismatched" if i in mismatched else "clean"
        data = jpeg(images[-1], int(rng.integers(75, 96)))
        items.append({"data": data, "text": text, "role": role, "scene": asdict(scene)})
    near = set(rng.choice(n_copies, size=round(n_copies * sizes.near), replace=False))
    for j, src in enumerate(copy_sources(n_copies, n_scenes, sizes, rng)):
        data = near_variant(images[src], rng) if j in near else items[src]["data"]
        role = "near_copy" if j in near else "exact_copy"
        items.append({"data": data, "text": items[src]["text"], "role": role, "of": src})
    for k in range(n_broken):
        kind = BROKEN_KINDS[k % len(BROKEN_KINDS)]
        data = broken_bytes(kind, items[k]["data"])
        items.append({"data": data, "text": items[k]["text"], "role": "broken", "kind": kind})
    return items


def raw_set(folder: Path, sizes: Sizes, rng: np.random.Generator) -> dict[str, dict]:
    """The corrupted web-like set, in shuffled key order (a key says nothing of its role);
    returns the truth: every key's role, scene (of distinct scenes), source key (of copies)."""
    folder.mkdir(parents=True, exist_ok=True)
    items = raw_items(sizes, rng)
    keys = [f"web_{int(i):06d}" for i in rng.permutation(len(items))]
    roles: dict[str, dict] = {}
    for key, item in zip(keys, items, strict=True):
        write_pair(folder, key, item.pop("data"), item.pop("text"))
        if "of" in item:
            item["of"] = keys[item["of"]]
        roles[key] = item
    return dict(sorted(roles.items()))


def link_oracle(raw: Path, oracle: Path, roles: dict) -> int:
    """Hard links (copies where links fail) to the clean distinct scenes of the raw set."""
    oracle.mkdir(parents=True, exist_ok=True)
    keys = [k for k, v in roles.items() if v["role"] == "clean"]
    for key in keys:
        for ext in ("jpg", "txt"):
            src, dst = raw / f"{key}.{ext}", oracle / f"{key}.{ext}"
            try:
                os.link(src, dst)
            except OSError:  # another filesystem, or links not allowed: a copy reads the same
                shutil.copyfile(src, dst)
    return len(keys)


def make_sets(root: Path, sizes: Sizes = Sizes(), seed: int = 0) -> dict:
    """Write eval/, seed/, raw/, oracle/ and truth.json under `root` (must not hold them)."""
    root = Path(root)
    for name in ("eval", "seed", "raw", "oracle"):
        if (root / name).exists():
            raise FileExistsError(f"{root / name} exists; make_sets writes fresh folders only")
    # One stream per set: changing one set's size does not change the others.
    streams = [np.random.default_rng([seed, i]) for i in range(3)]
    clean_set(root / "eval", sizes.eval, streams[0], fixed=True)
    clean_set(root / "seed", sizes.seed, streams[1], fixed=False)
    roles = raw_set(root / "raw", sizes, streams[2])
    n_oracle = link_oracle(root / "raw", root / "oracle", roles)
    counts: dict[str, int] = {}
    for value in roles.values():
        counts[value["role"]] = counts.get(value["role"], 0) + 1
    truth = {"seed": seed, "sizes": asdict(sizes), "counts": counts, "oracle": n_oracle}
    truth["roles"] = roles
    (root / "truth.json").write_text(json.dumps(truth, indent=1) + "\n")
    return {k: v for k, v in truth.items() if k != "roles"}

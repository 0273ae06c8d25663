"""Synthetic data for the T-MARS bench (bench/tmars.py): the curation bench's scenes
(bench/curation_data.py: coloured shapes on a background, captioned by count, colour, shape and
background) with a caption's words written into the pixels of some of them, as web images
often carry text (posters, memes, product shots): about 40% of LAION images do.

The written text is the caption's colour and shape words in capitals on two lines ("RED" /
"CIRCLES"), large and with a contrasting outline, in a band at the top or the bottom: at the
proxy model's 64 px a whole caption would be a few pixels per letter, and those two words are
what a scene caption turns on.

`make_tmars_sets(root, sizes, seed)` writes, each a folder of `<key>.jpg` + `<key>.txt`:
  scorer/  the pairs the scoring CLIP is trained on (its "web"): true captions without text,
           true captions with their words written in, and text pairs (the caption's words
           written over a scene it does not describe): reading the text pays in it
  raw/     the pool to curate: `clean` and `clean_text` (true caption; without / with its
           words written in), `mismatched` (another scene's caption) and `mismatched_text`
           (another scene's caption, its words written in: the pairs T-MARS is for)
  check/   for every `mismatched_text` raw pair, the same picture without the text
           (`<key>_plain`) and with it (`<key>_text`), both with its caption
  eval/    held-out clean scenes without text (the curation bench's fixed eval phrasing)
and `truth.json`: every raw key's role and whether text is written in it. Deterministic.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from bench.curation_data import (
    BACKGROUNDS,
    Scene,
    caption,
    clean_set,
    draw,
    group_phrase,
    jpeg,
    random_scene,
    write_pair,
)

SIDE = 128  # drawn size; the builds resize to the model's 64 px
ROLES = ("clean", "clean_text", "mismatched", "mismatched_text")
DARK_BACKGROUNDS = {"night", "water", "grass", "wood"}  # get white letters, else black


@dataclass(frozen=True)
class TmarsSizes:
    """Counts of each set; shares of the raw pool (ROLES in order) and of the scorer's set."""

    raw: int = 2000
    scorer: int = 2000
    eval: int = 300
    shares: tuple[float, float, float, float] = (0.40, 0.15, 0.20, 0.25)
    scorer_text: float = 0.25  # scorer set: true caption written in
    scorer_text_pairs: float = 0.35  # scorer set: caption written over another scene

    def __post_init__(self) -> None:
        if abs(sum(self.shares) - 1) > 1e-9 or min(self.shares) < 0:
            raise ValueError("TmarsSizes.shares: four shares >= 0 summing to 1")
        if min(self.scorer_text, self.scorer_text_pairs) < 0:
            raise ValueError("TmarsSizes: scorer_text and scorer_text_pairs are shares >= 0")
        if self.scorer_text + self.scorer_text_pairs > 1:
            raise ValueError("TmarsSizes: scorer_text + scorer_text_pairs at most 1")


def write_text(image: Image.Image, words: list[str], background: str, top: bool) -> Image.Image:
    """A copy of `image` with `words` on lines in a band at the top (or the bottom), letters
    sized to fill about 3/4 of the width, outlined in the opposite colour."""
    out = image.copy()
    pen = ImageDraw.Draw(out)
    light = background in DARK_BACKGROUNDS
    fill, edge = ((250, 250, 250), (10, 10, 10)) if light else ((10, 10, 10), (250, 250, 250))
    size = max(10, int(out.width * 0.75 / max(len(w) for w in words) * 1.6))
    size = min(size, out.height // 5)
    font = ImageFont.load_default(size=size)
    y = 4 if top else out.height - 4 - len(words) * (size + 2)
    for word in words:
        width = pen.textlength(word, font=font)
        pen.text(
            ((out.width - width) / 2, y),
            word,
            font=font,
            fill=fill,
            stroke_width=2,
            stroke_fill=edge,
        )
        y += size + 2
    return out


def other_scene(scene: Scene, rng: np.random.Generator) -> Scene:
    """A scene that differs from `scene` in colour and shape (so its words are wrong here)."""
    while True:
        other = random_scene(rng)
        if other.group.colour != scene.group.colour and other.group.shape != scene.group.shape:
            return other


def one_pair(role: str, rng: np.random.Generator) -> dict:
    """A pair of `role`: its picture (and the picture without text when it has text), its
    caption, and the scene drawn."""
    scene = random_scene(rng)
    image = draw(scene, rng, SIDE)
    described = scene if role.startswith("clean") else other_scene(scene, rng)
    text = caption(described, rng)
    item = {"role": role, "text": text, "scene": asdict(scene), "plain": image}
    if role.endswith("_text"):
        words = [described.group.colour.upper(), noun(described)]
        item["image"] = write_text(image, words, scene.background, bool(rng.random() < 0.5))
        item["words"] = words
    else:
        item["image"] = image
    return item


def noun(scene: Scene) -> str:
    """The shape noun as the caption writes it ("CIRCLES", "A CROSS" -> "CROSS")."""
    return group_phrase(scene.group).split()[-1].upper()


def role_list(n: int, shares: tuple[float, ...], rng: np.random.Generator) -> list[str]:
    """Exactly round(share x n) of each role (the rest to the first), shuffled."""
    counts = [round(s * n) for s in shares]
    counts[0] += n - sum(counts)
    roles = [r for r, c in zip(ROLES, counts, strict=True) for _ in range(c)]
    return [roles[i] for i in rng.permutation(len(roles))]


def raw_pool(root: Path, sizes: TmarsSizes, rng: np.random.Generator) -> dict[str, dict]:
    """raw/ and check/; returns the truth per raw key."""
    raw, check = root / "raw", root / "check"
    raw.mkdir(parents=True)
    check.mkdir(parents=True)
    truth: dict[str, dict] = {}
    for i, role in enumerate(role_list(sizes.raw, sizes.shares, rng)):
        key = f"web_{i:06d}"
        item = one_pair(role, rng)
        write_pair(raw, key, jpeg(item["image"], 90), item["text"])
        if role == "mismatched_text":
            write_pair(check, f"{key}_plain", jpeg(item["plain"], 90), item["text"])
            write_pair(check, f"{key}_text", jpeg(item["image"], 90), item["text"])
        truth[key] = {"role": role, "text_written": role.endswith("_text"), "scene": item["scene"]}
        if "words" in item:
            truth[key]["words"] = item["words"]
    return truth


def scorer_set(folder: Path, sizes: TmarsSizes, rng: np.random.Generator) -> dict[str, int]:
    """The scoring CLIP's pairs: true captions (some with their words written in) and text
    pairs (a caption's words written over a scene it does not describe)."""
    folder.mkdir(parents=True)
    shares = (1 - sizes.scorer_text - sizes.scorer_text_pairs, sizes.scorer_text, 0.0)
    roles = role_list(sizes.scorer, (*shares, sizes.scorer_text_pairs), rng)
    for i, role in enumerate(roles):
        item = one_pair(role, rng)
        write_pair(folder, f"scorer_{i:06d}", jpeg(item["image"], 90), item["text"])
    return {role: roles.count(role) for role in ROLES if role in roles}


def make_tmars_sets(root: Path, sizes: TmarsSizes = TmarsSizes(), seed: int = 0) -> dict:
    """Write scorer/, raw/, check/, eval/ and truth.json under `root` (fresh folders only)."""
    root = Path(root)
    for name in ("scorer", "raw", "check", "eval"):
        if (root / name).exists():
            raise FileExistsError(f"{root / name} exists; make_tmars_sets writes fresh folders")
    streams = [np.random.default_rng([seed, 50, i]) for i in range(3)]  # one per set
    clean_set(root / "eval", sizes.eval, streams[0], fixed=True)
    scorer = scorer_set(root / "scorer", sizes, streams[1])
    roles = raw_pool(root, sizes, streams[2])
    counts = {role: sum(v["role"] == role for v in roles.values()) for role in ROLES}
    truth = {"seed": seed, "sizes": asdict(sizes), "counts": counts, "scorer": scorer}
    (root / "truth.json").write_text(json.dumps({**truth, "roles": roles}, indent=1) + "\n")
    return truth


__all__ = ["BACKGROUNDS", "ROLES", "TmarsSizes", "make_tmars_sets", "write_text"]

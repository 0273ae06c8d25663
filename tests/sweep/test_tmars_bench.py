"""The T-MARS bench's data generator (bench/tmars_data.py): the truth per raw key, and that the
written text is really in the pixels: text_area (the real detector) finds boxes on every
written-in picture and none on the others, and the check pairs differ only by that text.
Fast: a tiny set, no Ray, no CLIP."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
from mmcurate.pipeline.sources.samples import append_sample, empty_batch
from mmcurate.stages.registry import build_stage
from PIL import Image

from bench.curation_data import BACKGROUNDS, COLOURS, SHAPES
from bench.tmars_data import ROLES, TmarsSizes, make_tmars_sets

SIZES = TmarsSizes(raw=24, scorer=8, eval=4)


def text_boxes(folder: Path, keys: list[str]) -> dict[str, list]:
    """text_area's boxes per key, as the bench's T-MARS build runs it (short_side 128: the
    pictures' own size; upscaled, rows of crosses or circles can read as text)."""
    batch = empty_batch()
    for key in keys:
        data = (folder / f"{key}.jpg").read_bytes()
        append_sample(batch, {"__key__": key, "jpg": data, "txt": "x"})
    out = build_stage({"name": "text_area", "short_side": 128})(batch)
    return {
        k: json.loads(m)["text_boxes"] for k, m in zip(out["__key__"], out["json"], strict=True)
    }


def described(caption: str) -> tuple[str, str]:
    """(colour, shape) a scene caption names."""
    words = caption.split()
    colour = next(w for w in words if w in COLOURS)
    shape = next(s for s in SHAPES if any(w.startswith(s) for w in words))
    return colour, shape


def test_truth_labels_and_written_text(tmp_path: Path):
    info = make_tmars_sets(tmp_path, SIZES, seed=3)
    assert info["counts"] == {"clean": 9, "clean_text": 4, "mismatched": 5, "mismatched_text": 6}
    roles = json.loads((tmp_path / "truth.json").read_text())["roles"]
    assert sorted(p.stem for p in (tmp_path / "raw").glob("*.jpg")) == sorted(roles)
    for key, truth in roles.items():
        assert truth["role"] in ROLES
        assert truth["text_written"] == truth["role"].endswith("_text")
        caption = (tmp_path / "raw" / f"{key}.txt").read_text()
        scene = truth["scene"]
        assert BACKGROUNDS[scene["background"]][0] in caption or truth["role"] != "clean"
        names = (scene["group"]["colour"], scene["group"]["shape"])
        if truth["role"].startswith("clean"):
            assert described(caption) == names
        else:  # mis-captioned: neither its colour nor its shape is the scene's
            colour, shape = described(caption)
            assert colour != names[0] and shape != names[1]
        if truth["text_written"]:  # the words written are the caption's
            assert truth["words"][0].lower() == described(caption)[0]
    boxes = text_boxes(tmp_path / "raw", sorted(roles))
    for key, truth in roles.items():
        assert bool(boxes[key]) == truth["text_written"], (key, truth["role"], boxes[key])


def test_check_pairs_differ_by_the_text_only(tmp_path: Path):
    make_tmars_sets(tmp_path, SIZES, seed=4)
    roles = json.loads((tmp_path / "truth.json").read_text())["roles"]
    texted = sorted(k for k, v in roles.items() if v["role"] == "mismatched_text")
    check = tmp_path / "check"
    stems = sorted({p.stem.rsplit("_", 1)[0] for p in check.glob("*.jpg")})
    assert stems == texted
    boxes = text_boxes(check, [f"{s}_{kind}" for s in stems for kind in ("plain", "text")])
    for stem in stems:
        caption = (tmp_path / "raw" / f"{stem}.txt").read_text()
        for kind in ("plain", "text"):
            assert (check / f"{stem}_{kind}.txt").read_text() == caption
        assert boxes[f"{stem}_plain"] == [] and boxes[f"{stem}_text"]
        plain, text = (pixels(check / f"{stem}_{kind}.jpg") for kind in ("plain", "text"))
        changed = np.abs(plain - text).max(axis=2) > 60  # the letters, not JPEG noise
        rows = np.flatnonzero(changed.any(axis=1))
        assert rows.size and rows.max() - rows.min() < 0.5 * plain.shape[0]  # one band only


def pixels(path: Path) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(path.read_bytes())).convert("RGB"), dtype=np.int16)


def test_same_seed_same_sets(tmp_path: Path):
    a = make_tmars_sets(tmp_path / "a", SIZES, seed=5)
    b = make_tmars_sets(tmp_path / "b", SIZES, seed=5)
    assert a == b
    for name in ("raw/web_000003.jpg", "scorer/scorer_000002.jpg", "check"):
        left, right = tmp_path / "a" / name, tmp_path / "b" / name
        if left.is_file():
            assert left.read_bytes() == right.read_bytes()

"""The curation bench's recaption arm helpers: the tiny BLIP-2 captioner trained on a build's
pairs (bench/curation_captioner.py) loads and captions through the recaption stage's own
loader, and the ground truth of a synthetic caption (bench/curation_recaption.py)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
from mmcurate.stages.lib.captioner import (
    Captioner,
    Generation,
    check_captioner,
    image_processor,
    prepare_pixels,
)

from bench.curation_captioner import read_build, tokenizer_for, train_captioner
from bench.curation_data import PHRASES, caption, draw, random_scene
from bench.curation_recaption import recaptioned, true_captions


def write_build(folder: Path, rows: list[tuple[str, bytes, str, dict]]) -> Path:
    """A one-shard build folder as mmcurate writes it: manifest.json and a tar of members."""
    folder.mkdir(parents=True)
    with tarfile.open(folder / "shard-000000.tar", "w") as tar:
        for key, jpg, txt, meta in rows:
            for ext, data in (("jpg", jpg), ("txt", txt.encode()), ("json", json.dumps(meta))):
                data = data.encode() if isinstance(data, str) else data
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    manifest = {"format": "mmcurate/1", "samples": len(rows)}
    manifest["shards"] = [{"name": "shard-000000.tar", "samples": len(rows)}]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def scene_rows(n: int) -> list[tuple[str, bytes, str, dict]]:
    rng = np.random.default_rng(0)
    rows = []
    for i in range(n):
        scene = random_scene(rng)
        out = io.BytesIO()
        draw(scene, rng).resize((64, 64)).save(out, "JPEG", quality=90)
        meta = {"scene": {"group": vars(scene.group), "background": scene.background}}
        rows.append((f"s_{i:03d}", out.getvalue(), caption(scene, rng), meta))
    return rows


def test_tokenizer_round_trips_the_generators_captions():
    rows = scene_rows(20)
    tok = tokenizer_for([r[2] for r in rows])
    for _, _, text, _ in rows:
        ids = tok(text)["input_ids"]
        assert ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id
        assert tok.decode(ids, skip_special_tokens=True) == text  # punctuation kept as written


def test_trained_captioner_loads_and_captions_as_the_stage_does(tmp_path, one_torch_thread):
    build = write_build(tmp_path / "seed", scene_rows(16))
    images, texts = read_build(build)
    assert len(images) == len(texts) == 16
    summary = train_captioner(build, tmp_path / "captioner", steps=3, batch=8)
    assert summary["pairs"] == 16 and len(summary["losses"]) == 2  # steps 0 and 2
    check_captioner(str(tmp_path / "captioner"))  # the stage's fail-fast check accepts it
    pixels, bad = prepare_pixels(images[:4], image_processor(str(tmp_path / "captioner")))
    assert bad == [None] * 4
    captions = Captioner(str(tmp_path / "captioner"), "cpu").caption(pixels, Generation(12))
    vocab = {w for t in texts for w in t.split()}
    assert len(captions) == 4 and all(set(c[0].split()) <= vocab for c in captions)


def test_true_captions_are_every_phrasing_of_the_scene():
    rng = np.random.default_rng(1)
    scene = random_scene(rng)
    meta = {"group": vars(scene.group), "background": scene.background}
    found = true_captions(meta)
    assert len(found) == len(PHRASES)
    assert all(caption(scene, np.random.default_rng(s)) in found for s in range(20))


def test_recaptioned_counts_synthetic_captions_by_truth(tmp_path):
    rows = scene_rows(3)
    roles = {key: {"role": "mismatched", "scene": meta["scene"]} for key, _, _, meta in rows}
    roles["copy"] = {"role": "near_copy", "of": rows[0][0]}
    right, wrong = rows[0][2], "untitled"
    build = [
        ("copy", rows[0][1], right, {"caption_source": "synthetic"}),
        (rows[1][0], rows[1][1], wrong, {"caption_source": "synthetic"}),
        (rows[2][0], rows[2][1], rows[2][2], {"caption_source": "original"}),
    ]
    counts = recaptioned(write_build(tmp_path / "arm", build), roles)
    assert counts == {
        "original": 1,
        "synthetic": 2,
        "synthetic_right": 1,
        "synthetic_colour_right": 1,
        "synthetic_shape_right": 1,
        "synthetic_background_right": 1,
        "synthetic_of_clean": 0,
        "synthetic_of_mismatched": 2,
    }

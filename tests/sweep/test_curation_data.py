"""The curation bench's data generator (bench/curation_data.py): the corruption mix it promises,
held-out eval, determinism. Fast: no Ray, no model."""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from mmcurate.stages.lib.image_hash import hamming, image_hash
from PIL import Image

from bench.curation_data import (
    BACKGROUNDS,
    DESCRIPTIONS,
    JUNK,
    Group,
    Scene,
    Sizes,
    caption,
    group_phrase,
    make_sets,
)

SMALL = Sizes(eval=40, seed=20, raw=400, popular=3)


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("curation")
    make_sets(root, SMALL, seed=3)
    return root, json.loads((root / "truth.json").read_text())


def files(folder: Path) -> dict[str, tuple[bytes, str]]:
    return {
        p.stem: (p.read_bytes(), p.with_suffix(".txt").read_text().strip())
        for p in sorted(folder.glob("*.jpg"))
    }


def describes(text: str, scene: dict) -> bool:
    group = Group(**scene["group"])
    return group_phrase(group) in text and BACKGROUNDS[scene["background"]][0] in text


def decodes(data: bytes) -> bool:
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
    except (OSError, ValueError, Image.DecompressionBombError):
        return False
    return True


def test_corruption_mix_is_exact(sets: tuple[Path, dict]) -> None:
    root, truth = sets
    counts = truth["counts"]
    assert counts["broken"] == round(400 * 0.02)
    assert counts["exact_copy"] + counts["near_copy"] == round(400 * 0.25)
    assert counts["near_copy"] == round(100 * 0.5)
    scenes = counts["clean"] + counts["mismatched"]
    assert counts["mismatched"] == round(scenes * 0.45)
    # the share of raw files whose caption is unrelated (copies inherit it): 40-50%
    roles = truth["roles"]
    unrelated = sum(
        roles[r.get("of", k)]["role"] == "mismatched"
        for k, r in roles.items()
        if r["role"] != "broken"
    )
    assert 0.40 <= unrelated / 400 <= 0.50
    assert len(files(root / "raw")) == 400


def test_captions_tell_the_truth_or_are_unrelated(sets: tuple[Path, dict]) -> None:
    root, truth = sets
    raw = files(root / "raw")
    junk = 0
    for key, role in truth["roles"].items():
        text = raw[key][1]
        if role["role"] == "clean":
            assert describes(text, role["scene"]), (key, text)
        elif role["role"] == "mismatched":
            assert not describes(text, role["scene"]), (key, text)
            junk += text in JUNK
    assert 0 < junk < truth["counts"]["mismatched"]  # boilerplate and other scenes' captions


def test_copies_repeat_their_source(sets: tuple[Path, dict]) -> None:
    root, truth = sets
    raw = files(root / "raw")
    sources, close = Counter(), []
    for key, role in truth["roles"].items():
        if role["role"] not in ("exact_copy", "near_copy"):
            continue
        source = role["of"]
        assert truth["roles"][source]["role"] in ("clean", "mismatched")
        assert raw[key][1] == raw[source][1]  # the same caption travels with the copy
        sources[source] += 1
        if role["role"] == "exact_copy":
            assert raw[key][0] == raw[source][0]
        else:  # a near-duplicate: other bytes, nearly the same picture
            assert raw[key][0] != raw[source][0]
            distance = hamming(image_hash(raw[key][0])[0], image_hash(raw[source][0])[0])
            close.append(distance <= 4)
    assert sources.most_common(1)[0][1] >= 10  # some scenes are copied many times
    # near_dedupe's default radius finds most near-duplicates, as on the web not all
    assert 0.75 <= np.mean(close) < 1


def test_broken_files_do_not_decode_and_the_rest_do(sets: tuple[Path, dict]) -> None:
    root, truth = sets
    raw = files(root / "raw")
    for key, role in truth["roles"].items():
        assert decodes(raw[key][0]) == (role["role"] != "broken"), key
    kinds = {r["kind"] for r in truth["roles"].values() if r["role"] == "broken"}
    assert kinds == {"truncated", "empty", "text"}


def test_eval_is_held_out_and_unambiguous(sets: tuple[Path, dict]) -> None:
    root, _ = sets
    evals = files(root / "eval")
    assert len(evals) == 40
    texts = [text for _, text in evals.values()]
    assert len(set(texts)) == len(texts)  # a repeated caption would tie
    fixed = {caption(scene, None) for scene in DESCRIPTIONS}
    assert set(texts) <= fixed
    trained = {data for name in ("raw", "seed") for data, _ in files(root / name).values()}
    assert not trained & {data for data, _ in evals.values()}


def test_oracle_is_the_clean_distinct_raw_files(sets: tuple[Path, dict]) -> None:
    root, truth = sets
    raw, oracle = files(root / "raw"), files(root / "oracle")
    clean = {k for k, r in truth["roles"].items() if r["role"] == "clean"}
    assert set(oracle) == clean == set(oracle) & set(raw)
    assert all(oracle[k] == raw[k] for k in oracle)
    assert len({data for data, _ in oracle.values()}) == len(oracle)
    assert truth["oracle"] == len(clean)


def test_seed_set_is_clean(sets: tuple[Path, dict]) -> None:
    root, _ = sets
    seed = files(root / "seed")
    assert len(seed) == 20
    assert all(decodes(data) for data, _ in seed.values())
    assert all(
        any(group_phrase(s.group) in text for s in DESCRIPTIONS) for _, text in seed.values()
    )


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    tiny = Sizes(eval=5, seed=5, raw=40, popular=2)
    make_sets(tmp_path / "a", tiny, seed=1)
    make_sets(tmp_path / "b", tiny, seed=1)
    make_sets(tmp_path / "c", tiny, seed=2)
    for name in ("eval", "seed", "raw", "oracle"):
        assert files(tmp_path / "a" / name) == files(tmp_path / "b" / name)
        assert files(tmp_path / "a" / name) != files(tmp_path / "c" / name)
    truth = [json.loads((tmp_path / x / "truth.json").read_text()) for x in "ab"]
    assert truth[0] == truth[1]


def test_keys_say_nothing_of_roles(sets: tuple[Path, dict]) -> None:
    _, truth = sets
    keys = list(truth["roles"])
    first_half = {truth["roles"][k]["role"] for k in keys[: len(keys) // 2]}
    assert {"clean", "mismatched", "exact_copy", "near_copy"} <= first_half


def test_refuses_to_write_over_existing_sets(tmp_path: Path) -> None:
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "mine.jpg").write_bytes(b"keep me")
    with pytest.raises(FileExistsError):
        make_sets(tmp_path, Sizes(eval=2, seed=2, raw=20, popular=1))
    assert (tmp_path / "raw" / "mine.jpg").read_bytes() == b"keep me"
    assert not (tmp_path / "eval").exists()


@pytest.mark.parametrize(
    "bad",
    [
        {"mismatched": 1.5},
        {"broken": -0.1},
        {"copies": 0.9, "broken": 0.1},
        {"eval": len(DESCRIPTIONS) + 1},
        {"raw": 5},
        {"popular": 0},
    ],
)
def test_impossible_sizes_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError, match="Sizes"):
        Sizes(**bad)


def test_every_description_has_a_visible_object() -> None:
    rng = np.random.default_rng(0)
    from bench.curation_data import COLOURS, draw

    for scene in DESCRIPTIONS[::7]:
        pixels = np.asarray(draw(scene, rng), dtype=np.int16)
        colour = np.array(COLOURS[scene.group.colour])
        near = (np.abs(pixels - colour).sum(axis=2) < 30).mean()
        assert near > 0.02, scene  # the objects cover part of the picture
    assert Scene(Group(1, "red", "circle"), "grass") in DESCRIPTIONS

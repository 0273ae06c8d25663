"""The offline demo image-text set: counts, distinct bytes, determinism, broken files."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest
from mmcurate.pipeline.demo_data import (
    SUBJECTS,
    SUBJECTS_ZH,
    iter_samples,
    make_demo_images,
    make_image_text_pairs,
    write_tar_shards,
)
from PIL import Image

IMAGE_EXTS = {".jpg", ".png"}


def _images(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix in IMAGE_EXTS)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _decodes(path: Path) -> bool:
    try:
        with Image.open(path) as image:
            image.load()
    except OSError:  # UnidentifiedImageError and truncation errors are OSErrors
        return False
    return True


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[Path, dict]:
    folder = tmp_path_factory.mktemp("demo")
    return folder, make_demo_images(folder, n=40, exact_copies=4, broken=6, seed=3)


def test_counts(demo):
    folder, summary = demo
    assert summary == {
        "samples": 40,
        "exact_copies": 4,
        "broken": 6,
        "files": 50,
        "distinct_decodable": 40,
    }
    assert len(_images(folder)) == 50
    assert len(list(folder.glob("*.txt"))) == 50


def test_every_image_has_a_caption(demo):
    folder, _ = demo
    for image in _images(folder):
        caption = image.with_suffix(".txt").read_text().strip()
        assert caption, image.name


def test_sample_captions_name_their_subject(demo):
    folder, _ = demo
    subjects = set(SUBJECTS.values()) | set(SUBJECTS_ZH.values())  # one caption in 5 is Chinese
    for image in folder.glob("sample_*"):
        if image.suffix in IMAGE_EXTS:
            caption = image.with_suffix(".txt").read_text()
            assert any(subject in caption for subject in subjects), caption


def test_samples_distinct_and_copies_exact(demo):
    folder, _ = demo
    samples = [_digest(p) for p in _images(folder) if p.name.startswith("sample_")]
    copies = [_digest(p) for p in _images(folder) if p.name.startswith("copy_")]
    assert len(samples) == 40 and len(set(samples)) == 40
    assert len(copies) == 4 and len(set(copies)) == 4
    assert set(copies) <= set(samples)


def test_good_images_decode_and_broken_ones_fail(demo):
    folder, _ = demo
    for path in _images(folder):
        if path.name.startswith("broken_"):
            assert not _decodes(path), path.name
            continue
        assert _decodes(path), path.name
        with Image.open(path) as image:
            assert 200 <= max(image.size) <= 400
            assert image.mode in ("L", "RGB")


def test_deterministic_for_a_seed(tmp_path):
    def snapshot(folder: Path) -> dict[str, str]:
        return {p.name: _digest(p) for p in sorted(folder.iterdir())}

    make_demo_images(tmp_path / "a", n=15, exact_copies=2, broken=5, seed=7)
    make_demo_images(tmp_path / "b", n=15, exact_copies=2, broken=5, seed=7)
    make_demo_images(tmp_path / "c", n=15, exact_copies=2, broken=5, seed=8)
    assert snapshot(tmp_path / "a") == snapshot(tmp_path / "b")
    assert snapshot(tmp_path / "a") != snapshot(tmp_path / "c")


def test_png_samples_decode():
    samples = list(iter_samples(3, seed=1, png_fraction=1.0))
    assert [s.ext for s in samples] == ["png"] * 3
    for sample in samples:
        with Image.open(io.BytesIO(sample.data)) as image:
            assert image.format == "PNG"


def test_too_many_copies_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="exact_copies"):
        make_demo_images(tmp_path, n=2, exact_copies=3)


def test_image_text_pairs_are_all_clean(tmp_path):
    folder = make_image_text_pairs(tmp_path / "pairs", n=6, seed=2)
    images = _images(folder)
    assert len(images) == 6 and all(_decodes(p) for p in images)


def test_tar_shards_are_webdataset_groups(tmp_path):
    paths = write_tar_shards(tmp_path, n_shards=3, per_shard=4, seed=0)
    assert [p.name for p in paths] == [f"shard-{i:06d}.tar" for i in range(3)]
    keys = []
    for path in paths:
        with tarfile.open(path) as tar:
            names = tar.getnames()
            assert len(names) == 12
            for name in names:
                key, ext = name.split(".", 1)
                assert ext in ("jpg", "txt", "json")
                if ext == "json":
                    meta = json.loads(tar.extractfile(name).read())
                    assert meta["subject"] in SUBJECTS.values()
                if ext == "jpg":
                    keys.append(key)
    assert len(keys) == 12 and len(set(keys)) == 12


def test_tar_shards_are_byte_stable(tmp_path):
    first = write_tar_shards(tmp_path / "a", n_shards=1, per_shard=3, seed=4)
    second = write_tar_shards(tmp_path / "b", n_shards=1, per_shard=3, seed=4)
    assert first[0].read_bytes() == second[0].read_bytes()


def test_fixtures(image_folder, tar_shards):
    folder = image_folder(n=5, exact_copies=1, broken=2)
    assert len(_images(folder)) == 8
    shards = tar_shards(n_shards=2, per_shard=3)
    assert len(list(shards.glob("*.tar"))) == 2
    assert image_folder(n=3) != folder  # each call gets its own folder

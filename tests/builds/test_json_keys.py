"""One json key set in every sample of a build (issue 45, item 14): a key that only later
samples' sidecars hold (`license`) is in every sample's json, null where absent, so Hugging
Face `datasets` (which takes its features from the first shard) reads it back; media stay
byte for byte what they were, stored copies (references) included."""

import io
import json
import os

import pytest
from mmcurate.core.tario import iter_tar_samples
from mmcurate.pipeline.build import run_build
from mmcurate.pipeline.config import BuildConfig
from mmcurate.pipeline.output.hf_features import webdataset_features
from mmcurate.pipeline.output.json_fill import apply_fill, filled_json, slice_pieces
from PIL import Image


def jpeg(colour: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    Image.effect_noise((48, 48), 40 + colour[0] % 50).convert("RGB").save(out, "JPEG")
    return out.getvalue()


def test_filled_json_adds_missing_keys_as_null_and_leaves_the_rest():
    assert filled_json('{"a": 1}', ["a", "b"]) == '{"a": 1, "b": null}'
    assert filled_json('{"b": 2, "a": 1}', ["a", "b"]) is None  # nothing missing: untouched
    assert filled_json(None, ["a"]) == '{"a": null}'
    assert filled_json("[1, 2]", ["a"]) is None and filled_json("{bad", ["a"]) is None
    assert filled_json('{"a": 1}', []) is None


def test_a_fill_replaces_only_the_json_bytes_of_a_record_made_of_pieces():
    pieces = [(0, 100, 110), b"HEAD", (3, 0, 6), (0, 110, 120)]  # 10 + 4 + 6 + 10 bytes
    assert slice_pieces(pieces, 12, 17) == [b"AD", (3, 0, 3)]
    assert apply_fill(pieces, (12, 5, b"new")) == [
        (0, 100, 110),
        b"HE",
        b"new",
        (3, 3, 6),
        *pieces[3:],
    ]
    assert apply_fill(pieces, (30, 0, b"end")) == [*pieces, b"end"]  # a json added at the end


@pytest.mark.parametrize("copies", [False, True])
def test_a_key_first_seen_in_a_later_shard_is_in_every_samples_json(ray_session, tmp_path, copies):
    folder = tmp_path / "in"
    folder.mkdir()
    images = {}
    for i in range(8):
        images[i] = jpeg((i * 30, 0, 0)) if not (copies and i == 7) else images[0]
        (folder / f"img{i}.jpg").write_bytes(images[i])
        (folder / f"img{i}.txt").write_text(f"picture {i}")
        meta = {"author": f"person {i}"} | ({"license": "cc-by"} if i >= 5 else {})
        (folder / f"img{i}.json").write_text(json.dumps(meta | ({"note": i} if i == 3 else {})))
    (folder / "img1.json").unlink()  # a sample without a sidecar
    cfg = BuildConfig.model_validate(
        {
            "source": {"kind": "images", "path": str(folder), "files_per_task": 2},
            "stages": [{"name": "caption_filter", "min_words": 1}],
            "output": {
                "path": str(tmp_path / "out"),
                "shard_max_samples": 3,
                "store_copies_once": copies,
            },
        }
    )
    manifest = run_build(cfg, progress=False)
    assert manifest["samples"] == 8 and len(manifest["shards"]) == 3
    keys, samples = [], {}
    for shard in manifest["shards"]:
        with open(tmp_path / "out" / shard["name"], "rb") as f:
            for sample in iter_tar_samples(f):
                meta = json.loads(sample["json"])
                keys.append(sorted(meta))
                samples[sample["__key__"]] = (meta, sample["jpg"])
    assert all(k == ["author", "license", "note", "source"] for k in keys), keys
    for i in range(8):
        meta, data = samples[f"img{i}"]
        assert data == images[i]  # media copied as they were
        assert meta["license"] == ("cc-by" if i >= 5 else None)
        assert meta["author"] == (None if i == 1 else f"person {i}")
        assert meta["note"] == (3 if i == 3 else None)


def test_hugging_face_datasets_reads_a_key_that_only_later_shards_hold(ray_session, tmp_path):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # read at import: nothing leaves loopback
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    from datasets import load_dataset

    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(6):
        (folder / f"img{i}.jpg").write_bytes(jpeg((i * 40, 0, 0)))
        (folder / f"img{i}.txt").write_text(f"picture {i}")
        meta = {"author": f"p{i}"} | ({"license": "cc-by"} if i >= 4 else {})
        (folder / f"img{i}.json").write_text(json.dumps(meta))
    cfg = BuildConfig.model_validate(
        {
            "source": {"kind": "images", "path": str(folder), "files_per_task": 2},
            "stages": [{"name": "caption_filter", "min_words": 1}],
            "output": {"path": str(tmp_path / "out"), "shard_max_samples": 2},
        }
    )
    manifest = run_build(cfg, progress=False)
    files = [str(tmp_path / "out" / s["name"]) for s in manifest["shards"]]
    features = webdataset_features(str(tmp_path / "out"))
    loaded = load_dataset(
        "webdataset",
        data_files={"train": files},
        split="train",
        features=features,
        cache_dir=str(tmp_path / "hf"),
    )
    licenses = {row["__key__"]: row["json"]["license"] for row in loaded}
    assert licenses == {f"img{i}": ("cc-by" if i >= 4 else None) for i in range(6)}
    assert {row["__key__"]: row["txt"] for row in loaded}["img5"] == "picture 5"
    assert loaded[0]["jpg"].size == (48, 48)

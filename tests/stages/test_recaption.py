"""recaption: a tiny random BLIP-2 saved to a folder as a user's would be, real generation on
real photos; captions equal a plain transformers loop, each `choose` against a computation
here, a killed build resumes to the same manifest, a bad folder fails fast in one line."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import yaml
from mmcurate.pipeline.build import run_build
from mmcurate.pipeline.config import BuildConfig
from mmcurate.pipeline.demo_data import make_demo_images
from mmcurate.stages.base import DROP

from tests.kit_recaption import (
    CLIP,
    photo_batch,
    recaption_build,
    run_cli,
    run_stages,
    score,
)
from tests.tiny_blip2 import save_tiny_blip2


@pytest.fixture(scope="module")
def blip2(tmp_path_factory) -> Path:
    return save_tiny_blip2(tmp_path_factory.mktemp("blip2") / "model")


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("photos")
    make_demo_images(folder, n=10, exact_copies=0, broken=0, seed=3)
    return folder


def plain_loop(folder: Path, batch: dict, size: int, tokens: int, prompt: str | None) -> list:
    """What a user writes with transformers alone: processor, generate, batch_decode."""
    import torch
    from PIL import Image
    from transformers import AutoProcessor, Blip2ForConditionalGeneration

    processor = AutoProcessor.from_pretrained(folder)
    model = Blip2ForConditionalGeneration.from_pretrained(folder).eval()
    captions = []
    for at in range(0, len(batch["jpg"]), size):
        import io

        images = [Image.open(io.BytesIO(b)).convert("RGB") for b in batch["jpg"][at : at + size]]
        text = {"text": [prompt] * len(images)} if prompt else {}
        inputs = processor(images=images, return_tensors="pt", **text)
        with torch.inference_mode():
            out = model.generate(**inputs, max_new_tokens=tokens, do_sample=False)
        new = out[:, inputs["input_ids"].shape[1] :] if prompt else out  # the prompt's tokens
        for caption in processor.batch_decode(new, skip_special_tokens=True):
            captions.append(" ".join(caption.split()))
    return captions


@pytest.mark.parametrize("prompt", [None, "a photo of", "white"])  # white: the model's 1st word
def test_captions_equal_a_plain_generate_loop(one_torch_thread, blip2, photos, prompt):
    spec = {
        "name": "recaption",
        "model": str(blip2),
        "choose": "synthetic",
        "batch_size": 4,
        "max_new_tokens": 6,
        "prompt": prompt,
    }
    out = run_stages([spec], photo_batch(photos))
    expected = plain_loop(blip2, photo_batch(photos), 4, 6, prompt)
    metas = [json.loads(m) for m in out["json"]]
    assert [m["captions"] for m in metas] == [[c] if c else [] for c in expected]
    assert any(expected) and len(set(expected)) > 3  # real, varied generation
    originals = photo_batch(photos)["txt"]
    for meta, txt, original, caption in zip(metas, out["txt"], originals, expected, strict=True):
        assert meta["caption_original"] == original
        assert txt == (caption or original)
        assert meta["caption_source"] == ("synthetic" if caption else "original")
        assert "caption_scores" not in meta  # no clip_score stage: no scores
    if prompt == "white":  # the model writes the prompt's word itself: it stays
        assert all(c.startswith("white") for c in expected)


def test_sampling_is_seeded_per_key_not_per_batch(one_torch_thread, blip2, photos):
    spec = {
        "name": "recaption",
        "model": str(blip2),
        "choose": "original",
        "sample": True,
        "num_captions": 3,
        "max_new_tokens": 5,
        "batch_size": 4,
        "temperature": 1.5,
    }
    first = run_stages([spec], photo_batch(photos))
    again = run_stages([{**spec, "batch_size": 1}], photo_batch(photos))
    other = run_stages([{**spec, "seed": 7}], photo_batch(photos))
    captions = [json.loads(m)["captions"] for m in first["json"]]
    assert captions == [json.loads(m)["captions"] for m in again["json"]]
    assert captions != [json.loads(m)["captions"] for m in other["json"]]
    assert all(len(set(c)) > 1 for c in captions if len(c) == 3)  # draws differ within a sample
    assert first["txt"] == photo_batch(photos)["txt"]  # original: stored only


def expected_choice(mode: str, meta: dict, original_score: float, key: str, t: float) -> str:
    """Which caption `mode` must pick, from scores computed in this test."""
    scores = meta.get("caption_scores", [])
    if mode == "best_score":
        return "synthetic" if scores and max(scores) > original_score else "original"
    if mode == "fill":
        if original_score >= t:
            return "original"
        return "synthetic" if scores and max(scores) >= t else "dropped"
    if mode == "mix":
        digest = hashlib.sha256(f"0/{key}/-1".encode()).digest()
        share = (int.from_bytes(digest[:8], "little") & (2**63 - 1)) / 2**63
        return "synthetic" if share < 0.5 and meta["captions"] else "original"
    return "synthetic" if mode == "synthetic" and meta["captions"] else "original"


@pytest.mark.parametrize("mode", ["best_score", "fill", "mix", "synthetic", "original"])
def test_choose_against_scores_computed_here(one_torch_thread, blip2, photos, mode):
    scored = run_stages([CLIP], photo_batch(photos))
    originals = scored["clip_score"]
    threshold = float(np.median(originals))
    spec = {
        "name": "recaption",
        "model": str(blip2),
        "choose": mode,
        "max_new_tokens": 6,
        "sample": True,
        "num_captions": 2,
        "batch_size": 4,
    }
    spec.update({"fill": {"min_score": threshold}, "mix": {"mix": 0.5}}.get(mode, {}))
    out = run_stages([CLIP, spec], photo_batch(photos))
    counts = {}
    for i, key in enumerate(out["__key__"]):
        meta = json.loads(out["json"][i])
        image = np.asarray(out["embedding"][i] if out[DROP][i] is None else scored["embedding"][i])
        original = photo_batch(photos)["txt"][i]
        assert meta["caption_original"] == original
        own = score(image, [original])[0]
        if meta["captions"]:
            assert meta["caption_scores"] == score(image, meta["captions"])
        if mode == "fill" and originals[i] >= threshold:
            assert meta["captions"] == []  # the cheap mode: kept originals are not captioned
        want = expected_choice(mode, meta, originals[i] if mode == "fill" else own, key, threshold)
        counts[want] = counts.get(want, 0) + 1
        if want == "dropped":
            assert out[DROP][i] == "low_clip_score"
            continue
        assert out[DROP][i] is None and meta["caption_source"] == want
        if want == "original":
            assert out["txt"][i] == original and out["clip_score"][i] == originals[i]
        else:
            best = int(np.argmax(meta["caption_scores"]))
            assert out["txt"][i] == meta["captions"][best]
            assert out["clip_score"][i] == meta["clip_score"] == meta["caption_scores"][best]
            assert meta["caption_original_score"] == originals[i]
    if mode in ("best_score", "fill", "mix"):
        assert len(counts) > 1, counts  # the test data exercises both outcomes


def test_mix_share_is_the_configured_fraction():
    from mmcurate.stages.recaption import mix_share

    shares = [mix_share(0, f"key{i:05d}") for i in range(4000)]
    assert abs(np.mean(np.array(shares) < 0.8) - 0.8) < 0.03


def test_failed_generation_keeps_the_original(one_torch_thread, blip2, photos):
    batch = photo_batch(photos)
    batch["jpg"][0] = b"not an image"
    spec = {
        "name": "recaption",
        "model": str(blip2),
        "choose": "synthetic",
        "max_new_tokens": 4,
        "min_words": 50,
    }
    out = run_stages([spec], batch)
    assert out["recaption_fallback"] == ["decode_error"] + ["too_short"] * (len(batch["jpg"]) - 1)
    assert out["txt"] == photo_batch(photos)["txt"] and set(out[DROP]) == {None}
    assert json.loads(out["json"][0])["recaption_fallback"] == "decode_error"


@pytest.mark.slow
def test_killed_build_resumes_to_the_same_manifest(ray_session, blip2, photos, tmp_path, caplog):
    clean = run_build(BuildConfig.model_validate(recaption_build(photos, blip2, tmp_path / "a")))
    out = tmp_path / "b"
    from tests.kit_builds import kill_build_after

    finished = kill_build_after(recaption_build(photos, blip2, out), out, partitions=1)
    assert 1 <= finished < 5
    with caplog.at_level(logging.INFO, logger="mmcurate.build"):
        resumed = run_build(BuildConfig.model_validate(recaption_build(photos, blip2, out)))
    skipped = [r.args[0] for r in caplog.records if r.msg.startswith("resuming")]
    assert skipped and skipped[0] >= finished
    assert resumed["shards"] == clean["shards"] and resumed["samples"] == 10


def test_recaption_build_writes_captions_into_shards(blip2, photos, tmp_path):
    import tarfile

    manifest = run_build(BuildConfig.model_validate(recaption_build(photos, blip2, tmp_path)))
    assert manifest["samples"] == 10
    metas, texts = {}, {}
    for shard in manifest["shards"]:
        with tarfile.open(tmp_path / shard["name"]) as tar:
            for member in tar.getmembers():
                key, ext = member.name.split(".", 1)
                if ext in ("json", "txt"):
                    data = tar.extractfile(member).read().decode()
                    (metas if ext == "json" else texts)[key] = data
    for key, meta in metas.items():
        meta = json.loads(meta)
        assert meta["caption_original"] == (photos / f"{key}.txt").read_text()
        want = meta["captions"][0] if meta["caption_source"] == "synthetic" else None
        assert texts[key] == (want or meta["caption_original"])


def damaged(blip2: Path, tmp_path: Path, damage: str) -> Path:
    import shutil

    folder = tmp_path / "model"
    if damage != "missing":
        shutil.copytree(blip2, folder)
    if damage == "empty":
        for file in folder.iterdir():
            file.unlink()
    weights = folder / "model.safetensors"
    if damage == "truncated":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    if damage == "bad_config":
        (folder / "config.json").write_text("{not json")
    return folder


@pytest.mark.parametrize(
    "damage, message",
    [
        ("missing", "captioning model folder not found"),
        ("empty", "cannot load captioning model from"),
        ("bad_config", "cannot load captioning model from"),
        ("truncated", "model.safetensors is truncated"),
    ],
)
def test_bad_model_folder_fails_check_in_one_line(blip2, tmp_path, damage, message):
    from mmcurate.core.config_io import ConfigError
    from mmcurate.stages.registry import build_stage

    folder = damaged(blip2, tmp_path, damage)
    stage = build_stage({"name": "recaption", "model": str(folder), "choose": "synthetic"}, 3)
    with pytest.raises(ConfigError) as err:
        stage.check()
    assert str(err.value).startswith("stages.3.model: ") and message in str(err.value)
    assert len(str(err.value).splitlines()) == 1


def test_bad_model_folder_fails_the_cli_before_reading(blip2, photos, tmp_path):
    config = recaption_build(photos, damaged(blip2, tmp_path, "truncated"), tmp_path / "out")
    (tmp_path / "build.yaml").write_text(yaml.safe_dump(config))
    result = run_cli("build", str(tmp_path / "build.yaml"), "--no-progress")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: stages.1.model: cannot load captioning model"), lines[0]
    assert lines[0].endswith("model.safetensors is truncated")
    assert not (tmp_path / "out").exists()  # nothing read, nothing written


def test_choose_needs_its_clip_score_and_threshold(blip2):
    from mmcurate.core.config_io import ConfigError
    from mmcurate.stages.registry import validate_stage_list

    base = {"name": "recaption", "model": str(blip2)}
    cases = [
        ([{**base, "choose": "best_score"}], "stages.0.choose: best_score needs a clip_score"),
        ([CLIP, {**base, "choose": "fill"}], "choose: fill needs min_score"),
        (
            [{**CLIP, "min_score": 0.2}, {**base, "choose": "fill", "min_score": 0.2}],
            "stages.1.choose: fill applies min_score itself",
        ),
        ([{**base, "num_captions": 2}], "num_captions > 1 needs sample: true"),
    ]
    for specs, message in cases:
        with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
            validate_stage_list(specs)
    validate_stage_list([CLIP, {**base, "choose": "fill", "min_score": 0.2}])

"""recaption under repetition and damage (issue 45): the first original survives any number of
recaptions; a damaged or wrong model folder fails the config check in one line; samples that
came without a caption reach a best_score/fill captioner; an echoed prompt is cut only at the
start of a caption."""

from __future__ import annotations

import json
import shutil
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
import yaml
from mmcurate.core.config_io import ConfigError
from mmcurate.stages.base import DROP, DROP_STAGE
from mmcurate.stages.registry import build_stage

from tests.kit_recaption import (
    CLIP,
    photo_batch,
    recaption_build,
    run_cli,
    run_stages,
    score,
)
from tests.tiny_blip2 import save_tiny_blip, save_tiny_blip2


@pytest.fixture(scope="module")
def blip2(tmp_path_factory) -> Path:
    return save_tiny_blip2(tmp_path_factory.mktemp("blip2") / "model")


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    from mmcurate.pipeline.demo_data import make_demo_images

    folder = tmp_path_factory.mktemp("photos")
    make_demo_images(folder, n=10, exact_copies=0, broken=0, seed=3)
    return folder


def recaption(blip2: Path, choose: str, **options) -> dict:
    spec = {"name": "recaption", "model": str(blip2), "choose": choose, "max_new_tokens": 6}
    return {**spec, "batch_size": 4, **options}


def metas(batch: dict) -> list[dict]:
    return [json.loads(m) for m in batch["json"]]


# item 3: the first original survives every later recaption


def test_two_recaptions_in_one_config_keep_the_first_original(one_torch_thread, blip2, photos):
    originals = photo_batch(photos)["txt"]
    first_scores = run_stages([CLIP], photo_batch(photos))["clip_score"]
    second = recaption(blip2, "synthetic", sample=True, seed=7, temperature=1.5)
    out = run_stages([CLIP, recaption(blip2, "synthetic"), second], photo_batch(photos))
    once = run_stages([CLIP, recaption(blip2, "synthetic")], photo_batch(photos))
    assert out["txt"] != once["txt"]  # the second stage did write other captions
    for meta, original, first in zip(metas(out), originals, first_scores, strict=True):
        assert meta["caption_original"] == original
        assert meta["caption_original_score"] == first  # the original's, not the first synthetic's
        assert meta["caption_source"] == "synthetic"


def test_recaptioning_a_recaptioned_build_keeps_the_first_original(one_torch_thread, blip2, photos):
    originals = photo_batch(photos)["txt"]
    built = run_stages([CLIP, recaption(blip2, "synthetic")], photo_batch(photos))
    assert all(m["caption_source"] == "synthetic" for m in metas(built))
    # a webdataset source over its shards carries txt and json; media as before
    again = {**photo_batch(photos), "txt": list(built["txt"]), "json": list(built["json"])}
    kept = run_stages([CLIP, recaption(blip2, "original", sample=True, seed=3)], again)
    for meta, original in zip(metas(kept), originals, strict=True):
        assert meta["caption_original"] == original
        assert meta["caption_source"] == "synthetic"  # txt still holds the first synthetic one
    assert kept["txt"] == built["txt"]
    again = {**photo_batch(photos), "txt": list(kept["txt"]), "json": list(kept["json"])}
    third = run_stages([CLIP, recaption(blip2, "synthetic", sample=True, seed=9)], again)
    assert [m["caption_original"] for m in metas(third)] == originals


def test_null_provenance_keys_count_as_absent(one_torch_thread, blip2, photos):
    """A build writes keys absent from a sample as null: such a sample was never recaptioned."""
    batch = photo_batch(photos)
    batch["json"] = [json.dumps({"caption_original": None, "caption_source": None})] * 10
    out = run_stages([CLIP, recaption(blip2, "synthetic")], batch)
    assert [m["caption_original"] for m in metas(out)] == photo_batch(photos)["txt"]
    assert {m["caption_source"] for m in metas(out)} == {"synthetic"}


# item 7 and item 11: the folder check


def lfs_pointer(folder: Path) -> None:
    (folder / "model.safetensors").write_text(
        f"version https://git-lfs.github.com/spec/v1\noid sha256:{'a' * 64}\nsize 15498310536\n"
    )


def as_torch_bin(folder: Path) -> dict:
    from safetensors.torch import load_file

    state = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    return state


def garbage_bin(folder: Path) -> None:
    as_torch_bin(folder)
    (folder / "pytorch_model.bin").write_bytes(np.random.default_rng(0).bytes(4096))


def garbage_zip_bin(folder: Path) -> None:
    as_torch_bin(folder)
    with zipfile.ZipFile(folder / "pytorch_model.bin", "w") as archive:
        archive.writestr("archive/data.pkl", b"not a pickle")


def list_bin(folder: Path) -> None:
    import torch

    as_torch_bin(folder)
    torch.save([1, 2, 3], folder / "pytorch_model.bin")


def sharded_missing(folder: Path) -> None:
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    shards = {"a": "model-00001-of-00002.safetensors", "b": "model-00002.st"}
    index = {"metadata": {}, "weight_map": shards}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def index_no_metadata(folder: Path) -> None:
    (folder / "model.safetensors").rename(folder / "model-1.safetensors")
    index = {"weight_map": {"a": "model-1.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def bad_header(folder: Path) -> None:
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", 10) + b'{"a": 1}  ' + b"x" * 64)


def other_name(folder: Path) -> None:
    (folder / "model.safetensors").rename(folder / "weights.safetensors")
    (folder / "training_args.bin").write_bytes(b"x")


def no_tokenizer(folder: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink()


def a_model(kind: str):
    """A tiny CLIP or GPT-2 folder's model, as save_pretrained writes it."""
    from transformers import CLIPConfig, CLIPModel, GPT2Config, GPT2LMHeadModel

    layers = dict(hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2)
    if kind == "clip":
        vision = dict(layers, image_size=32, patch_size=8)
        return CLIPModel(CLIPConfig(text_config=layers, vision_config=vision, projection_dim=8))
    return GPT2LMHeadModel(GPT2Config(n_embd=16, n_layer=1, n_head=2))


DAMAGE = {
    "lfs_pointer": (lfs_pointer, "model.safetensors is a git-lfs pointer, not the weights"),
    "ff_header": (
        lambda f: (f / "model.safetensors").write_bytes(b"\xff" * 64),
        "model.safetensors is not a safetensors file (header length 18446744073709551615)",
    ),
    "bad_header": (bad_header, "model.safetensors has a malformed safetensors header"),
    "garbage_bin": (garbage_bin, "pytorch_model.bin is not a PyTorch checkpoint"),
    "garbage_zip_bin": (garbage_zip_bin, "pytorch_model.bin is not a readable PyTorch checkpoint"),
    "list_bin": (list_bin, "pytorch_model.bin holds no state dict of tensors"),
    "sharded_missing": (sharded_missing, "names model-00002.st, which is not in the folder"),
    "index_no_metadata": (index_no_metadata, "model.safetensors.index.json has no metadata"),
    "other_name": (other_name, "no weights (model.safetensors, pytorch_model.bin or their"),
    "no_config": (lambda f: (f / "config.json").unlink(), "no config.json in the folder"),
    "no_tokenizer": (no_tokenizer, "its tokenizer has no vocabulary (tokenizer files missing)"),
    "clip": (
        lambda f: a_model("clip").save_pretrained(f),
        "it holds CLIPModel (model_type 'clip'), not an image-to-text model: recaption "
        "needs BLIP-2 or a model AutoModelForImageTextToText loads",
    ),
    "gpt2": (
        lambda f: a_model("gpt2").save_pretrained(f),
        "it holds GPT2LMHeadModel (model_type 'gpt2'), not an image-to-text model",
    ),
}


def damaged(blip2: Path, tmp_path: Path, damage: str) -> Path:
    folder = tmp_path / "model"
    if damage in ("clip", "gpt2"):
        folder.mkdir()
    else:
        shutil.copytree(blip2, folder)
    DAMAGE[damage][0](folder)
    return folder


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_or_wrong_folder_fails_the_check_in_one_line(blip2, tmp_path, damage):
    folder = damaged(blip2, tmp_path, damage)
    stage = build_stage({"name": "recaption", "model": str(folder), "choose": "synthetic"}, 1)
    with pytest.raises(ConfigError) as err:
        stage.check()
    message = str(err.value)
    assert message.startswith(f"stages.1.model: cannot load captioning model from {folder}: ")
    assert DAMAGE[damage][1] in message and len(message.splitlines()) == 1


def test_every_weights_layout_the_loader_takes_passes_and_loads(blip2, tmp_path, one_torch_thread):
    import torch
    from mmcurate.stages.lib.captioner import Captioner, Generation
    from mmcurate.stages.lib.captioner_check import check_captioner
    from safetensors.torch import save_file

    layouts = {}
    folder = layouts["bin"] = tmp_path / "bin"
    shutil.copytree(blip2, folder)
    torch.save(as_torch_bin(folder), folder / "pytorch_model.bin")
    folder = layouts["sharded"] = tmp_path / "sharded"
    shutil.copytree(blip2, folder)
    state = as_torch_bin(folder)
    names = sorted(state)
    weight_map = {}
    for part, chunk in enumerate((names[: len(names) // 2], names[len(names) // 2 :])):
        file = f"model-{part + 1:05d}-of-00002.safetensors"
        save_file({n: state[n].contiguous() for n in chunk}, folder / file)
        weight_map.update(dict.fromkeys(chunk, file))
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    layouts["blip1"] = save_tiny_blip(tmp_path / "blip1")  # only the auto class loads it
    pixels = [np.zeros((32, 32, 3), np.uint8)]
    for name, folder in layouts.items():
        check_captioner(str(folder))
        assert len(Captioner(str(folder), "cpu").caption(pixels, Generation(4))) == 1, name


def test_lfs_pointer_fails_the_cli_before_any_shard_is_read(blip2, photos, tmp_path):
    folder = damaged(blip2, tmp_path, "lfs_pointer")
    config = recaption_build(photos, folder, tmp_path / "out")
    (tmp_path / "build.yaml").write_text(yaml.safe_dump(config))
    result = run_cli("build", str(tmp_path / "build.yaml"), "--no-progress")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: stages.1.model: "), result.stderr
    assert "git-lfs pointer" in lines[0] and not (tmp_path / "out").exists()


# item 12 (a): samples without a caption reach a best_score or fill captioner


def with_blanks(photos: Path) -> dict:
    batch = photo_batch(photos)
    for i, blank in ((1, ""), (4, "   "), (7, None)):
        batch["txt"][i] = blank
    return batch


@pytest.mark.parametrize("mode", ["best_score", "fill"])
def test_blank_captions_are_captioned_and_scored(one_torch_thread, blip2, photos, mode):
    options = {"min_score": -1.0} if mode == "fill" else {}
    out = run_stages([CLIP, recaption(blip2, mode, **options)], with_blanks(photos))
    for i in (1, 4, 7):
        meta = json.loads(out["json"][i])
        assert out[DROP][i] is None and meta["caption_source"] == "synthetic"
        assert meta["caption_original"] == with_blanks(photos)["txt"][i]
        assert out["txt"][i] == meta["captions"][0] and out["txt"][i].strip()
        want = score(np.asarray(out["embedding"][i]), [out["txt"][i]])[0]
        assert out["clip_score"][i] == meta["clip_score"] == pytest.approx(want, abs=2e-3)
        assert meta["caption_original_score"] is None  # it had none to score


def test_blank_captions_without_a_candidate_are_dropped_by_recaption(
    one_torch_thread, blip2, photos
):
    out = run_stages([CLIP, recaption(blip2, "best_score", min_words=50)], with_blanks(photos))
    assert [out[DROP][i] for i in (1, 4, 7)] == ["missing_caption"] * 3
    assert {out[DROP_STAGE][i] for i in (1, 4, 7)} == {"recaption"}
    assert sum(r is None for r in out[DROP]) == 7


def test_clip_score_bounds_apply_to_a_filled_caption(one_torch_thread, blip2, photos):
    clip = {**CLIP, "max_score": -1.0}  # every real score is above: all dropped
    out = run_stages([clip, recaption(blip2, "best_score")], with_blanks(photos))
    assert set(out[DROP]) == {"high_clip_score"}


def test_other_modes_leave_blank_captions_to_clip_score(one_torch_thread, blip2, photos):
    out = run_stages([CLIP, recaption(blip2, "mix", mix=0.5)], with_blanks(photos))
    assert [out[DROP][i] for i in (1, 4, 7)] == ["missing_caption"] * 3
    assert {out[DROP_STAGE][i] for i in (1, 4, 7)} == {"clip_score"}


# item 12 (b): only a leading echo of the prompt is cut


def test_strip_prompt_cuts_only_a_leading_echo():
    from mmcurate.stages.lib.captioner import strip_prompt

    assert strip_prompt("A  Photo of a dog", "a photo of") == "a dog"
    assert strip_prompt("a photograph of a dog", "a photo") == "a photograph of a dog"
    assert strip_prompt("a dog, a photo of it", "a photo of") == "a dog, a photo of it"
    assert strip_prompt(" a  dog ", None) == "a dog"


def test_generated_words_equal_to_the_prompt_are_kept(blip2, one_torch_thread):
    import torch
    from mmcurate.stages.lib.captioner import Captioner, Generation

    captioner = Captioner(str(blip2), "cpu")
    gen = Generation(prompt="a photo of")
    prompt_ids = captioner.inputs([np.zeros((32, 32, 3), np.uint8)], gen.prompt)["input_ids"]
    tokenizer = captioner.processor.tokenizer
    own = tokenizer("a photo of a dog", add_special_tokens=False, return_tensors="pt")
    tokens = torch.cat([prompt_ids, own["input_ids"]], dim=1)
    assert captioner.decode(tokens, prompt_ids, gen) == ["a photo of a dog"]

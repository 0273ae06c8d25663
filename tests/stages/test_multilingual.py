"""Multilingual text towers from a local folder, no hub: open_clip's `local-dir:` model folder
holding open_clip_config.json (a tiny ViT plus a Hugging Face BERT text tower), a tiny
BERT made here (text/config.json, text/model.safetensors: the text weights a CLIP starts
from) and a
WordPiece tokenizer trained here on the labelled multilingual captions.
clip_score scores Chinese captions with it; mmcurate train trains it and clip_score loads
the checkpoint."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from mmcurate.core.config_io import ConfigError
from mmcurate.stages.registry import build_stage
from mmcurate.trainer.config import ModelConfig, TrainConfig
from mmcurate.trainer.models import build_model, load_eval_model, resolve_weights
from mmcurate.trainer.train import train
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

from tests.kit_stages import batch_of, labelled
from tests.shapes import make_shapes, write_shards


def tiny_tokenizer(folder: Path) -> PreTrainedTokenizerFast:
    """A WordPiece tokenizer trained on the labelled multilingual captions (BERT-style:
    CJK characters become single tokens)."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True, handle_chinese_chars=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    trainer = trainers.WordPieceTrainer(vocab_size=800, special_tokens=specials)
    captions = [c for _, c in labelled()] + [s["txt"] for s in make_shapes(50, seed=0)]
    tok.train_from_iterator(captions, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )
    fast.save_pretrained(folder)
    return fast


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("multilingual-clip")
    tokenizer = tiny_tokenizer(folder)
    bert = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    # the "pretrained" text tower a CLIP starts from, in a subfolder: open_clip takes weights
    # in the model folder itself for the CLIP's own
    BertModel(bert).save_pretrained(folder / "text")
    text_cfg = {
        "hf_model_name": str(folder / "text"),  # BERT's config.json and weights
        "hf_tokenizer_name": str(folder),  # with local-dir: open_clip reads the folder's
        "hf_proj_type": "linear",
        "hf_pooler_type": "mean_pooler",
        "context_length": 32,
    }
    vision_cfg = {"image_size": 64, "layers": 2, "width": 64, "patch_size": 16}
    config = {"model_cfg": {"embed_dim": 64, "vision_cfg": vision_cfg, "text_cfg": text_cfg}}
    (folder / "open_clip_config.json").write_text(json.dumps(config))
    return folder


def test_tokenizer_reads_chinese_from_the_local_folder(model_folder):
    model_cfg = ModelConfig(name=f"local-dir:{model_folder}")
    _, _, tokenizer = build_model(model_cfg, torch.device("cpu"))
    ids = tokenizer(["一只橘猫在红色沙发上睡觉", "an orange cat"])
    assert ids.shape == (2, 32)
    unk = 1
    assert (ids[0] > 4).sum() >= 8 and not (ids == unk).any()  # every character known


def test_clip_score_with_a_local_multilingual_tower(model_folder):
    stage = build_stage(
        {"name": "clip_score", "model": f"local-dir:{model_folder}", "num_gpus": 0}
    )  # its default pretrained tag means nothing for a folder and is ignored
    samples = make_shapes(3, seed=2)
    captions = ["一只红色的圆", "赤い四角", "a red circle"]
    out = stage(batch_of([s["jpg"] for s in samples], captions))
    assert out["__drop__"] == [None] * 3
    assert all(np.isfinite(out["clip_score"]))
    text = np.stack(out["text_embedding"]).astype(np.float32)
    assert np.linalg.norm(text[0] - text[1]) > 1e-3  # different captions, different embeddings


def test_train_and_score_with_the_local_tower(model_folder, tmp_path):
    samples = make_shapes(64, seed=4)
    for s, (_, caption) in zip(samples, labelled(), strict=False):
        s["txt"] = f"{s['txt']} {caption}"  # English shapes plus captions in 8 languages
    manifest = write_shards(samples, tmp_path / "shards", per_shard=32)
    name = f"local-dir:{model_folder}"
    cfg = TrainConfig.model_validate(
        {
            "data": {"manifest": str(manifest), "batch_size": 16, "workers": 1, "seed": 0},
            "model": {"name": name},
            "run": {"output": str(tmp_path / "run"), "max_steps": 3, "log_every": 1},
        }
    )
    summary = train(cfg)
    checkpoint = summary["checkpoint"]
    model, _, tokenizer, info = load_eval_model(
        name, resolve_weights(name, checkpoint), torch.device("cpu")
    )
    assert info["kind"] == "mmcurate-checkpoint" and info["step"] == 3
    stage = build_stage(
        {"name": "clip_score", "model": name, "pretrained": checkpoint, "num_gpus": 0}
    )
    out = stage(batch_of([samples[0]["jpg"]], ["一只红色的圆"]))
    assert out["__drop__"] == [None] and np.isfinite(out["clip_score"][0])


def test_a_hub_id_as_text_tower_is_refused_before_any_download(model_folder, tmp_path):
    """Real open_clip configs name hub ids (`xlm-roberta-base`); with `local-dir:` that would
    make transformers fetch from a hub, so it is a one-line config error instead."""
    folder = tmp_path / "hub-named"
    folder.mkdir()
    config = json.loads((model_folder / "open_clip_config.json").read_text())
    config["model_cfg"]["text_cfg"]["hf_model_name"] = "xlm-roberta-base"
    (folder / "open_clip_config.json").write_text(json.dumps(config))
    name = f"local-dir:{folder}"
    stage = build_stage({"name": "clip_score", "model": name, "pretrained": None, "num_gpus": 0})
    with pytest.raises(ConfigError, match="'xlm-roberta-base' is not a local folder"):
        stage.check()
    with pytest.raises(ConfigError, match="model.name: .*is not a local folder"):
        resolve_weights(name, None)

"""clip_score concepts: zero-shot scores on the embeddings clip_score computes, on a tiny CLIP
trained here for a few seconds on red and blue shapes (tests/shapes.py)."""

import io
import json

import numpy as np
import open_clip
import pytest
import torch
from mmcurate.core.config_io import ConfigError
from mmcurate.core.model_configs import register
from mmcurate.stages.lib.text_prompts import concept_probability
from mmcurate.stages.registry import build_stage
from PIL import Image

from tests.kit_clip import TINY, roc_auc
from tests.kit_stages import batch_of
from tests.shapes import SHAPES, draw


def shapes(n: int, seed: int) -> list[tuple[str, bytes]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        colour = ("red", "blue")[i % 2]
        out.append((colour, draw(colour, str(rng.choice(SHAPES)), rng)))
    return out


@pytest.fixture(scope="module")
def red_blue_model(tmp_path_factory) -> str:
    """mmcurate-tiny trained 60 steps (batch 32) on 'a red/blue image' captions: a few
    seconds on one CPU thread. Saved as a plain open_clip state dict."""
    register()
    torch.manual_seed(0)
    model, preprocess, _ = open_clip.create_model_and_transforms("mmcurate-tiny")
    tokenizer = open_clip.get_tokenizer("mmcurate-tiny")
    loss_fn = open_clip.ClipLoss()
    optim = torch.optim.AdamW(model.parameters(), lr=2e-3)
    data = shapes(256, seed=1)
    images = torch.stack([preprocess(Image.open(io.BytesIO(b))) for _, b in data])
    texts = tokenizer([f"a {colour} image" for colour, _ in data])
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rng = np.random.default_rng(0)
        for _ in range(60):
            idx = torch.from_numpy(rng.choice(len(data), 32, replace=False))
            img, txt, scale = model(images[idx], texts[idx])
            loss = loss_fn(img, txt, scale)
            optim.zero_grad()
            loss.backward()
            optim.step()
    finally:
        torch.set_num_threads(before)
    path = tmp_path_factory.mktemp("redblue") / "red_blue.pt"
    torch.save({"state_dict": model.state_dict()}, path)
    return str(path)


def test_concept_on_trained_clip_separates_its_prompt_sets(red_blue_model):
    held_out = shapes(80, seed=7)
    concept = {"prompts": ["a red image"], "against": ["a blue image"], "max": 0.5}
    stage = build_stage(
        {**TINY, "pretrained": red_blue_model, "batch_size": 40, "concepts": {"red": concept}}
    )
    out = stage(batch_of([b for _, b in held_out], ["a picture"] * len(held_out)))
    scores = out["concept_red"]
    red = [s for (colour, _), s in zip(held_out, scores, strict=True) if colour == "red"]
    blue = [s for (colour, _), s in zip(held_out, scores, strict=True) if colour == "blue"]
    auc = roc_auc(red, blue)
    print(f"concept 'red' vs 'blue' held-out ROC AUC {auc:.4f} (40 + 40 images)")
    assert auc >= 0.95, auc
    # the threshold drops as concept_red, and the score is in the sample json
    for reason, meta, score in zip(out["__drop__"], out["json"], scores, strict=True):
        assert json.loads(meta)["concept_red"] == score
        assert reason == ("concept_red" if score > 0.5 else None)
    dropped_red = sum(
        1 for (c, _), r in zip(held_out, out["__drop__"], strict=True) if r and c == "red"
    )
    assert dropped_red >= 30


def test_presets_and_custom_prompt_sets_validate():
    stage = build_stage({**TINY, "concepts": {"watermark": {"max": 0.8}, "nsfw": {}, "text": {}}})
    out = stage(batch_of([draw("red", "circle", np.random.default_rng(0))], ["a red circle"]))
    for name in ("watermark", "nsfw", "text"):
        assert 0.0 <= out[f"concept_{name}"][0] <= 1.0
    with pytest.raises(ConfigError, match="no built-in prompts"):
        build_stage({**TINY, "concepts": {"logo": {"max": 0.5}}})
    with pytest.raises(ConfigError, match="concept name"):
        build_stage({**TINY, "concepts": {"Bad-Name": {"prompts": ["x"], "against": ["y"]}}})
    with pytest.raises(ConfigError, match="at least one prompt"):
        build_stage({**TINY, "concepts": {"x": {"prompts": [], "against": ["y"]}}})


def test_concept_probability_is_a_softmax_over_both_sets():
    images = np.array([[1.0, 0.0], [0.0, 1.0]])
    prompts = np.array([[1.0, 0.0], [0.0, 1.0]])
    p = concept_probability(images, prompts, 1)
    assert p[0] > 0.999 and p[1] < 0.001

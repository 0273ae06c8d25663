"""aesthetic_score: LAION heads (v1 linear, v2 MLP) with random weights saved as .pth and
.safetensors score exactly what a plain torch head computes on the same normalised open_clip
embeddings; an earlier clip_score's embeddings are reused; exact top fraction in a build;
unusable weights fail before any data is read, in one line."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from mmcurate.core.config_io import ConfigError
from mmcurate.pipeline.build import run_build
from mmcurate.pipeline.config import BuildConfig
from mmcurate.stages.registry import build_stage, build_stages
from PIL import Image

from tests.kit_aesthetic import TINY, random_head, save_head
from tests.kit_stages import batch_of
from tests.shapes import make_shapes, write_folder


@pytest.fixture(scope="module")
def plain_embeddings():
    """The shapes' image embeddings by open_clip alone (its own preprocess), normalised."""
    import open_clip
    from mmcurate.core.model_configs import register

    register()
    samples = make_shapes(12, seed=4)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)  # the seed mmcurate draws random weights with (pretrained None)
        model, _, preprocess = open_clip.create_model_and_transforms("mmcurate-tiny")
    pixels = torch.stack([preprocess(Image.open(io.BytesIO(s["jpg"]))) for s in samples])
    with torch.no_grad():
        embeddings = torch.nn.functional.normalize(model.eval().encode_image(pixels), dim=-1)
    return samples, embeddings


@pytest.mark.parametrize(
    "kind,suffix",
    [("mlp", ".pth"), ("mlp", ".safetensors"), ("linear", ".pth"), ("linear", ".safetensors")],
)
def test_scores_equal_a_plain_torch_head(tmp_path, plain_embeddings, kind, suffix):
    samples, embeddings = plain_embeddings
    head = random_head(kind)
    with torch.no_grad():
        expected = head(embeddings).squeeze(1).numpy()
    weights = save_head(head, tmp_path, suffix)
    stage = build_stage({"name": "aesthetic_score", "weights": weights, **TINY, "batch_size": 5})
    out = stage(batch_of([s["jpg"] for s in samples]))
    assert out["__drop__"] == [None] * len(samples)
    np.testing.assert_allclose(out["aesthetic_score"], expected, rtol=1e-4, atol=1e-4)
    assert np.std(expected) > 0.05  # the images score differently: the check has teeth
    meta = json.loads(out["json"][0])
    assert meta["aesthetic_score"] == out["aesthetic_score"][0]
    assert meta["aesthetic_model"] == f"head{suffix} on mmcurate-tiny/None"


def test_clip_scores_embeddings_are_reused_and_normalised(tmp_path):
    head = random_head("mlp")
    weights = save_head(head, tmp_path, ".pth")
    stages = build_stages(
        [
            {"name": "clip_score", **TINY},
            {"name": "aesthetic_score", "weights": weights, **TINY},
        ]
    )
    aesthetic = stages[1]
    assert aesthetic.shared and not aesthetic.uses_model_pool
    # Undecodable bytes beside given (unnormalised) embeddings: only reuse can score them.
    batch = batch_of([b"not an image"] * 3)
    vectors = np.eye(64, dtype=np.float32)[:3] * 5.0
    batch["embedding"] = [v.astype(np.float16) for v in vectors]
    out = aesthetic(batch)
    assert out["__drop__"] == [None] * 3
    with torch.no_grad():
        expected = head(torch.from_numpy(vectors / 5.0)).squeeze(1).numpy()
    np.testing.assert_allclose(out["aesthetic_score"], expected, rtol=1e-4, atol=1e-4)
    other = build_stages(
        [
            {"name": "clip_score", **TINY},
            {"name": "aesthetic_score", "weights": weights, **TINY, "reuse_embeddings": False},
        ]
    )
    assert not other[1].shared and other[1].uses_model_pool


def test_min_score_drops_with_its_reason(tmp_path, plain_embeddings):
    samples, _ = plain_embeddings
    weights = save_head(random_head("linear"), tmp_path, ".pth")
    spec = {"name": "aesthetic_score", "weights": weights, **TINY}
    scores = build_stage(spec)(batch_of([s["jpg"] for s in samples]))["aesthetic_score"]
    cut = float(np.median(scores))
    out = build_stage({**spec, "min_score": cut})(batch_of([s["jpg"] for s in samples] + [b"x"]))
    expected = ["low_aesthetic_score" if s < cut else None for s in scores] + ["decode_error"]
    assert out["__drop__"] == expected


def test_keep_top_fraction_is_exact_across_partitions(ray_session, tmp_path):
    folder = write_folder(make_shapes(20, seed=8), tmp_path / "in")
    weights = save_head(random_head("mlp"), tmp_path, ".safetensors")
    cfg = BuildConfig.model_validate(
        {
            "source": {"kind": "images", "path": str(folder), "files_per_task": 8},
            "stages": [
                {"name": "aesthetic_score", "weights": weights, **TINY, "keep_top_fraction": 0.3}
            ],
            "output": {"path": str(tmp_path / "out")},
        }
    )
    assert run_build(cfg, progress=False)["samples"] == math.ceil(0.3 * 20)
    rows = pq.read_table(tmp_path / "out" / "signatures").to_pylist()
    ranked = sorted(rows, key=lambda r: (-r["aesthetic_score"], r["key"]))
    assert {r["key"] for r in rows if r["drop_reason"] is None} == {r["key"] for r in ranked[:6]}
    assert {r["drop_reason"] for r in ranked[6:]} == {"below_aesthetic_top_fraction"}


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda d: str(d / "missing.pth"), "weights file not found"),
        (lambda d: save_head(torch.nn.Linear(32, 1), d, ".pth"), "32-dim embeddings"),
        (lambda d: save_head(torch.nn.Linear(64, 3), d, ".pth"), "not one score"),
        (lambda d: save_head(torch.nn.Sequential(torch.nn.Linear(64, 8)), d, ".pth"), "key"),
        (
            lambda d: (d / "bad.safetensors").write_bytes(b"junk") and str(d / "bad.safetensors"),
            "cannot read",
        ),
    ],
)
def test_unusable_weights_fail_in_one_line(tmp_path, make, message):
    stage = build_stage({"name": "aesthetic_score", "weights": make(tmp_path), **TINY})
    with pytest.raises(ConfigError) as err:
        stage.check()
    assert message in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).startswith("stages.0.weights: ")

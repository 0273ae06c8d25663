"""clip_score: a tiny CLIP trained here separates true captions from swapped ones; filters,
exact top fraction across Ray tasks, actor pools, stored embeddings, and fast model errors."""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from mmcurate.core.config_io import ConfigError
from mmcurate.pipeline.build import run_build
from mmcurate.pipeline.config import BuildConfig
from mmcurate.stages.lib.top_fraction import top_fraction_decisions
from mmcurate.stages.registry import build_stage
from mmcurate.trainer.config import TrainConfig
from mmcurate.trainer.train import train

from tests.kit_clip import TINY, roc_auc
from tests.kit_stages import batch_of
from tests.shapes import make_shapes, write_folder, write_shards

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def trained_checkpoint(tmp_path_factory):
    """A tiny CLIP trained for 300 steps on 2,048 captioned shapes (about a minute on CPU)."""
    folder = tmp_path_factory.mktemp("shapes")
    manifest = write_shards(make_shapes(2048, seed=1), folder / "shards", per_shard=512)
    cfg = TrainConfig.model_validate(
        {
            "data": {"manifest": str(manifest), "batch_size": 64, "workers": 1, "seed": 0},
            "model": {"name": "mmcurate-tiny"},
            "optim": {"lr": 2e-3, "warmup_steps": 20},
            "run": {"output": str(folder / "run"), "max_steps": 300, "log_every": 50},
        }
    )
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the loader worker takes the other CPU
    try:
        summary = train(cfg)
    finally:
        torch.set_num_threads(before)
    return summary["checkpoint"]


def test_trained_scores_separate_swapped_captions(trained_checkpoint):
    held_out = make_shapes(400, seed=99)
    rng = np.random.default_rng(5)
    swapped = set(rng.choice(len(held_out), size=120, replace=False).tolist())  # 30%
    captions = []
    for i, sample in enumerate(held_out):
        caption = sample["txt"]
        while i in swapped and caption == sample["txt"]:
            caption = held_out[int(rng.integers(len(held_out)))]["txt"]
        captions.append(caption)
    stage = build_stage({**TINY, "pretrained": trained_checkpoint, "batch_size": 100})
    out = stage(batch_of([s["jpg"] for s in held_out], captions))
    scores = out["clip_score"]
    auc = roc_auc(
        [scores[i] for i in range(len(held_out)) if i not in swapped],
        [scores[i] for i in swapped],
    )
    print(f"held-out ROC AUC {auc:.4f}")
    assert auc >= 0.9, auc


def test_min_and_max_score_filters_and_json():
    samples = make_shapes(6, seed=3)
    batch = batch_of(
        [s["jpg"] for s in samples] + [b"broken"], [s["txt"] for s in samples] + ["x y"]
    )
    batch["txt"][1] = "  "
    out = build_stage({**TINY, "min_score": 2.0})(batch)  # cosine never reaches 2
    assert out["__drop__"] == [
        "low_clip_score",
        "missing_caption",
        *["low_clip_score"] * 4,
        "decode_error",
    ]
    scored = build_stage({**TINY, "max_score": -2.0})(
        batch_of([samples[0]["jpg"]], ["a red circle"])
    )
    assert scored["__drop__"] == ["high_clip_score"]
    kept = build_stage(TINY)(batch_of([samples[0]["jpg"]], ["a red circle"]))
    assert kept["__drop__"] == [None]
    assert json.loads(kept["json"][0])["clip_score"] == kept["clip_score"][0]
    assert kept["embedding"][0].dtype == np.float16 and kept["embedding"][0].shape == (64,)


def test_top_fraction_is_exact_with_ties_broken_by_key():
    table = pa.table(
        {
            "__key__": ["e", "d", "c", "b", "a", "f", "g"],
            "clip_score": [0.9, 0.5, 0.5, 0.5, 0.1, 0.5, 0.2],
        }
    )
    decided = top_fraction_decisions(table, 0.4)  # ceil(0.4 x 7) = 3: e, then b and c of the ties
    assert sorted(decided) == ["a", "d", "f", "g"]
    assert len(top_fraction_decisions(table, 0.3)) == 7 - 3  # ceil(2.1) = 3
    assert len(top_fraction_decisions(table, 1.0)) == 0


def build_config(folder, out, stage, files_per_task=8):
    return BuildConfig.model_validate(
        {
            "source": {"kind": "images", "path": str(folder), "files_per_task": files_per_task},
            "stages": [stage],
            "output": {"path": str(out)},
        }
    )


def scores_of(out) -> dict[str, float]:
    rows = pq.read_table(out / "signatures").to_pylist()
    return {r["key"]: r["clip_score"] for r in rows}


def test_keep_top_fraction_across_tasks_and_actor_pool(ray_session, tmp_path):
    folder = write_folder(make_shapes(45, seed=7), tmp_path / "in")
    in_task = run_build(build_config(folder, tmp_path / "a", {**TINY, "keep_top_fraction": 0.3}))
    assert in_task["samples"] == math.ceil(0.3 * 45)  # 14, from 6 tasks
    scores = scores_of(tmp_path / "a")
    ranked = sorted(scores, key=lambda k: (-scores[k], k))
    shards = pq.read_table(tmp_path / "a" / "signatures").to_pylist()
    assert {r["key"] for r in shards if r["drop_reason"] is None} == set(ranked[:14])
    pooled = {**TINY, "keep_top_fraction": 0.3, "concurrency": 1}  # one CPU actor serves all tasks
    run_build(build_config(folder, tmp_path / "b", pooled))
    assert scores_of(tmp_path / "b") == pytest.approx(scores, abs=1e-5)
    emb = np.load(tmp_path / "a" / "embeddings" / "img_emb" / "img_emb_0000.npy")
    txt = np.load(tmp_path / "a" / "embeddings" / "text_emb" / "text_emb_0000.npy")
    meta = pq.read_table(tmp_path / "a" / "embeddings" / "metadata" / "metadata_0000.parquet")
    assert emb.shape == txt.shape == (14, 64) and emb.dtype == np.float16
    assert meta["key"].to_pylist() and set(meta["key"].to_pylist()) == set(ranked[:14])
    for row, (key, score) in enumerate(
        zip(meta["key"].to_pylist(), meta["clip_score"].to_pylist(), strict=True)
    ):
        assert abs(float(emb[row].astype(np.float32) @ txt[row].astype(np.float32)) - score) < 2e-3
        assert scores[key] == pytest.approx(score)


@pytest.mark.parametrize(
    "stage,message",
    [
        ({"model": "no-such-model"}, "error: stages.0: unknown open_clip model 'no-such-model'"),
        (
            {"pretrained": "/no/such/weights.pt"},
            "error: stages.0: pretrained checkpoint not found: /no/such/weights.pt",
        ),
        (
            {"pretrained": "no-such-tag"},
            "error: stages.0: cannot load 'mmcurate-tiny' with pretrained 'no-such-tag'",
        ),
    ],
)
def test_unloadable_model_fails_before_reading_data(tmp_path, stage, message):
    config = {
        "source": {"kind": "images", "path": str(tmp_path / "missing-input")},  # never read
        "stages": [{**TINY, **stage}],
        "output": {"path": str(tmp_path / "out")},
    }
    path = tmp_path / "c.json"
    path.write_text(json.dumps(config))
    result = subprocess.run(
        [sys.executable, "-m", "mmcurate", "build", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), result.stderr
    assert not (tmp_path / "out").exists()


def test_a_cpu_pool_that_leaves_no_cpu_for_tasks_is_refused(ray_session, tmp_path):
    folder = write_folder(make_shapes(4, seed=2), tmp_path / "in")
    cfg = build_config(folder, tmp_path / "out", {**TINY, "concurrency": 2})
    with pytest.raises(ConfigError, match=r"stages.0.concurrency: 2 CPU actors leave none"):
        run_build(cfg, progress=False)

"""Several scorers in one sweep (issue 50): the base build's clip_score and named `scorers:`
(here a filter network: a tiny CLIP trained by `mmcurate train` on a trusted build), each run
once per source over the same samples (counted), each arm deciding over its own scorer's
scores; bad scorer references fail in one line before anything runs; clip_score loads a
train run folder (its newest checkpoint) and scores as the trained model does."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from mmcurate.core.config_io import ConfigError
from mmcurate.core.formats import CHECKPOINT_FORMAT
from mmcurate.pipeline.sweep.arms import read_scores, top_fraction
from mmcurate.pipeline.sweep.config import load_sweep_config
from mmcurate.pipeline.sweep.run import claim_output, main, sweep
from mmcurate.stages.lib.clip_model import load_open_clip
from mmcurate.stages.registry import build_stage
from mmcurate.trainer.models import load_eval_model, resolve_weights

from tests.eval_sets import PHOTOS, photo
from tests.kit_sweep import (
    assert_refused_in_one_line,
    keys_of,
    make_sweep_data,
    picture_batch,
    sweep_tree,
    train_filter_network,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # as Ray's one-CPU task workers
TINY = {"model": "mmcurate-tiny", "num_gpus": 0}


@pytest.fixture(scope="module")
def trusted(tmp_path_factory) -> dict[str, Path]:
    """The sweep's data and a filter network trained on the validation build (trusted)."""
    root = tmp_path_factory.mktemp("scorers")
    data = make_sweep_data(root)
    return {**data, "filter": train_filter_network(data["validation"], root / "filter")}


def test_each_scorer_runs_once_and_each_arm_decides_on_its_own(ray_session, trusted, tmp_path):
    scorers = {"dfn": {**TINY, "pretrained": str(trusted["filter"])}}
    arms = [
        {"name": "clip-half", "keep_top_fraction": 0.5},
        {"name": "dfn-half", "keep_top_fraction": 0.5, "scorer": "dfn"},
    ]
    tree = {**sweep_tree(trusted, tmp_path / "sweep", arms, [0]), "scorers": scorers}
    result = sweep(load_sweep_config(tree))
    out = tmp_path / "sweep"
    assert result["scorer_runs"] == {"main": {"clip_score": 1, "dfn": 1}}
    stats = json.loads((out / "scorers" / "dfn" / "main" / "stats.json").read_text())
    stages = [s for s in stats["stages"] if s["name"] != "source"]
    assert [s["name"] for s in stages] == ["clip_score"]  # nothing decoded again
    assert stages[0]["in"] == stages[0]["out"] == 23  # the scored samples, none dropped
    clip, dfn = (read_scores(out / folder) for folder in ("scored/main", "scorers/dfn/main"))
    assert [k for k, _ in clip] == [k for k, _ in dfn]  # the same samples
    assert [s for _, s in clip] != [s for _, s in dfn]  # scored by two models
    for name, rows in (("clip-half", clip), ("dfn-half", dfn)):
        assert set(keys_of(out / "arms" / name)) == top_fraction(rows, 0.5)
    assert set(keys_of(out / "arms" / "clip-half")) != set(keys_of(out / "arms" / "dfn-half"))
    assert result["kept"]["dfn-half"]["scorer"] == "dfn"
    arms.append({"name": "dfn-top", "keep_top_fraction": 0.25, "scorer": "dfn"})
    again = sweep(load_sweep_config({**tree, "arms": arms}))  # a new arm: no scorer reruns
    assert again["scorer_runs"] == {"main": {"clip_score": 1, "dfn": 1}}
    assert set(keys_of(out / "arms" / "dfn-top")) == top_fraction(dfn, 0.25)


def test_filter_network_from_a_train_run_scores_like_the_model_saved(trusted):
    pictures = [photo(i) for i in range(6)]
    captions = [PHOTOS[i].caption for i in (0, 1, 2, 4, 3, 5)]  # two pairs swapped
    stage = build_stage({"name": "clip_score", **TINY, "pretrained": str(trusted["filter"])})
    scores = np.array(stage(picture_batch(pictures, captions))["clip_score"], dtype=np.float64)
    weights = resolve_weights("mmcurate-tiny", str(trusted["filter"]))  # `mmcurate eval`'s way
    model, _, tokenizer, info = load_eval_model("mmcurate-tiny", weights, "cpu")
    assert info["kind"] == "mmcurate-checkpoint" and info["step"] == 3
    clip = stage.local_model()  # the same pixels for both: only the weights may differ
    pixels = torch.from_numpy(np.stack(clip.prepare(pictures)[0])).permute(0, 3, 1, 2)
    with torch.inference_mode():
        images = (pixels.float() / 255.0 - clip.mean) / clip.std
        image = torch.nn.functional.normalize(model.encode_image(images), dim=-1)
        text = torch.nn.functional.normalize(model.encode_text(tokenizer(captions)), dim=-1)
    expected = (image * text).sum(-1).numpy()
    np.testing.assert_allclose(scores, expected, atol=2e-6)
    untrained = build_stage({"name": "clip_score", **TINY, "pretrained": None})
    before = np.array(untrained(picture_batch(pictures, captions))["clip_score"])
    assert np.abs(before - scores).max() > 1e-3  # the trained weights are what scored


def test_a_run_folder_loads_its_newest_checkpoint(tmp_path):
    model, _, _ = load_open_clip("mmcurate-tiny", None, "cpu")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    for step, shift in ((2, 1.0), (10, 2.0)):  # 10 is newer though "step-10" sorts first
        saved = {k: v + shift for k, v in state.items()}
        saved["logit_bias"] = torch.tensor([-10.0])  # a SigLIP-trained run's bias
        checkpoint = {"format": CHECKPOINT_FORMAT, "step": step, "model": saved}
        torch.save(checkpoint, tmp_path / "run" / "checkpoints" / f"step-{step}.pt")
    loaded, _, _ = load_open_clip("mmcurate-tiny", str(tmp_path / "run"), "cpu")
    for name, value in loaded.state_dict().items():
        assert torch.equal(value, state[name] + 2.0), name
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no checkpoints/step-N.pt"):
        load_open_clip("mmcurate-tiny", str(tmp_path / "empty"), "cpu")


def test_a_run_folder_and_its_checkpoint_are_one_scorer(tmp_path, capsys):
    model, _, _ = load_open_clip("mmcurate-tiny", None, "cpu")
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    checkpoint = tmp_path / "run" / "checkpoints" / "step-3.pt"
    torch.save({"format": CHECKPOINT_FORMAT, "model": model.state_dict()}, checkpoint)
    tree = base(tmp_path)
    tree["scorers"] = {
        "a": {**TINY, "pretrained": str(tmp_path / "run")},
        "b": {**TINY, "pretrained": str(checkpoint)},
    }
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump({**tree, "arms": [ARM_A]}))
    assert main([str(tmp_path / "sweep.yaml")]) == 2
    assert "scorers.b: scores as a does" in capsys.readouterr().err


def test_a_scorer_retrained_in_place_is_refused_not_reused(tmp_path):
    """sweep.json records the file a scorer's `pretrained` loads (size, modification time):
    a run folder with a newer checkpoint, or the same checkpoint file rewritten, makes a rerun
    refuse in one line instead of reusing the scores of the weights it had before."""
    model, _, _ = load_open_clip("mmcurate-tiny", None, "cpu")
    checkpoints = tmp_path / "run" / "checkpoints"
    checkpoints.mkdir(parents=True)
    torch.save(
        {"format": CHECKPOINT_FORMAT, "model": model.state_dict()}, checkpoints / "step-3.pt"
    )
    tree = base(tmp_path)
    tree["scorers"] = {"dfn": {**TINY, "pretrained": str(tmp_path / "run")}}
    tree["arms"] = [{"name": "d", "keep_top_fraction": 0.5, "scorer": "dfn"}]
    cfg, out = load_sweep_config(tree), tmp_path / "out"
    claim_output(cfg, out)
    claim_output(cfg, out)  # the same weights: a rerun goes on
    newer = checkpoints / "step-5.pt"
    torch.save({"format": CHECKPOINT_FORMAT, "model": model.state_dict()}, newer)
    with pytest.raises(ConfigError, match=r"scorers.dfn: its weights \(.*step-5.pt\) changed"):
        claim_output(cfg, out)
    newer.unlink()
    rewritten = {"format": CHECKPOINT_FORMAT, "model": model.state_dict(), "step": 3}
    torch.save(rewritten, checkpoints / "step-3.pt")
    with pytest.raises(ConfigError, match=r"its weights \(.*step-3.pt\) changed"):
        claim_output(cfg, out)


def base(tmp_path: Path) -> dict:
    (tmp_path / "raw").mkdir(exist_ok=True)
    stages = [{"name": "clip_score", **TINY, "pretrained": None}]
    return {
        "build": {"source": {"kind": "images", "path": str(tmp_path / "raw")}, "stages": stages},
        "train": {"run": {"max_steps": 2}},
        "eval": {"retrieval": {"recall_at": [1]}},
        "splits": {"validation": "val/manifest.json", "test": "test/manifest.json"},
        "seeds": [0],
        "scorers": {"other": {**TINY, "pretrained": None, "mask_text": True}},
        "arms": [{"name": "raw"}, {"name": "o", "keep_top_fraction": 0.5, "scorer": "other"}],
        "output": str(tmp_path / "out"),
    }


ARM_A = {"name": "o", "keep_top_fraction": 0.5, "scorer": "a"}
MASKED = {**TINY, "pretrained": None, "mask_text": True}
BAD = [
    ({"arms": [{"name": "a", "keep_top_fraction": 0.5, "scorer": "dfn"}]}, "arm a: unknown scorer"),
    ({"arms": [{"name": "a", "scorer": "other"}]}, "scorer needs min_score or keep_top_fraction"),
    ({"scorers": {"clip_score": {**TINY, "mask_text": True}}}, "scorers.clip_score: the name of"),
    ({"scorers": {"a": {**TINY, "pretrained": None}}}, "scorers.a: scores as clip_score does"),
    (
        {
            "scorers": {
                "a": {**TINY, "pretrained": None, "mask_text": True},
                "b": {**TINY, "pretrained": None, "mask_text": True, "batch_size": 8},
            }
        },
        "scorers.b: scores as a does",
    ),
    ({"scorers": {"a": {**TINY, "min_score": 0.2}}}, "scorers.a.min_score: thresholds belong"),
    ({"scorers": {"a": {**TINY, "batch_size": 0}}}, "scorers.a: .batch_size:"),
    ({"scorers": {"a": {**TINY, "modle": "x"}}}, "scorers.a: .modle: unknown key"),
    ({"scorers": {"A": TINY}}, "scorer name 'A'"),
    (
        {"scorers": {"a": {**TINY, "pretrained": "no/run"}}, "arms": [ARM_A]},
        "scorers.a: pretrained checkpoint not found: no/run",
    ),
]


@pytest.mark.parametrize(("change", "message"), BAD)
def test_bad_scorer_config_fails_in_one_line_before_anything_runs(
    tmp_path, capsys, change, message
):
    assert_refused_in_one_line(tmp_path, capsys, {**base(tmp_path), **change}, message)

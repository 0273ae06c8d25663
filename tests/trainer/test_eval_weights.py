"""`mmcurate eval` with `mmcurate train` checkpoints: the export to plain open_clip (same
embeddings in a python that imports nothing of this project), a run folder as the weights,
weights and data on S3, and the real command end to end on a build."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mmcurate.core.model_configs import MODEL_CONFIG_DIR
from mmcurate.trainer.eval.evaluate import main

from tests.eval_sets import (
    PHOTOS,
    class_folder,
    eval_config,
    flickr_like,
    photo,
    run_main,
    tiny_weights,
    write_build,
)

REPO = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest: torch on one thread


# ---- train checkpoints ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def train_run(tmp_path_factory) -> Path:
    """A real short `mmcurate train` run (CPU, in-process loader) on a hand-written build."""
    from mmcurate.trainer.config import TrainConfig
    from mmcurate.trainer.train import train

    root = tmp_path_factory.mktemp("train")
    samples = [{"key": f"t{i}", "image": photo(i), "txt": PHOTOS[i].caption} for i in range(16)]
    manifest = write_build(root / "build", [samples])
    cfg = TrainConfig.model_validate(
        {
            "data": {"manifest": str(manifest), "batch_size": 8, "workers": 0},
            "model": {"name": "mmcurate-tiny"},
            "run": {"output": str(root / "run"), "max_steps": 2, "log_every": 1},
        }
    )
    train(cfg)
    return root / "run"


PLAIN_OPEN_CLIP = """
import sys

import open_clip
import torch

configs, name, weights, inputs, out = sys.argv[1:]
open_clip.add_model_config(configs)  # only for mmcurate-tiny: open_clip's own names need none
model, _, _ = open_clip.create_model_and_transforms(name, pretrained=weights)
model.eval()
data = torch.load(inputs)
with torch.no_grad():
    image, text = model.encode_image(data["images"]), model.encode_text(data["tokens"])
assert not any(m.split(".")[0] in ("trainer", "pipeline") for m in sys.modules)
torch.save({"image": image, "text": text}, out)
"""


def plain_open_clip_features(tmp_path: Path, weights: Path, inputs: dict) -> dict:
    """Features from a separate python that imports open_clip and nothing of this project."""
    (tmp_path / "plain.py").write_text(PLAIN_OPEN_CLIP)
    torch.save(inputs, tmp_path / "inputs.pt")
    args = [str(MODEL_CONFIG_DIR), "mmcurate-tiny", str(weights), "inputs.pt", "features.pt"]
    proc = subprocess.run(
        [sys.executable, "plain.py", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return torch.load(tmp_path / "features.pt")


def eval_features(checkpoint: str, inputs: dict) -> dict:
    from mmcurate.trainer.models import Weights, load_eval_model

    model, _, _, info = load_eval_model(
        "mmcurate-tiny", Weights("file", checkpoint), torch.device("cpu")
    )
    assert info["kind"] == "mmcurate-checkpoint"
    with torch.no_grad():
        return {
            "image": model.encode_image(inputs["images"]),
            "text": model.encode_text(inputs["tokens"]),
        }


def sample_inputs() -> dict:
    import open_clip

    generator = torch.Generator().manual_seed(0)
    tokens = open_clip.get_tokenizer("mmcurate-tiny")(["a cat", "a rocket on a launch pad"])
    return {"images": torch.randn(3, 3, 64, 64, generator=generator), "tokens": tokens}


def test_exported_train_checkpoint_loads_in_plain_open_clip(train_run, tmp_path, capsys):
    checkpoint = train_run / "checkpoints" / "step-2.pt"
    out = tmp_path / "exported.pt"
    assert main(["--export", str(checkpoint), str(out)]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "exported": str(out),
        "name": "mmcurate-tiny",
        "step": 2,
    }
    inputs = sample_inputs()
    plain = plain_open_clip_features(tmp_path, out, inputs)
    ours = eval_features(str(checkpoint), inputs)
    for part in ("image", "text"):
        torch.testing.assert_close(plain[part], ours[part], atol=1e-5, rtol=0)


def test_siglip_checkpoint_exports_without_its_bias(tmp_path, capsys):
    """Trained with `loss: siglip` on a CLIP architecture, the model has a logit_bias that the
    architecture's plain open_clip model lacks: the export keeps it beside the state dict."""
    from mmcurate.trainer.config import TrainConfig
    from mmcurate.trainer.dist.world import Dist
    from mmcurate.trainer.loop_state import LoopState
    from mmcurate.trainer.resume import save_state
    from mmcurate.trainer.step import build_learner

    cfg = TrainConfig.model_validate(
        {
            "data": {"manifest": "unused"},
            "model": {"name": "mmcurate-tiny", "loss": "siglip"},
            "run": {"output": str(tmp_path / "run")},
        }
    )
    learner, _ = build_learner(cfg, Dist(), total_steps=1)
    with torch.no_grad():
        learner.core.logit_bias.fill_(-3.5)
    checkpoint = save_state(learner, LoopState(step=7), cfg, 1, 16)  # the trainer's save path
    out = tmp_path / "siglip.pt"
    assert main(["--export", checkpoint, str(out)]) == 0
    doc = torch.load(out, weights_only=True)
    assert "logit_bias" not in doc["state_dict"] and float(doc["logit_bias"]) == -3.5
    inputs = sample_inputs()
    plain = plain_open_clip_features(tmp_path, out, inputs)
    ours = eval_features(checkpoint, inputs)
    for part in ("image", "text"):
        torch.testing.assert_close(plain[part], ours[part], atol=1e-5, rtol=0)


def test_export_refuses_what_is_no_train_checkpoint(tmp_path, capsys):
    weights = tiny_weights(tmp_path)
    assert main(["--export", str(weights), str(tmp_path / "out.pt")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not an `mmcurate train` checkpoint" in err
    assert not (tmp_path / "out.pt").exists()
    assert main(["--export", str(tmp_path / "none.pt"), str(tmp_path / "out.pt")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_a_checkpoint_of_another_architecture_is_refused(train_run, tmp_path, capsys):
    manifest = flickr_like(tmp_path / "set")
    config = eval_config(
        tmp_path,
        model={"name": "ViT-S-32", "pretrained": str(train_run)},
        retrieval={"manifest": str(manifest)},
    )
    code, _, err = run_main([str(config)], capsys)
    assert code == 2 and "trained 'mmcurate-tiny'" in err


# ---- end to end ----------------------------------------------------------------------------


def test_end_to_end_on_a_build(ray_session, image_folder, train_run, tmp_path):
    """A build of an image folder, a train run's folder as the weights, and class folders;
    the real command with loader workers and the shard cache."""
    from mmcurate.pipeline.build import run_build
    from mmcurate.pipeline.config import BuildConfig

    build = BuildConfig.model_validate(
        {
            "source": {"kind": "images", "path": str(image_folder(n=24, seed=3))},
            "stages": [{"name": "decode_image", "resize": {"size": 64, "mode": "center_crop"}}],
            "output": {"path": str(tmp_path / "build"), "shard_max_samples": 10},
        }
    )
    built = run_build(build, progress=False)
    counts = class_folder(tmp_path / "classes")
    config = eval_config(
        tmp_path,
        retrieval={"manifest": str(tmp_path / "build" / "manifest.json")},
        zeroshot={"path": str(tmp_path / "classes"), "classnames": sorted(counts)},
        data={"batch_size": 8, "workers": 2, "cache_dir": str(tmp_path / "cache")},
    )
    out = tmp_path / "result.json"
    command = [sys.executable, "-m", "mmcurate.trainer.eval", str(config), "--out", str(out)]
    command += ["--set", f"model.pretrained={train_run}"]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "retrieval" in proc.stderr and "100%" in proc.stderr  # the progress bars
    assert "text_retrieval_recall@10" in proc.stdout and "acc5" in proc.stdout  # the table
    doc = json.loads(out.read_text())
    assert doc["format"] == "mmcurate-eval/1" and doc["device"] == "cpu"
    assert doc["model"] == {
        "name": "mmcurate-tiny",
        "pretrained": str(train_run),
        "weights": str(train_run / "checkpoints" / "step-2.pt"),
        "kind": "mmcurate-checkpoint",
        "step": 2,
    }
    retrieval, zeroshot = doc["tasks"]["retrieval"], doc["tasks"]["zeroshot"]
    assert retrieval["samples"] == retrieval["images"] == retrieval["texts"] == built["samples"]
    assert zeroshot["images"] == len(PHOTOS) and zeroshot["classes"] == len(counts)
    names = {f"{d}_retrieval_recall@{k}" for d in ("image", "text") for k in (1, 5, 10)}
    names |= {"image_retrieval_median_rank", "text_retrieval_median_rank"}
    names |= {"acc1", "acc5", "mean_per_class_recall"}
    assert set(doc["metrics"]) == names
    assert len(list((tmp_path / "cache").glob("*.tar"))) == len(built["shards"])  # via the cache


def test_data_and_weights_on_object_storage(s3, s3_bucket, train_run, tmp_path, capsys):
    """The eval set, and the run folder holding the checkpoint, on S3 (SeaweedFS)."""
    fs = s3.filesystem()
    local = flickr_like(tmp_path / "set").parent
    fs.put(str(local) + "/", f"{s3_bucket}/set/", recursive=True)
    fs.put(str(train_run / "checkpoints") + "/", f"{s3_bucket}/run/checkpoints/", recursive=True)
    config = eval_config(
        tmp_path,
        model={"name": "mmcurate-tiny", "pretrained": f"s3://{s3_bucket}/run"},
        retrieval={"manifest": f"s3://{s3_bucket}/set/manifest.json"},
        data={"batch_size": 8, "workers": 0, "cache_dir": str(tmp_path / "cache")},
        storage_options=s3.storage_options,
    )
    out = tmp_path / "s3.json"
    code, _, err = run_main([str(config), "--out", str(out)], capsys)
    assert code == 0, err
    doc = json.loads(out.read_text())
    assert doc["model"]["weights"] == f"s3://{s3_bucket}/run/checkpoints/step-2.pt"
    assert doc["model"]["kind"] == "mmcurate-checkpoint"
    assert doc["tasks"]["retrieval"]["images"] == 7
    assert s3.storage_options["secret"] not in out.read_text()
    fs.put(str(tiny_weights(tmp_path)), f"{s3_bucket}/plain/tiny.pt")  # a plain open_clip file
    weights = f"model.pretrained=s3://{s3_bucket}/plain/tiny.pt"
    code, _, err = run_main([str(config), "--set", weights, "--out", str(out)], capsys)
    assert code == 0, err
    assert json.loads(out.read_text())["model"]["kind"] == "open_clip-file"


def test_train_checkpoint_loads_in_plain_open_clip_as_written(train_run, tmp_path):
    checkpoint = train_run / "checkpoints" / "step-2.pt"
    inputs = sample_inputs()
    plain = plain_open_clip_features(tmp_path, checkpoint, inputs)
    ours = eval_features(str(checkpoint), inputs)
    for part in ("image", "text"):
        torch.testing.assert_close(plain[part], ours[part], atol=1e-5, rtol=0)

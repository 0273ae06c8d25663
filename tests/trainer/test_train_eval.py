"""Evaluation during training (train config `eval`, trainer/eval/in_training.py): the numbers a run
logs equal `mmcurate eval` on the checkpoint of that step, on one rank and on two (torchrun,
gloo on CPU); evaluating does not change training; a bad eval section fails before training."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from mmcurate.core.config_io import ConfigError
from mmcurate.trainer.checkpoint import load_checkpoint
from mmcurate.trainer.cli import main as train_main
from mmcurate.trainer.config import TrainConfig
from mmcurate.trainer.dist.world import Dist
from mmcurate.trainer.eval.evaluate import main as eval_main
from mmcurate.trainer.train import train

from tests.eval_sets import PHOTOS, class_folder, flickr_like, photo, write_build

REPO = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest: torch on one thread


@pytest.fixture(scope="module")
def sets(tmp_path_factory) -> dict[str, Path]:
    """A training build of the demo photos, a multi-caption retrieval set, class folders."""
    root = tmp_path_factory.mktemp("sets")
    samples = [
        {"key": f"p{i:02d}", "image": photo(i), "txt": sample.caption}
        for i, sample in enumerate(PHOTOS)
    ]
    classes = root / "classes"
    class_folder(classes)
    return {
        "train": write_build(root / "train", [samples[:16], samples[16:]]),
        "retrieval": flickr_like(root / "retrieval"),
        "classes": classes,
    }


def eval_section(sets: dict[str, Path], **extra) -> dict:
    names = sorted({p.source for p in PHOTOS})
    zeroshot = {"path": str(sets["classes"]), "classnames": names}
    return {"manifest": str(sets["retrieval"]), "batch_size": 8, "zeroshot": zeroshot, **extra}


def tree(sets: dict[str, Path], output: Path, eval_body: dict | None, **run) -> dict:
    body = {
        # decode_threads 1: crops then do not depend on thread timing (runs compare exactly)
        "data": {"manifest": str(sets["train"]), "batch_size": 4, "workers": 1, "seed": 3}
        | {"decode_threads": 1},
        "optim": {"warmup_steps": 1},
        "run": {"output": str(output), "max_steps": 4, "log_every": 3, **run},
    }
    return body | ({"eval": eval_body} if eval_body is not None else {})


def eval_rows(output: Path) -> dict[int, dict]:
    rows = [json.loads(x) for x in (output / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: {k: v for k, v in r.items() if k.startswith("eval/")} for r in rows}


def mmcurate_eval(sets, checkpoint: Path, tmp_path: Path, capsys=None) -> dict[str, float]:
    """`mmcurate eval` on a checkpoint: in this process, or as `python -m mmcurate.trainer.eval`."""
    section = eval_section(sets)
    body = {
        "model": {"name": "mmcurate-tiny", "pretrained": str(checkpoint)},
        "retrieval": {"manifest": section["manifest"]},
        "zeroshot": section["zeroshot"],
        "data": {"batch_size": 8, "workers": 0},
    }
    config, out = tmp_path / "eval.yaml", tmp_path / f"eval-{checkpoint.stem}.json"
    config.write_text(yaml.safe_dump(body))
    args = [str(config), "--out", str(out), "--no-progress"]
    if capsys is not None:
        assert eval_main(args) == 0
        capsys.readouterr()
    else:
        cmd = [sys.executable, "-m", "mmcurate.trainer.eval", *args]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    return {f"eval/{k}": v for k, v in json.loads(out.read_text())["metrics"].items()}


def test_one_rank_logs_what_mmcurate_eval_finds_and_training_is_unchanged(sets, tmp_path, capsys):
    with_eval = tmp_path / "with"
    cfg = tree(sets, with_eval, eval_section(sets, every=2, workers=1), checkpoint_every=2)
    summary = train(TrainConfig.model_validate(cfg | {"run": cfg["run"] | {"tensorboard": True}}))
    logged = eval_rows(with_eval)
    assert [s for s, row in logged.items() if row] == [2, 4]  # every 2 steps (4 is the last)
    for step in (2, 4):
        checkpoint = with_eval / "checkpoints" / f"step-{step}.pt"
        expected = mmcurate_eval(sets, checkpoint, tmp_path, capsys)
        assert logged[step] == pytest.approx(expected, abs=1e-9)
        assert {"eval/image_retrieval_recall@1", "eval/text_retrieval_recall@1"} <= set(expected)
        assert {"eval/acc1", "eval/acc5", "eval/mean_per_class_recall"} <= set(expected)
    written = json.loads((with_eval / "summary.json").read_text())
    assert written == summary and summary["eval"]["step"] == 4
    assert {f"eval/{k}": v for k, v in summary["eval"]["metrics"].items()} == logged[4]
    assert summary["eval"]["tasks"]["retrieval"]["dropped"]  # the set's bad samples, counted
    assert "eval/image_retrieval_recall@1" in board_tags(with_eval)
    # The same run without evaluations trains exactly the same weights.
    without = tmp_path / "without"
    plain = train(TrainConfig.model_validate(tree(sets, without, None, checkpoint_every=2)))
    assert plain["last_loss"] == summary["last_loss"] and "eval" not in plain
    ours, theirs = (load_checkpoint(str(p / "checkpoints/step-4.pt")) for p in (with_eval, without))
    assert all(torch.equal(ours["model"][k], theirs["model"][k]) for k in ours["model"])


def board_tags(output: Path) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(output / "tensorboard"))
    events.Reload()
    return set(events.Tags()["scalars"])


def run_torchrun(config: Path, world: int) -> subprocess.CompletedProcess:
    env = os.environ | {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += [f"--nproc-per-node={world}", "-m", "mmcurate.trainer", str(config)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=REPO)


def printed_summaries(stdout: str) -> list[dict]:
    decoder, found, at = json.JSONDecoder(), [], stdout.find("{")
    while at != -1:
        summary, end = decoder.raw_decode(stdout, at)
        found.append(summary)
        at = stdout.find("{", end)
    return found


def test_two_ranks_log_the_numbers_one_rank_and_mmcurate_eval_find(sets, tmp_path):
    from mmcurate.trainer.eval.in_training import open_evaluator
    from mmcurate.trainer.models import load_eval_model, resolve_weights

    output = tmp_path / "run"
    body = tree(sets, output, eval_section(sets, every=3, workers=0))
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump(body))
    done = run_torchrun(config, 2)
    assert done.returncode == 0, done.stderr[-3000:]
    summaries = printed_summaries(done.stdout)
    assert len(summaries) == 2 and {s["world"] for s in summaries} == {2}
    assert summaries[0]["eval"] == summaries[1]["eval"]  # rank 0 evaluated for both
    logged = eval_rows(output)
    assert [s for s, row in logged.items() if row] == [3, 4]  # every 3, and the last step
    last = output / "checkpoints" / "step-4.pt"
    assert logged[4] == pytest.approx(mmcurate_eval(sets, last, tmp_path), abs=1e-9)
    # One rank evaluating the same checkpoint through the training code finds the same.
    cfg = TrainConfig.model_validate(body)
    weights = resolve_weights("mmcurate-tiny", str(last))
    model, _, tokenizer, _ = load_eval_model("mmcurate-tiny", weights, torch.device("cpu"))
    one_rank = open_evaluator(cfg, Dist()).evaluator(model, tokenizer)(model, 4)
    assert one_rank == summaries[0]["eval"]


def write_config(path: Path, body: dict) -> Path:
    path.write_text(yaml.safe_dump(body))
    return path


REFUSALS = [
    ({"evry": 2}, "eval.evry: unknown key"),
    ({"manifest": "MISSING"}, "eval.manifest:"),
    ({"zeroshot": {"path": "CLASSES", "classnames": ["a"], "templates": ["a photo"]}}, "no {c}"),
    ({"zeroshot": {"path": "CLASSES", "classnames": ["a"], "templatez": []}}, "templatez"),
    ({"zeroshot": {"path": "MISSING", "classnames": ["a"]}}, "eval.zeroshot.path:"),
    ({"manifest": "RETRIEVAL", "recall_at": [0]}, "eval.recall_at: every K must be at least 1"),
    ({"every": 5}, "eval.every: nothing to evaluate"),
    ({"manifest": "RETRIEVAL", "every": 0}, "eval.every:"),
    ({"manifest": "RETRIEVAL", "batch_size": "many"}, "eval.batch_size:"),
]


@pytest.mark.parametrize(("section", "message"), REFUSALS)
def test_a_bad_eval_section_fails_before_training(sets, tmp_path, capsys, section, message):
    places = {"MISSING": str(tmp_path / "nothing" / "manifest.json")}
    places |= {"CLASSES": str(sets["classes"]), "RETRIEVAL": str(sets["retrieval"])}
    text = json.dumps(section)
    for name, value in places.items():
        text = text.replace(name, value)
    output = tmp_path / "run"
    config = write_config(tmp_path / "train.yaml", tree(sets, output, json.loads(text)))
    assert train_main([str(config)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("error: ")
    assert message in err
    assert not output.exists()  # nothing trained, nothing written


def test_train_refuses_a_missing_eval_set_before_building_the_model(sets, tmp_path):
    output = tmp_path / "run"
    missing = {"path": str(tmp_path / "no-classes"), "classnames": ["a"]}
    cfg = TrainConfig.model_validate(tree(sets, output, {"zeroshot": missing}))
    with pytest.raises(ConfigError, match=r"^eval\.zeroshot\.path: .* is not a folder"):
        train(cfg)
    assert not (output / "metrics.jsonl").exists()


def test_an_eval_set_without_usable_samples_stops_with_one_line(sets, tmp_path, capsys):
    broken = write_build(tmp_path / "broken", [[{"key": "x", "image": b"junk", "txt": "a"}]])
    output = tmp_path / "run"
    config = write_config(tmp_path / "train.yaml", tree(sets, output, {"manifest": str(broken)}))
    assert train_main([str(config), "--set", "run.max_steps=1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "eval at step 1: retrieval: no usable samples" in err


def test_the_eval_section_round_trips_and_is_off_by_default(sets):
    cfg = TrainConfig.model_validate(tree(sets, Path("/tmp/x"), eval_section(sets)))
    again = TrainConfig.model_validate(cfg.model_dump(mode="json"))  # as Ray Train passes it
    assert again == cfg and cfg.eval.enabled
    assert not TrainConfig.model_validate(tree(sets, Path("/tmp/x"), None)).eval.enabled

"""`mmcurate eval` (trainer/eval/evaluate.py): config refusals, multi-caption retrieval sets read
through the training shard reader, zero-shot from folders and manifests. A tiny model
(mmcurate-tiny) and a few dozen samples; train checkpoints and the command end to end:
test_eval_weights.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from mmcurate.trainer.data.manifest import read_manifest
from mmcurate.trainer.eval.data import EvalSource, Fields, ShardRead, make_loader, shard_units
from mmcurate.trainer.eval.tasks import pair_up

from tests.eval_sets import (
    PHOTOS,
    class_folder,
    eval_config,
    flickr_like,
    photo,
    rewrite_with_cls,
    run_main,
    tiny_weights,
    write_build,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest: torch on one thread


# ---- refusals ------------------------------------------------------------------------------


REFUSALS = [
    ({"retrieval": {"manifest": "m", "recal_at": [1]}}, [], "retrieval.recal_at: unknown key"),
    ({"retrieval": {"manfest": "m"}}, [], "retrieval.manifest: required key is missing"),
    ({}, [], "nothing to evaluate"),
    ({"zeroshot": {"path": "x", "classnames": ["a"], "templates": ["a photo"]}}, [], "no {c}"),
    ({"zeroshot": {"path": "x", "classnames": "missing.yaml"}}, [], "file not found"),
    ({"zeroshot": {"path": "x", "classnames": []}}, [], "zeroshot.classnames"),
    ({"retrieval": {"manifest": "m", "recall_at": [0, 5]}}, [], "at least 1"),
    ({"run": {"device": "gpu"}}, [], "run.device"),
    ({}, ["--set", "model"], "expected key.path=value"),
]


@pytest.mark.parametrize(("sections", "extra", "message"), REFUSALS)
def test_bad_config_fails_with_one_line(tmp_path, capsys, sections, extra, message):
    code, out, err = run_main([str(eval_config(tmp_path, **sections)), *extra], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err


JUNK, TMP = "{junk}", "{tmp}"  # filled in per test: a file that is no checkpoint, tmp_path
INPUT_REFUSALS = [
    ({"pretrained": JUNK}, {"retrieval": {"manifest": f"{TMP}/none/manifest.json"}}, "cannot read"),
    ({"pretrained": JUNK}, {"retrieval": {"manifest": TMP}}, "cannot read manifest"),
    ({"pretrained": "no_such_tag"}, {"retrieval": {"manifest": "m"}}, "or a pretrained tag"),
    ({"name": "no-such-arch"}, {"retrieval": {"manifest": "m"}}, "unknown open_clip model"),
    ({"pretrained": TMP}, {"retrieval": {"manifest": "m"}}, "holds no checkpoints"),
    (
        {"pretrained": JUNK},
        {"run": {"device": "cuda:99"}, "retrieval": {"manifest": "m"}},
        "run.device: cuda:99",
    ),
    (
        {"pretrained": JUNK},
        {"zeroshot": {"path": f"{TMP}/nowhere", "classnames": ["a"]}},
        "not a folder",
    ),
]


@pytest.mark.parametrize(("model", "sections", "message"), INPUT_REFUSALS)
def test_inputs_are_checked_before_the_model_loads(tmp_path, capsys, model, sections, message):
    """`pretrained` may name a file that is no checkpoint at all: the missing manifest, the
    unknown tag or the absent CUDA device is still what the user is told."""
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    text = json.dumps({"model": {"name": "mmcurate-tiny", **model}, **sections})
    tree = json.loads(text.replace(JUNK, str(junk)).replace(TMP, str(tmp_path)))
    code, _, err = run_main([str(eval_config(tmp_path, **tree))], capsys)
    assert code == 2 and err.count("\n") == 1 and message in err, err


# ---- retrieval -----------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_captions_pool_by_image(tmp_path, workers):
    manifest = read_manifest(str(flickr_like(tmp_path / "set")))
    units = shard_units(manifest)
    source = EvalSource(
        units,
        ShardRead(manifest, None, None),
        [u.position for u in units],
        lambda image: torch.zeros(1),
        Fields(),
        "retrieval",
        4,
    )
    records = sorted(
        (r for part in make_loader(source, workers) for r in part.records), key=lambda r: r.position
    )
    drops = {r.key: r.drop for r in records if r.drop}
    assert drops == {"s3a": "decode_error", "nocap": "no_caption", "noimg": "no_image"}
    carriers, texts, text_image = pair_up(records)
    keys = {r.position: r.key for r in records}
    # f0-f2, s3b (image "a" in shard 0), c0x, c1x, c2x; shard 1's copy of "a" is not a new image
    assert [keys[p] for p in carriers] == ["f0", "f1", "f2", "s3b", "c00", "c10", "c20"]
    assert texts[:15] == [f"{i} {c}" for i in range(3) for c in "abcde"]
    assert text_image == [0] * 5 + [1] * 5 + [2] * 5 + [3] + [4] * 3 + [5] * 3 + [6] * 3 + [3]
    assert texts[15] == "three b" and texts[-1] == "three c"


def test_retrieval_counts_and_names(tmp_path, capsys):
    manifest = flickr_like(tmp_path / "set")
    weights = tiny_weights(tmp_path)
    config = eval_config(tmp_path, retrieval={"manifest": str(manifest)})
    out = tmp_path / "out" / "result.json"
    results = []
    for workers in (0, 2):
        args = [
            str(config),
            "--set",
            f"model.pretrained={weights}",
            "--set",
            f"data.workers={workers}",
        ]
        code, table, _ = run_main([*args, "--out", str(out)], capsys)
        assert code == 0 and "image_retrieval_recall@5" in table
        results.append(json.loads(out.read_text()))
    assert results[0]["tasks"] == results[1]["tasks"]  # the worker count changes nothing
    task = results[0]["tasks"]["retrieval"]
    assert (task["samples"], task["images"], task["texts"]) == (17, 7, 26)
    assert task["dropped"] == {"decode_error": 1, "no_caption": 1, "no_image": 1}
    names = {f"{d}_retrieval_recall@{k}" for d in ("image", "text") for k in (1, 5, 10)}
    names |= {"image_retrieval_median_rank", "text_retrieval_median_rank"}
    assert set(task["metrics"]) == names == set(results[0]["metrics"])
    assert results[0]["model"] == {
        "name": "mmcurate-tiny",
        "pretrained": str(weights),
        "weights": str(weights),
        "kind": "open_clip-file",
    }
    assert all(0.0 <= v <= 1.0 for k, v in task["metrics"].items() if "recall" in k)


def test_a_set_with_nothing_usable_is_refused(tmp_path, capsys):
    manifest = write_build(tmp_path / "bad", [[{"key": "a", "image": b"x", "txt": "broken"}]])
    config = eval_config(tmp_path, retrieval={"manifest": str(manifest)})
    code, _, err = run_main([str(config)], capsys)
    assert code == 2 and "no usable samples" in err and "decode_error" in err


# ---- zero-shot -----------------------------------------------------------------------------


def test_zeroshot_from_class_folders(tmp_path, capsys):
    counts = class_folder(tmp_path / "classes")
    (tmp_path / "classes" / "README.jpg").write_bytes(b"top-level files belong to no class")
    (tmp_path / "classes" / "unlisted").mkdir()
    (tmp_path / "classes" / "unlisted" / "x.jpg").write_bytes(photo(0))
    (tmp_path / "classes" / "chelsea" / "broken.jpg").write_bytes(b"truncated")
    listed = sorted(counts)
    (tmp_path / "names.yaml").write_text(
        yaml.safe_dump(
            {
                "classnames": {name: name.replace("_", " ") for name in listed},
                "templates": ["a photo of {c}.", "{c}"],
            }
        )
    )
    config = eval_config(
        tmp_path,
        zeroshot={
            "path": str(tmp_path / "classes"),
            "classnames": str(tmp_path / "names.yaml"),
            "templates": str(tmp_path / "names.yaml"),
        },
    )
    out = tmp_path / "zs.json"
    code, table, _ = run_main([str(config), "--out", str(out)], capsys)
    assert code == 0 and "mean_per_class_recall" in table
    task = json.loads(out.read_text())["tasks"]["zeroshot"]
    assert task["dropped"] == {"decode_error": 1, "unknown_label": 1}
    assert task["images"] == len(PHOTOS) and task["samples"] == len(PHOTOS) + 2
    assert (task["classes"], task["templates"]) == (len(listed), 2)
    assert set(task["metrics"]) == {"acc1", "acc5", "mean_per_class_recall"}


def test_zeroshot_labels_from_a_manifest(tmp_path, capsys):
    """A label may be a class name, an index, or a cls member; others are counted."""
    samples = [
        {"key": "n", "image": photo(0), "json": {"label": "dog"}},
        {"key": "i", "image": photo(1), "json": {"label": 0}},
        {"key": "c", "image": photo(2)},  # its label comes as a cls member
        {"key": "u", "image": photo(3), "json": {"label": "horse"}},
        {"key": "b", "image": photo(4), "json": {"label": True}},
        {"key": "m", "image": photo(5), "json": {"label": 2}},
    ]
    manifest = write_build(tmp_path / "zs", [samples])
    rewrite_with_cls(tmp_path / "zs" / "shard-000000.tar", "c", b"1\n")
    config = eval_config(
        tmp_path,
        zeroshot={
            "path": str(manifest),
            "classnames": ["cat", "dog", "bird"],
            "templates": ["{c}"],
        },
    )
    out = tmp_path / "zs.json"
    code, _, err = run_main([str(config), "--out", str(out)], capsys)
    assert code == 0, err
    task = json.loads(out.read_text())["tasks"]["zeroshot"]
    assert task["images"] == 4 and task["dropped"] == {"no_label": 1, "unknown_label": 1}


def test_weights_that_do_not_load_are_refused(tmp_path, capsys):
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    other = tmp_path / "other.pt"
    torch.save({"state_dict": {"visual.proj": torch.zeros(2)}}, other)  # another model's
    manifest = flickr_like(tmp_path / "set")
    config = eval_config(tmp_path, retrieval={"manifest": str(manifest)})
    for weights in (junk, other):
        code, _, err = run_main([str(config), "--set", f"model.pretrained={weights}"], capsys)
        assert code == 2 and err.count("\n") == 1
        assert f"{weights} does not load as mmcurate-tiny" in err


def test_a_corrupt_shard_is_counted_not_fatal(tmp_path, capsys):
    """Shard 1's bytes no longer match the manifest's sha256: its 10 samples are `unreadable`."""
    manifest = flickr_like(tmp_path / "set")
    shard = tmp_path / "set" / "shard-000001.tar"
    data = bytearray(shard.read_bytes())
    data[700] ^= 0xFF
    shard.write_bytes(bytes(data))
    config = eval_config(tmp_path, retrieval={"manifest": str(manifest)})
    out = tmp_path / "out.json"
    weights = f"model.pretrained={tiny_weights(tmp_path)}"
    code, _, err = run_main([str(config), "--set", weights, "--out", str(out)], capsys)
    assert code == 0, err
    task = json.loads(out.read_text())["tasks"]["retrieval"]
    assert task["dropped"] == {"decode_error": 1, "no_caption": 1, "no_image": 1, "unreadable": 10}
    assert (task["samples"], task["images"], task["texts"]) == (17, 4, 16)


def test_example_config_validates():
    from mmcurate.trainer.eval.config import load_eval_config

    cfg = load_eval_config(Path(__file__).resolve().parents[2] / "configs" / "eval.yaml")
    assert cfg.retrieval.recall_at == [1, 5, 10] and cfg.zeroshot is None
    assert cfg.model.pretrained == "runs/train_clip"

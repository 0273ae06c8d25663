"""Hostile inputs to `mmcurate eval`, `--export` and `mmcurate probe`, and to the loaders they
share with training: an image Pillow rejects with SyntaxError, an export over its own
checkpoint, outputs that are links, FIFOs, URLs or unwritable, absurd ladders, symlinked class
folders, repeated keys, and the curation recipe's commands."""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import struct
import zlib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from mmcurate.core.config_io import ConfigError, validate
from mmcurate.trainer.data.manifest import read_manifest
from mmcurate.trainer.eval.data import (
    EvalSource,
    Fields,
    ShardRead,
    folder_units,
    make_loader,
    parse_sample,
    shard_units,
)
from mmcurate.trainer.eval.evaluate import check_out, main, write_json
from mmcurate.trainer.eval.tasks import pair_up
from PIL import Image

from tests.eval_sets import eval_config, photo, run_main, write_build

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest: torch on one thread
REPO = Path(__file__).resolve().parents[2]


def broken_png() -> bytes:
    """A PNG whose header opens but whose second IDAT chunk has a garbage type: Pillow's
    load() raises SyntaxError('broken PNG file'), not OSError."""
    buf = io.BytesIO()
    Image.new("RGB", (32, 32), (200, 30, 30)).save(buf, "PNG")
    data, at, out = buf.getvalue(), 8, [buf.getvalue()[:8]]

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + body))
        return struct.pack(">I", len(body)) + kind + body + crc

    while at < len(data):
        size = struct.unpack(">I", data[at : at + 4])[0]
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + size]
        at += 12 + size
        if kind == b"IDAT":
            out += [chunk(kind, body[: size // 2]), chunk(b"E1h\xa4", body[size // 2 :])]
        else:
            out.append(chunk(kind, body))
    return b"".join(out)


# ---- 1. one damaged image is a counted decode_error, never a crash ---------------------------


def test_trainer_decode_errors_cover_the_stages_list():
    from mmcurate.stages.lib.pixels import DECODE_ERRORS as STAGES
    from mmcurate.trainer.data.transform import DECODE_ERRORS

    assert set(STAGES) <= set(DECODE_ERRORS) and RuntimeError in DECODE_ERRORS


def test_a_syntax_error_image_is_a_decode_error_in_eval(tmp_path, capsys):
    with pytest.raises(SyntaxError):  # what the image does to Pillow
        Image.open(io.BytesIO(broken_png())).load()
    (tmp_path / "classes" / "cat").mkdir(parents=True)
    (tmp_path / "classes" / "cat" / "good.jpg").write_bytes(photo(0))
    (tmp_path / "classes" / "cat" / "bad.png").write_bytes(broken_png())
    zeroshot = {"path": str(tmp_path / "classes"), "classnames": ["cat", "dog"]}
    out = tmp_path / "zs.json"
    code, _, err = run_main(
        [str(eval_config(tmp_path, zeroshot=zeroshot)), "--out", str(out)], capsys
    )
    assert code == 0, err
    task = json.loads(out.read_text())["tasks"]["zeroshot"]
    assert task["dropped"] == {"decode_error": 1} and task["images"] == 1


def test_a_syntax_error_image_is_replaced_in_training(tmp_path):
    from mmcurate.trainer.config import TrainConfig
    from mmcurate.trainer.data.dataset import ImageTransform, ShardDataset
    from mmcurate.trainer.data.dataset import make_loader as train_loader
    from mmcurate.trainer.data.transform import decode_or_none
    from mmcurate.trainer.models import build_model

    samples = [{"key": f"t{i}", "image": photo(i), "txt": f"cap {i}"} for i in range(7)]
    samples.append({"key": "bad", "image": broken_png(), "ext": "png", "txt": "bad"})
    manifest = write_build(tmp_path / "build", [samples])
    cfg = TrainConfig.model_validate({"data": {"manifest": "x"}, "run": {"output": "x"}})
    _, preprocess, tokenizer = build_model(cfg.model, torch.device("cpu"))
    dataset = ShardDataset(
        read_manifest(str(manifest)), ImageTransform(preprocess), tokenizer, batch_size=4
    )
    batches = list(train_loader(dataset, 0))
    assert [len(b.keys) for b in batches] == [4, 4]
    bad = tokenizer(["bad"])[0]
    assert not any(torch.equal(row, bad) for b in batches for row in b.tokens)  # replaced
    assert sum(b.replaced for b in batches) == 1
    assert decode_or_none(broken_png(), torch.device("cpu")) is None  # the device-decode path


# ---- 2, 3. --export never replaces a checkpoint; its errors are one line ---------------------


def export(args: list[str], capsys) -> tuple[int, str]:
    code = main(["--export", *args])
    err = capsys.readouterr().err
    assert err.count("\n") == (1 if code else 0) and (err.startswith("error: ") or not code)
    return code, err


def test_export_over_its_own_checkpoint_is_refused(tmp_path, capsys):
    run = tmp_path / "run" / "checkpoints"
    run.mkdir(parents=True)
    checkpoint = run / "step-2.pt"
    checkpoint.write_bytes(b"the training checkpoint")
    os.symlink(checkpoint, tmp_path / "link.pt")
    os.link(checkpoint, tmp_path / "hard.pt")
    for out in (
        checkpoint,
        tmp_path / "link.pt",
        tmp_path / "hard.pt",
        run / ".." / run.name / checkpoint.name,
    ):
        code, err = export([str(checkpoint), str(out)], capsys)
        assert code == 2 and "is the checkpoint itself" in err, (out, err)
    code, err = export([str(checkpoint), str(run / "step-9.pt")], capsys)
    assert code == 2 and "keeps a run's checkpoints" in err
    assert not (run / "step-9.pt").exists()
    assert checkpoint.read_bytes() == b"the training checkpoint"


def test_export_out_is_checked_before_the_checkpoint_is_read(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    missing = str(tmp_path / "none.pt")  # never read: OUT is wrong first
    for out, message in [
        (f"{tmp_path}/adir", "is a directory"),
        (f"{tmp_path}/afile/out.pt", "is not a directory"),
        ("/proc/x.pt", "cannot write in /proc"),
        ("", "--export OUT: empty"),
    ]:
        code, err = export([missing, out], capsys)
        assert code == 2 and message in err, (out, err)


def test_unreadable_checkpoints_are_one_line(tmp_path, capsys):
    (tmp_path / "empty.pt").write_bytes(b"")
    torch.save({"path": Path("not/plain/data")}, tmp_path / "pickled.pt")
    for name, message in [("empty.pt", "EOFError"), ("pickled.pt", "UnpicklingError")]:
        code, err = export([str(tmp_path / name), str(tmp_path / "out.pt")], capsys)
        assert code == 2 and "cannot read" in err and message in err, err
    assert not (tmp_path / "out.pt").exists()


# ---- 4. absurd probe ladders ----------------------------------------------------------------


@pytest.mark.parametrize(
    "ladder", [[4, 1180591620717411303424], [4611686018427387904], [2**24 + 1]]
)
def test_a_ladder_past_the_bound_is_one_line(ladder):
    from mmcurate.trainer.config import TrainConfig

    tree = {"data": {"manifest": "m"}, "run": {"output": "o"}, "probe": {"batch_sizes": ladder}}
    with pytest.raises(ConfigError) as err:
        validate(TrainConfig, tree)
    assert str(err.value).startswith("probe.batch_sizes") and "16777216" in str(err.value)


def test_a_rung_whose_batch_cannot_be_made_ends_the_ladder_as_oom():
    """Sizes torch cannot even allocate (an int64 overflow, a storage-size overflow): that
    rung fails like one out of memory, the ladder ends, nothing raises."""
    from mmcurate.trainer.probe.ladder import climb

    parts = SimpleNamespace(
        device=torch.device("cpu"),
        core=SimpleNamespace(visual=SimpleNamespace(image_size=8)),
        optimizer=SimpleNamespace(zero_grad=lambda set_to_none: None),
    )
    for size in (2**70, 2**62):
        probe = SimpleNamespace(batch_sizes=[size, 4], steps=1)
        results: list[dict] = []
        climb(
            parts, lambda texts: torch.zeros(len(texts), 4, dtype=torch.long), probe, results.append
        )
        assert [(r["batch_size"], r["status"]) for r in results] == [(size, "oom")]
        assert "no batch of" in results[0]["error"]


def test_a_failing_probe_is_one_line(tmp_path, capsys, monkeypatch):
    import mmcurate.trainer.probe.run as probe_run

    def fail(cfg):
        raise RuntimeError("probe: the ladder failed:\nTraceback (most recent call last):\n  x")

    monkeypatch.setattr(probe_run, "read_sources", lambda cfg: None)
    monkeypatch.setattr(probe_run, "probe", fail)
    config = tmp_path / "train.yaml"
    config.write_text(json.dumps({"data": {"manifest": "m.json"}, "run": {"output": "o"}}))
    assert probe_run.main([str(config)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: probe: the ladder failed")


# ---- 5. symlinked class folders ----------------------------------------------------------------


def test_symlinked_class_folders_are_followed_once(tmp_path):
    (tmp_path / "real" / "cat").mkdir(parents=True)
    (tmp_path / "real" / "cat" / "1.jpg").write_bytes(b"x")
    (tmp_path / "set" / "dog").mkdir(parents=True)
    (tmp_path / "set" / "dog" / "1.jpg").write_bytes(b"x")
    os.symlink(tmp_path / "real" / "cat", tmp_path / "set" / "cat")
    os.symlink(tmp_path / "set" / "dog", tmp_path / "set" / "dog" / "loop")  # a cycle
    os.symlink(tmp_path / "set", tmp_path / "set" / "dog" / "up")  # one through the root
    found = [
        (Path(f.url).relative_to(tmp_path / "set").as_posix(), f.label)
        for f in folder_units(str(tmp_path / "set"), None)
    ]
    assert found == [("cat/1.jpg", "cat"), ("dog/1.jpg", "dog")]


# ---- 6. --out ------------------------------------------------------------------------------


DOC = {"format": "mmcurate-eval/1", "metrics": {"acc1": 0.5}}


def test_out_through_a_symlink_writes_the_file_it_names(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "target.json").write_text("{}")
    os.symlink("real/target.json", tmp_path / "link.json")
    check_out(str(tmp_path / "link.json"))
    write_json(str(tmp_path / "link.json"), DOC)
    assert (tmp_path / "link.json").is_symlink()
    assert json.loads((tmp_path / "real" / "target.json").read_text()) == DOC


def test_out_to_a_fifo_writes_into_it(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader, so opening it to write works
    try:
        check_out(str(fifo))
        write_json(str(fifo), DOC)
        assert json.loads(os.read(reader, 1 << 16)) == DOC
    finally:
        os.close(reader)
    assert fifo.is_fifo()


def test_out_to_a_url_goes_through_fsspec(s3, s3_bucket, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where a URL taken for a local path would land
    url = f"s3://{s3_bucket}/evals/x.json"
    check_out(url, s3.storage_options)
    write_json(url, DOC, s3.storage_options)
    assert json.loads(s3.filesystem().cat_file(f"{s3_bucket}/evals/x.json")) == DOC
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("out", "message"), [("", "--out: empty"), ("/proc/eval.json", "cannot write in /proc")]
)
def test_an_unusable_out_is_refused_before_the_evaluation(tmp_path, capsys, out, message):
    zeroshot = {"path": str(tmp_path / "nowhere"), "classnames": ["a"]}  # would fail later
    code, _, err = run_main([str(eval_config(tmp_path, zeroshot=zeroshot)), "--out", out], capsys)
    assert code == 2 and err.count("\n") == 1 and message in err, err


# ---- 7. identity: never the key ---------------------------------------------------------------


def records_of(manifest: Path, fields: Fields, task: str) -> list:
    units = shard_units(read_manifest(str(manifest)))
    source = EvalSource(
        units,
        ShardRead(read_manifest(str(manifest)), None, None),
        [u.position for u in units],
        lambda image: torch.zeros(1),
        fields,
        task,
        4,
    )
    return sorted((r for p in make_loader(source, 0) for r in p.records), key=lambda r: r.position)


def test_keys_repeated_across_shards_are_distinct_images(tmp_path):
    shards = [
        [
            {"key": f"{j:06d}", "image": photo(4 * s + j), "txt": f"shard {s} image {j}"}
            for j in range(4)
        ]
        for s in range(3)
    ]
    records = records_of(write_build(tmp_path / "across", shards), Fields(), "retrieval")
    carriers, texts, text_image = pair_up(records)
    assert len(carriers) == 12 and text_image == list(range(12))


def test_a_key_repeated_in_a_zeroshot_shard_keeps_both_images(tmp_path):
    shard = [
        {"key": "a", "image": photo(0), "json": {"label": "cat"}},
        {"key": "b", "image": photo(1), "json": {"label": "dog"}},
        {"key": "a", "image": photo(2), "json": {"label": "dog"}},
    ]
    records = records_of(write_build(tmp_path / "zs", [shard]), Fields(image_id=""), "zeroshot")
    assert [(r.has_image, r.drop) for r in records] == [(True, None)] * 3


def test_image_ids_keep_their_json_type(tmp_path):
    shard = [
        {"key": "a", "image": photo(0), "txt": "a", "json": {"image_id": 1}},
        {"key": "b", "image": photo(1), "txt": "b", "json": {"image_id": "1"}},
        {"key": "c", "image": photo(2), "txt": "c", "json": {"image_id": 1}},
    ]
    records = records_of(write_build(tmp_path / "ids", [shard]), Fields(), "retrieval")
    carriers, _, text_image = pair_up(records)
    assert len(carriers) == 2 and text_image == [0, 1, 0]


@pytest.mark.parametrize(("label", "expected"), [(1.0, "1"), (" dog ", "dog"), ("  ", None)])
def test_zeroshot_labels_as_written_by_hand(label, expected):
    sample = {"__key__": "k", "jpg": b"", "json": json.dumps({"label": label}).encode()}
    assert parse_sample(0, sample, Fields(image_id=""), "zeroshot", set()).label == expected


# ---- 8. the curation recipe's commands are real -----------------------------------------------


def test_the_curation_recipe_commands_validate():
    """Each mmcurate command of docs/recipes.md's curation recipe loads its config with its
    `--set`s (`my-clip.yaml` is the copy of configs/curation/clip.yaml it asks for)."""
    from mmcurate.pipeline.config import load_build_config
    from mmcurate.trainer.config import load_train_config
    from mmcurate.trainer.eval.config import load_eval_config

    text = (REPO / "docs" / "recipes.md").read_text()
    section = text.split("## Pick a CLIP-score threshold")[1].split("\n## ")[0]
    commands = [" ".join(c.split()) for c in re.findall(r"`(\.venv/bin/mmcurate [^`]+)`", section)]
    loaders = {"build": load_build_config, "train": load_train_config, "eval": load_eval_config}
    assert sorted(c.split()[1] for c in commands) == ["build", "build", "eval", "train"]
    for command in commands:
        words = shlex.split(command)
        config = words[2].replace("my-clip.yaml", "configs/curation/clip.yaml")
        sets = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
        loaders[words[1]](REPO / config, sets)
    assert "--keep" not in section.split("On your own data")[1]

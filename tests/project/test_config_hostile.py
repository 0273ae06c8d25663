"""Hostile configs and command lines: each fails fast with one line naming the key (exit 2),
never a traceback and never after the work has run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mmcurate.core.config_io import ConfigError, load_yaml, parse_override
from mmcurate.pipeline.cli import main as mmcurate
from mmcurate.pipeline.config import load_build_config
from mmcurate.trainer.config import load_train_config
from mmcurate.trainer.eval import evaluate as eval_module
from mmcurate.trainer.eval.config import load_eval_config
from mmcurate.trainer.eval.evaluate import write_json

HUGE = "9" * 400


def build_yaml(tmp_path: Path, body: str) -> Path:
    """A build config around `body` (YAML lines appended after source and output)."""
    (tmp_path / "in").mkdir(exist_ok=True)
    path = tmp_path / "c.yaml"
    source = f"source: {{kind: images, path: {tmp_path / 'in'}}}\n"
    path.write_text(source + f"output: {{path: {tmp_path / 'o'}}}\n" + body)
    return path


def train_yaml(tmp_path: Path, body: str = "") -> Path:
    path = tmp_path / "t.yaml"
    path.write_text(f"data: {{manifest: m.json}}\nrun: {{output: {tmp_path / 'run'}}}\n{body}")
    return path


def eval_yaml(tmp_path: Path, body: str = "") -> Path:
    path = tmp_path / "e.yaml"
    path.write_text(f"model: {{name: mmcurate-tiny}}\nretrieval: {{manifest: m.json}}\n{body}")
    return path


def config_error(load, *args) -> str:
    with pytest.raises(ConfigError) as err:
        load(*args)
    assert "\n" not in str(err.value)
    return str(err.value)


@pytest.mark.parametrize(
    "stage,message",
    [
        ("{name: near_dedupe, seed: -1}", "stages.0.seed: Input should be greater than or equal"),
        ("{name: semantic_dedupe, seed: -1}", "stages.0.seed: Input should be greater than"),
        ("{name: semantic_dedupe, seed: 2147483648}", "stages.0.seed: Input should be less than"),
    ],
)
def test_dedupe_seeds_numpy_and_faiss_refuse_are_config_errors(tmp_path, stage, message):
    path = build_yaml(tmp_path, f"stages: [{stage}]\n")
    assert config_error(load_build_config, path).startswith(message)


@pytest.mark.parametrize(
    "stages,key",
    [
        ("[{name: decode_image}, {name: clip_score, min_score: .nan}]", "stages.1.min_score"),
        ("[{name: download, timeout_s: .inf}]", "stages.0.timeout_s"),
        ("[{name: clip_score, keep_top_fraction: .nan}]", "stages.0.keep_top_fraction"),
    ],
)
def test_nan_and_inf_options_are_refused_by_key(tmp_path, stages, key):
    path = build_yaml(tmp_path, f"stages: {stages}\n")
    assert config_error(load_build_config, path) == f"{key}: Input should be a finite number"


def test_infinite_ray_resource_is_refused(tmp_path):
    path = build_yaml(tmp_path, "ray: {resources: {accel: .inf}}\n")
    assert config_error(load_build_config, path).startswith("ray.resources.accel:")


@pytest.mark.parametrize(
    "override,key",
    [
        ("optim.lr=.inf", "optim.lr"),
        ("data.weight=.inf", "data.weight"),
        ("health.spike_sigmas=.inf", "health.spike_sigmas"),
        (f"data.cache_limit={HUGE}GB", "data.cache_limit"),
        (f"probe.max_memory={HUGE}B", "probe.max_memory"),
        ("probe.max_memory=10000000000GB", "probe.max_memory"),
    ],
)
def test_train_numbers_out_of_range_name_the_key(tmp_path, override, key):
    message = config_error(load_train_config, train_yaml(tmp_path), [override])
    assert message.startswith(f"{key}: "), message


@pytest.mark.parametrize(
    "override,key",
    [
        (f"data.cache_limit={HUGE}GB", "data.cache_limit"),
        (f"retrieval.recall_at=[1, {10**30}]", "retrieval.recall_at"),
    ],
)
def test_eval_numbers_out_of_range_name_the_key(tmp_path, override, key):
    message = config_error(load_eval_config, eval_yaml(tmp_path), [override])
    assert message.startswith(f"{key}: "), message


def test_a_directory_as_config_says_so(tmp_path):
    assert "is a directory" in config_error(load_yaml, tmp_path)


def test_an_unreadable_config_is_one_line(tmp_path, monkeypatch):
    path = build_yaml(tmp_path, "")

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "read_text", refuse)
    assert config_error(load_yaml, path) == f"{path}: cannot read: Permission denied"


@pytest.mark.parametrize(
    "body,key",
    [
        ("storage_options: &a {x: *a}\n", "storage_options.x"),
        ("stages: &a [*a]\n", "stages.0"),
    ],
)
def test_anchor_cycles_are_refused(tmp_path, body, key):
    path = build_yaml(tmp_path, body)
    assert config_error(load_yaml, path) == f"{path}: {key}: refers to itself (a YAML anchor cycle)"


def test_anchor_cycle_in_an_override_is_refused():
    message = config_error(parse_override, "storage_options=&a {b: *a}")
    assert message == "--set storage_options.b: refers to itself (a YAML anchor cycle)"


def test_shared_anchors_are_not_cycles(tmp_path):
    path = build_yaml(tmp_path, "x: &a {k: [1]}\ny: [*a, *a]\nz: {<<: *a, k: 2}\n")
    assert load_yaml(path)["z"] == {"k": 2}  # an explicit key overrides a merged one


@pytest.mark.parametrize("maker", [build_yaml, train_yaml, eval_yaml])
def test_duplicate_keys_are_refused_with_their_line(tmp_path, maker):
    path = maker(tmp_path, "storage_options: {}\nstorage_options: {a: 1}\n")
    message = config_error(load_yaml, path)
    assert message == f"{path}: key 'storage_options' appears twice (line 4)"


def test_duplicate_nested_key_and_in_override(tmp_path):
    path = build_yaml(tmp_path, "stages:\n  - name: decode_image\n    name: caption_filter\n")
    assert config_error(load_yaml, path) == f"{path}: key 'name' appears twice (line 5)"
    message = config_error(parse_override, "stages.0={name: a, name: b}")
    assert message == "--set stages.0: key 'name' appears twice (line 1)"


def test_non_ascii_digit_in_key_path_is_a_key_not_an_index(tmp_path):
    assert parse_override("stages.²=1") == (["stages", "²"], 1)
    message = config_error(load_build_config, build_yaml(tmp_path, "stages: []\n"), ["stages.²=1"])
    assert message == "--set stages.²: no such list item"


def test_bad_build_config_exits_2_with_one_line(tmp_path, capsys):
    path = build_yaml(tmp_path, "stages: [{name: near_dedupe, seed: -1}]\n")
    assert mmcurate(["build", str(path)]) == 2
    assert capsys.readouterr().err.startswith("error: stages.0.seed: ")


def test_eval_out_directory_is_refused_before_evaluating(tmp_path, monkeypatch, capsys):
    def evaluate(*args, **kwargs):
        raise AssertionError("evaluated although --out cannot be written")

    monkeypatch.setattr(eval_module, "evaluate", evaluate)
    code = eval_module.main([str(eval_yaml(tmp_path)), "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"error: --out {tmp_path}: is a directory"), err


def test_write_json_leaves_no_temporary_when_the_rename_fails(tmp_path):
    target = tmp_path / "results"
    target.mkdir()
    with pytest.raises(OSError):
        write_json(str(target), {"metrics": {}})
    assert [p.name for p in tmp_path.iterdir()] == ["results"]


@pytest.mark.parametrize("command", ["train", "eval", "probe"])
def test_trainer_commands_print_their_own_help(command, capsys):
    assert mmcurate([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: mmcurate {command} ") and "--set KEY.PATH=VALUE" in out


def test_eval_export_goes_to_eval_parser(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(eval_module, "export_command", lambda a, b: {"from": a, "to": b})
    assert mmcurate(["eval", "--export", "a.pt", "b.pt"]) == 0
    assert json.loads(capsys.readouterr().out) == {"from": "a.pt", "to": "b.pt"}


def test_train_options_may_come_before_the_config(tmp_path, capsys):
    missing = tmp_path / "none.yaml"
    assert mmcurate(["train", "--set", "run.max_steps=1", str(missing)]) == 2
    assert capsys.readouterr().err == f"error: config file not found: {missing}\n"


@pytest.mark.parametrize(
    "extra,message",
    [
        ([], "no build here"),
        (["--storage-options", "{bad"], "error: --storage-options: not JSON"),
        (["--storage-options", "[1]"], "error: --storage-options: expected a JSON object"),
    ],
)
def test_report_errors_are_one_line(tmp_path, capsys, extra, message):
    assert mmcurate(["report", str(tmp_path / "nothing"), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_two_merge_keys_in_one_mapping_are_refused(tmp_path):
    """PyYAML keeps the first `<<` and silently drops the second's keys."""
    body = "a: &a {k: 1}\nb: &b {j: 2}\nx: {<<: *a, <<: *b}\n"
    message = config_error(load_yaml, build_yaml(tmp_path, body))
    assert message.endswith("key '<<' appears twice (line 5); merge several as <<: [*a, *b]")
    merged = load_yaml(build_yaml(tmp_path, "a: &a {k: 1}\nb: &b {j: 2}\nx: {<<: [*a, *b]}\n"))
    assert merged["x"] == {"k": 1, "j": 2}

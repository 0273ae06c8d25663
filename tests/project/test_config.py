"""Config loading, overrides, and one-line errors from the CLI."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mmcurate.core.config_io import ConfigError, parse_override
from mmcurate.pipeline.config import load_build_config
from mmcurate.stages.registry import build_stages

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "configs" / "demo.yaml"


def write_config(tmp_path, tree) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def base_tree(tmp_path) -> dict:
    (tmp_path / "in").mkdir(exist_ok=True)
    return {
        "source": {"kind": "images", "path": str(tmp_path / "in")},
        "output": {"path": str(tmp_path / "out")},
    }


def test_demo_config_loads_with_overrides():
    cfg = load_build_config(
        DEMO, ["output.shard_max_samples=7", "stages.0.quality=70", "ray.address=null"]
    )
    assert cfg.output.shard_max_samples == 7
    assert cfg.stages[0]["quality"] == 70
    names = [s["name"] for s in cfg.stages]
    assert names == [
        "decode_image",
        "caption_filter",
        "language_filter",
        "exact_dedupe",
        "near_dedupe",
    ]


@pytest.mark.parametrize(
    "name", ["demo.yaml", "laion_ingest.yaml", "laion_dedupe.yaml", "video_frames.yaml"]
)
def test_shipped_build_configs_validate_with_every_stage(name):
    cfg = load_build_config(REPO / "configs" / name, [])
    build_stages(cfg.stages)  # every stage's options validate


def test_override_parsing():
    assert parse_override("a.b.0.c=3") == (["a", "b", 0, "c"], 3)
    assert parse_override("x={k: v}") == (["x"], {"k": "v"})
    with pytest.raises(ConfigError):
        parse_override("novalue")


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda t: t.update(extra=1), "extra: unknown key"),
        (lambda t: t["output"].update(shard_max_samples="many"), "output.shard_max_samples:"),
        (lambda t: t["source"].update(kind="ftp"), "source.kind:"),
        (lambda t: t.pop("output"), "output: required key is missing"),
        (lambda t: t.update(stages=[{"name": "bogus"}]), "stages.0.name: unknown stage"),
    ],
)
def test_bad_configs_name_the_key(tmp_path, change, message):
    tree = base_tree(tmp_path)
    change(tree)
    with pytest.raises(ConfigError) as err:
        load_build_config(write_config(tmp_path, tree))
    assert str(err.value).startswith(message), str(err.value)


def run_cli(*args, env=None, timeout=10):
    """Bad configs must fail fast: the timeout is the acceptance bound, not a benchmark."""
    return subprocess.run(
        [sys.executable, "-m", "mmcurate", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["bogus.key=1"], "error: bogus: unknown key"),
        (["output.shard_max_samples=abc"], "error: output.shard_max_samples:"),
        (["source.path=/nonexistent/mmcurate-input"], "error: source.path: folder not found"),
        (['ray.resources={"CPU": 1}'], "error: ray.resources: 'CPU' is not a custom"),
        (['ray.resources={"ingest": -1}'], "error: ray.resources: ingest: needs"),
        (['ray.resources={"ingest": 1}'], "error: ray.resources: ingest asked for, but a local"),
        (
            [
                "output.path=s3://nobucket/out",
                'storage_options={"key": "k", "secret": "s", '
                '"client_kwargs": {"endpoint_url": "http://127.0.0.1:9"}}',
            ],
            "error: output.path: storage unreachable",
        ),
    ],
)
def test_cli_fails_fast_with_one_line(tmp_path, overrides, message):
    (tmp_path / "in").mkdir()
    sets = [f"--set=source.path={tmp_path / 'in'}", f"--set=output.path={tmp_path / 'out'}"]
    sets += [f"--set={o}" for o in overrides]
    result = run_cli("build", str(DEMO), *sets)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(message), lines[0]
    assert "secret" not in lines[0] or "s3" in message


def test_cli_missing_config_file():
    result = run_cli("build", "no-such-config.yaml")
    assert result.returncode == 2
    assert result.stderr.strip() == "error: config file not found: no-such-config.yaml"


@pytest.mark.parametrize(
    "content",
    [
        b"source:\n  kind: images\n  path: /tmp/\xff\xfe\n",  # Latin-1 bytes, not UTF-8
        b"\xff\xfes\x00o\x00u\x00r\x00c\x00e\x00",  # UTF-16 with a byte-order mark
        b"\x89PNG\r\n\x1a\n\x00\x00",  # a binary file given by mistake
    ],
)
@pytest.mark.parametrize("command", ["build", "train"])
def test_cli_config_not_utf8_is_one_line(tmp_path, content, command):
    config = tmp_path / "bad.yaml"
    config.write_bytes(content)
    result = run_cli(command, str(config))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines == [lines[0]] and lines[0].startswith(f"error: {config}: not UTF-8"), lines

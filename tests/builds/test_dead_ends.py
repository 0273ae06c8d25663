"""Stage chains that can never keep a sample are config errors (one line, exit code 2), not
builds that run to the end and drop everything (issue 46)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from mmcurate.pipeline.cli import main
from mmcurate.pipeline.config import ConfigError, load_build_config

REPO = Path(__file__).resolve().parents[2]


def config(tmp_path: Path, stages: list[dict]) -> Path:
    (tmp_path / "in").mkdir(exist_ok=True)
    spec = {"source": {"kind": "images", "path": str(tmp_path / "in")}, "stages": stages}
    spec["output"] = {"path": str(tmp_path / "out")}
    path = tmp_path / "build.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


DEAD = [
    # decode_image's default 256 px, then SDXL's buckets (every side 512 or more)
    ([{"name": "decode_image"}, {"name": "aspect_buckets"}], "below_bucket"),
    (
        [
            {"name": "decode_image", "resize": {"size": 600, "mode": "center_crop"}},
            {"name": "aspect_buckets", "buckets": ["640x640", "768x512"]},
        ],
        "a square of 600 px",
    ),
    (
        [
            {"name": "decode_image", "resize": {"size": 512}},
            {"name": "aspect_buckets", "buckets": ["512x512"], "min_side": 600},
        ],
        "too_small",
    ),
    (
        [
            {"name": "decode_image", "resize": {"size": 512, "mode": "center_crop"}},
            {"name": "aspect_buckets", "buckets": ["512x512"], "min_pixels": 300000},
        ],
        "too_few_pixels",
    ),
]


@pytest.mark.parametrize("stages, reason", DEAD)
def test_a_chain_that_keeps_nothing_is_one_line(tmp_path, stages, reason):
    with pytest.raises(ConfigError) as err:
        load_build_config(config(tmp_path, stages))
    message = str(err.value)
    assert "\n" not in message and reason in message
    assert message.startswith("stages.1 (aspect_buckets) after stages.0 (decode_image): ")


LIVE = [
    [{"name": "decode_image", "resize": {"size": 512}}, {"name": "aspect_buckets"}],
    [{"name": "decode_image", "resize": {"mode": "none"}}, {"name": "aspect_buckets"}],
    [{"name": "decode_image"}, {"name": "aspect_buckets", "upscale": {"max_factor": 2.0}}],
    [{"name": "aspect_buckets"}, {"name": "decode_image"}],  # buckets first: decode after
    [
        {"name": "decode_image", "resize": {"size": 768, "mode": "center_crop"}},
        {"name": "aspect_buckets", "buckets": ["640x640", "768x512"]},
    ],
]


@pytest.mark.parametrize("stages", LIVE)
def test_chains_that_can_keep_samples_pass(tmp_path, stages):
    assert load_build_config(config(tmp_path, stages)).stages == stages


def test_the_cli_exits_2_with_the_line(tmp_path, capsys):
    path = config(tmp_path, [{"name": "decode_image"}, {"name": "aspect_buckets"}])
    assert main(["build", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: stages.1 (aspect_buckets)") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_every_shipped_config_still_loads():
    for path in sorted((REPO / "configs").glob("*.yaml")):
        text = yaml.safe_load(path.read_text())
        if "stages" in text:  # build configs (the others are train and eval configs)
            try:
                load_build_config(path)
            except ConfigError as err:
                assert "aspect_buckets" not in str(err) and "after stages" not in str(err)

"""The public Python API (`import mmcurate`): the README's example runs as written, and a bad
config raises the commands' one line (issue 46)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import mmcurate

REPO = Path(__file__).resolve().parents[2]


def readme_python_blocks() -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text.split("### From Python", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


@pytest.mark.slow
def test_the_readme_example_runs_as_written(tmp_path):
    from mmcurate.pipeline.demo_data import make_demo_images

    (block,) = readme_python_blocks()
    home = tmp_path / "home"
    make_demo_images(home / ".cache/mmcurate/demo/images", n=12)
    env = {**os.environ, "HOME": str(home)}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(
        [sys.executable, "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    first, shards, shape = done.stdout.strip().splitlines()
    assert first == f"12 samples in 2 shards: {tmp_path / 'api-build' / 'manifest.json'}"
    assert shards == "[('shard-000000.tar', 10), ('shard-000001.tar', 2)]"
    assert shape.startswith("torch.Size([4, 3, 64, 64]) torch.Size([4, 77])")
    assert (tmp_path / "api-build" / "manifest.json").is_file()


def test_a_bad_config_raises_the_one_line_and_the_callers_dict_is_untouched(tmp_path):
    config = {"source": {"kind": "images", "path": str(tmp_path)}, "output": {"path": "x"}}
    with pytest.raises(mmcurate.ConfigError) as err:
        mmcurate.build(config, overrides=["output.shard_max_samples=many"])
    assert str(err.value).startswith("output.shard_max_samples: ") and "\n" not in str(err.value)
    assert config["output"] == {"path": "x"}  # overrides went to a copy
    with pytest.raises(mmcurate.ConfigError, match="config file not found"):
        mmcurate.train(tmp_path / "missing.yaml")


def test_import_mmcurate_is_light():
    """The API module imports neither torch nor Ray until a function needs them."""
    code = "import sys, mmcurate; print(sorted({'torch', 'ray'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "[]", done.stderr

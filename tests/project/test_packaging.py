"""One import name: the wheel installs `mmcurate` and nothing else, and mmcurate works beside a
user's own `core`, `pipeline` and `trainer` packages (issue 46)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import tomllib
import yaml

REPO = Path(__file__).resolve().parents[2]
PARTS = ("core", "pipeline", "stages", "trainer")


def test_the_package_list_names_every_folder_of_the_parts():
    """pyproject lists the packages (setuptools maps mmcurate.X to the root's X/): a new
    sub-package missing from the list would be left out of the wheel."""
    listed = set(
        tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {"mmcurate"}
    for part in PARTS:
        for init in (REPO / part).rglob("__init__.py"):
            found.add(".".join(["mmcurate", *init.parent.relative_to(REPO).parts]))
    assert listed == found


@pytest.mark.slow
def test_the_wheel_holds_one_top_level_name(tmp_path):
    source = tmp_path / "src"
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for name in files:  # a copy: building writes build/ and *.egg-info beside the sources
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            (source / name).write_bytes((REPO / name).read_bytes())
    wheels = tmp_path / "wheels"
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    done = subprocess.run([*build, "-w", str(wheels), str(source)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = wheels.glob("mmcurate-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"mmcurate"}
    for must in (
        "mmcurate/__init__.py",
        "mmcurate/pipeline/cli.py",
        "mmcurate/trainer/dist/fsdp.py",
        "mmcurate/core/model_configs/mmcurate-tiny.json",
    ):
        assert must in names
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "mmcurate = mmcurate.pipeline.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()


DECOY = 'raise ImportError("the decoy {name} package was imported")\n'

USER_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import mmcurate

    if __name__ == "__main__":
        result = mmcurate.build(json.loads(sys.argv[1]))
        print(json.dumps(result))
    """
)


@pytest.mark.slow
def test_mmcurate_runs_beside_a_users_core_pipeline_and_trainer(tmp_path, image_folder):
    """A training repo with its own core/, pipeline/ and trainer/ first on sys.path: the API
    and the command both build, and nothing imports the user's packages."""
    user = tmp_path / "user-repo"
    for name in ("core", "pipeline", "trainer", "stages"):
        (user / name).mkdir(parents=True)
        (user / name / "__init__.py").write_text(DECOY.format(name=name))
    (user / "run.py").write_text(USER_SCRIPT)
    images = image_folder(n=6)
    spec = {
        "source": {"kind": "images", "path": str(images), "files_per_task": 3},
        "stages": [{"name": "decode_image", "resize": {"size": 32}}],
        "output": {"path": str(tmp_path / "api-out")},
        "ray": {"num_cpus": 2},
    }
    env = {**os.environ, "PYTHONPATH": str(user)}
    env.pop("RAY_ADDRESS", None)
    api = subprocess.run(
        [sys.executable, "run.py", json.dumps(spec)],
        cwd=user,
        env=env,
        capture_output=True,
        text=True,
    )
    assert api.returncode == 0, api.stderr[-3000:]
    result = json.loads(api.stdout.strip().splitlines()[-1])
    assert result["samples"] == 6 and result["shards"] == 1
    assert json.loads(Path(result["manifest"]).read_text())["samples"] == 6

    spec["output"]["path"] = str(tmp_path / "cli-out")
    config = user / "build.yaml"
    config.write_text(yaml.safe_dump(spec))
    for command in (
        [sys.executable, "-m", "mmcurate"],
        [str(Path(sys.executable).parent / "mmcurate")],
    ):
        done = subprocess.run(
            [*command, "build", str(config), "--no-progress"],
            cwd=user,
            env=env,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert json.loads(done.stdout.strip().splitlines()[-1])["samples"] == 6

"""`mmcurate train` given what a user gets wrong says so on one line, exit code 2 (issue 45,
items 8 and 11): a run.output that cannot be a folder, a resume with another model.name,
a model.pretrained of another architecture; and each rank's error line is its own line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mmcurate.trainer.cli import main

from tests.kit_shards import write_uneven_shards

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[dict, Path]:
    """A 2-step mmcurate-tiny run (its config, its run folder)."""
    root = tmp_path_factory.mktemp("hostile")
    manifest = write_uneven_shards(root, sizes=(16,))
    body = {
        "data": {"manifest": str(manifest), "batch_size": 4, "workers": 0},
        "run": {"output": str(root / "run"), "max_steps": 2},
    }
    assert main([write(root / "train.yaml", body)]) == 0
    return body, root / "run"


def write(path: Path, body: dict) -> str:
    path.write_text(yaml.safe_dump(body))
    return str(path)


def one_line_error(capfd, argv: list[str]) -> str:
    """The command's stderr, checked to be one `error:` line with exit code 2."""
    capfd.readouterr()
    code = main(argv)
    lines = [x for x in capfd.readouterr().err.splitlines() if x.startswith("error:")]
    assert code == 2 and len(lines) == 1, lines
    return lines[0]


def test_a_run_output_that_cannot_be_a_folder_is_one_line(trained, tmp_path, capfd):
    body, _ = trained
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    config = write(tmp_path / "c.yaml", body)
    under_a_file = one_line_error(capfd, [config, "--set", f"run.output={a_file}/run"])
    assert "run.output:" in under_a_file and "under a file" in under_a_file
    assert a_file.read_text() == "x"
    # /proc takes no new entries, not even root's (chmod would not stop root).
    cannot = one_line_error(capfd, [config, "--set", "run.output=/proc/mmcurate-test/run"])
    assert cannot.startswith("error: run.output: cannot write in /proc")


def test_resuming_with_another_model_name_is_one_line(trained, tmp_path, capfd):
    body, output = trained
    config = write(tmp_path / "c.yaml", body)
    argv = [config, "--set", "run.resume=true", "--set", "model.name=ViT-S-32"]
    line = one_line_error(capfd, argv)
    assert "model.name: 'ViT-S-32'" in line and "'mmcurate-tiny'" in line
    assert sorted(p.name for p in (output / "checkpoints").iterdir()) == ["step-2.pt"]


def test_a_pretrained_checkpoint_of_another_architecture_is_one_line(trained, tmp_path, capfd):
    body, output = trained
    config = write(tmp_path / "c.yaml", body)
    weights = output / "checkpoints" / "step-2.pt"
    argv = [config, "--set", f"run.output={tmp_path / 'new'}", "--set", "model.name=ViT-S-32"]
    line = one_line_error(capfd, [*argv, "--set", f"model.pretrained={weights}"])
    assert line.startswith(f"error: model.pretrained: {weights} does not load as ViT-S-32")


def test_each_rank_writes_its_error_as_a_whole_line_of_its_own(tmp_path):
    """Two ranks failing at once into one pipe, unbuffered (PYTHONUNBUFFERED, as Ray and
    many images set it, made print write the text and its newline apart): two lines, each
    naming its rank."""
    config = write(tmp_path / "bad.yaml", {"data": {"manifest": "m.json", "bogus": 1}})
    read, shared = os.pipe()
    env = os.environ | {"PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO), "WORLD_SIZE": "2"}
    ranks = [
        subprocess.Popen(
            [sys.executable, "-m", "mmcurate.trainer", config],
            stderr=shared,
            stdout=subprocess.DEVNULL,
            env=env | {"RANK": str(rank)},
            cwd=REPO,
        )
        for rank in (0, 1)
    ]
    os.close(shared)
    with os.fdopen(read, "rb") as pipe:
        text = pipe.read().decode()
    assert [rank.wait(timeout=300) for rank in ranks] == [2, 2]
    assert sorted(text.splitlines()) == [
        f"error: [rank {rank}] data.bogus: unknown key" for rank in (0, 1)
    ]
    assert text.endswith("\n")

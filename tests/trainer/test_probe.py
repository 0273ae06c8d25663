"""`mmcurate probe` on the CPU with mmcurate-tiny: the ladder runs until a rung really runs
out of memory (a 400 MiB cap enforced with RLIMIT_AS in the ladder's child process, which
batch 4096 exceeds), the probe survives it, prints the table and a recommendation, and writes
the JSON; and the sizing arithmetic on given numbers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from mmcurate.core.config_io import ConfigError, validate
from mmcurate.pipeline.cli import main
from mmcurate.trainer.config import ProbeConfig, TrainConfig
from mmcurate.trainer.probe.sizing import recommend, step_time

from tests.kit_shards import write_uneven_shards

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_probe_survives_an_out_of_memory_rung_and_recommends(tmp_path, capsys):
    manifest = write_uneven_shards(tmp_path, sizes=(32, 32))
    config = tmp_path / "train.yaml"
    tree = {
        "data": {"manifest": str(manifest), "batch_size": 8, "workers": 1},
        "run": {"output": str(tmp_path / "run")},
        "probe": {"batch_sizes": [8, 16, 32, 4096], "steps": 1, "loader_batches": 3},
    }
    tree["probe"] |= {"loop_steps": 3}
    config.write_text(yaml.safe_dump(tree))
    out = tmp_path / "probe.json"
    args = ["probe", str(config), "--max-memory", "400MiB", "--target-global-batch", "256"]
    assert main([*args, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "batch status" in printed and "recommendation: 8 GPU(s) x batch 32" in printed
    report = json.loads(out.read_text())
    ladder = report["ladder"]
    assert [(r["batch_size"], r["status"]) for r in ladder] == [
        *((8, "ok"), (16, "ok"), (32, "ok"), (4096, "oom"))
    ]
    assert "allocate" in ladder[-1]["error"]  # a real allocation failure, in the child
    assert all(0 < r["peak_memory_bytes"] < 400 * 2**20 and r["step_s"] > 0 for r in ladder[:3])
    advice = report["recommendation"]
    assert advice["batch_size_per_gpu"] == 32 and advice["gpus"] == 8
    assert advice["global_batch"] == 256 and advice["workers_per_gpu"] >= 1
    assert advice["cpu_cores_per_gpu"] >= 2
    loader = report["loader"]
    assert loader["samples_per_s_per_core"] > 0 and loader["samples_per_s_per_worker"] > 0
    assert 0 <= report["data_wait"]["data_wait_frac"] <= 1 and report["data_wait"]["steps"] == 3


def test_a_bad_probe_option_is_one_line_and_exit_2(tmp_path, capsys):
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump({"data": {"manifest": "m.json"}, "run": {"output": "o"}}))
    assert main(["probe", str(config), "--max-memory", "lots"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: probe.max_memory") and "\n" not in err


@pytest.mark.parametrize("ladder", [[], [0, -4], [8, 0]])
def test_an_empty_or_non_positive_ladder_is_one_line(ladder):
    tree = {"data": {"manifest": "m"}, "run": {"output": "o"}, "probe": {"batch_sizes": ladder}}
    with pytest.raises(ConfigError) as err:
        validate(TrainConfig, tree)
    assert str(err.value).startswith("probe.batch_sizes") and "\n" not in str(err.value)


def rung(batch: int, step_s: float, peak_gib: float) -> dict:
    peak = int(peak_gib * 2**30)
    return {"batch_size": batch, "status": "ok", "step_s": step_s, "peak_memory_bytes": peak}


def test_the_sizing_arithmetic():
    """ViT-B-32-like numbers: 256 fits a 80 GiB device with 10% headroom, 512 does not."""
    ladder = [rung(128, 0.1, 20), rung(256, 0.2, 40), rung(512, 0.4, 75)]
    ladder += [{"batch_size": 1024, "status": "oom", "error": "out of memory"}]
    for r in ladder[:3]:
        r["samples_per_s"] = r["batch_size"] / r["step_s"]
    loader = {"samples_per_s_per_worker": 250.0, "samples_per_s_per_core": 200.0}
    probe = ProbeConfig(target_global_batch=4096, loader_margin=0.2)
    advice = recommend(ladder, loader, 80 * 2**30, probe, cores_per_device=4)
    assert advice["max_batch_size_per_gpu"] == 256 and advice["gpus"] == 16
    assert advice["batch_size_per_gpu"] == 256 and advice["global_batch"] == 4096
    assert advice["samples_per_s_per_gpu"] == pytest.approx(1280)
    assert advice["workers_per_gpu"] == math.ceil(1280 * 1.2 / 250)  # 7
    assert advice["cpu_cores_per_gpu"] == math.ceil(1280 * 1.2 / 200) + 1  # 9
    # 4 cores per GPU here: 3 of them feed 600 samples/s of the 1280 the GPU takes
    assert advice["this_machine"]["expected_data_wait_frac"] == pytest.approx(1 - 600 / 1280)
    by_rate = recommend(ladder, loader, 80 * 2**30, ProbeConfig(target_samples_per_s=5000), 8)
    assert by_rate["gpus"] == 4 and by_rate["batch_size_per_gpu"] == 256
    uneven = recommend(ladder, loader, 80 * 2**30, ProbeConfig(target_global_batch=1000), 8)
    assert uneven["gpus"] == 4 and uneven["batch_size_per_gpu"] == 250
    assert step_time(ladder, 250) == pytest.approx(0.1 + 0.1 * 122 / 128)
    assert recommend(ladder, loader, 2**30, probe, 8)["batch_size_per_gpu"] is None


def test_probe_is_routed_like_train_and_eval(capsys):
    assert Path(__file__).resolve().parents[2].joinpath("trainer", "probe", "run.py").is_file()
    assert main(["probe", "--help"]) == 0  # probe's own parser: its help, not a stub
    assert "--target-global-batch" in capsys.readouterr().out


def test_probe_out_that_is_a_directory_is_refused_before_probing(tmp_path, capsys):
    """Bug: probe measured for minutes, then crashed writing --out into a folder."""
    config = tmp_path / "train.yaml"
    tree = {
        "data": {"manifest": str(tmp_path / "none.json")},
        "model": {"name": "mmcurate-tiny"},
        "run": {"output": str(tmp_path / "run")},
    }
    config.write_text(yaml.safe_dump(tree))
    assert main(["probe", str(config), "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith(f"error: --out {tmp_path}: is a directory")

"""`mmcurate demo` end to end (smaller than the default, same code path)."""

import json

import pytest

from pipeline.demo import run_demo


@pytest.mark.slow
def test_demo_runs_end_to_end(ray_session, tmp_path, capsys):
    assert run_demo(str(tmp_path / "demo"), samples=120, steps=12) == 0
    printed = capsys.readouterr().out
    assert "manifest.json: format mmcurate/1" in printed
    assert "decode_image" in printed and "decode_error=5" in printed
    assert "duplicate_exact=5" in printed
    assert "<h2>Funnel" in (tmp_path / "demo" / "report.html").read_text()
    lines = (tmp_path / "demo" / "train" / "metrics.jsonl").read_text().splitlines()
    losses = [json.loads(line)["loss"] for line in lines]
    assert losses[-1] < losses[0]
    assert "loss fell" in printed
    assert list((tmp_path / "demo" / "train" / "checkpoints").glob("step-*.pt"))

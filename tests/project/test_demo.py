"""`mmcurate demo` end to end (smaller than the default, same code path), and its report
rendered in headless Chromium."""

import json
from pathlib import Path

import pytest
from mmcurate.pipeline.demo import run_demo

from tests.browser import BROKEN_IMAGES, chromium

# Where the test run leaves its screenshot of the demo's report (gitignored).
SCREENSHOT = Path(__file__).resolve().parents[2] / "test-artifacts" / "demo-report.png"


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
    check_in_chromium(tmp_path / "demo" / "report.html", tmp_path / "chromium")


def check_in_chromium(report: Path, user_data: Path) -> None:
    """Every image loads, the browser logs no error, and a full-page screenshot is saved."""
    browser = chromium(user_data)
    try:
        browser.get(report.as_uri())
        assert browser.title and "mmcurate" in browser.title.lower()
        images = browser.execute_script("return document.images.length")
        assert images >= 8, images  # funnel, histogram, thumbnails, shard sizes, ...
        assert browser.execute_script(BROKEN_IMAGES) == []
        errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        assert errors == []
        height = browser.execute_script("return document.documentElement.scrollHeight")
        browser.set_window_size(1280, min(height, 16000))
        SCREENSHOT.parent.mkdir(exist_ok=True)
        assert browser.save_screenshot(str(SCREENSHOT))
    finally:
        browser.quit()
    assert SCREENSHOT.stat().st_size > 10_000

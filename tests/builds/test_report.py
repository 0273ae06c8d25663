"""report.html: written by every build, every embedded image decodes; `mmcurate report`."""

import base64
import io
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from mmcurate.pipeline.build import run_build
from mmcurate.pipeline.config import BuildConfig
from mmcurate.pipeline.report.charts import bar_chart, histogram
from PIL import Image

REPO = Path(__file__).resolve().parents[2]

SECTIONS = (
    "Summary",
    "Funnel",
    "CLIP scores",
    "Duplicate groups",
    "Kept samples",
    "Dropped samples",
    "Shard sizes",
    "Throughput per stage",
)


def images_in(page: str) -> list[Image.Image]:
    found = []
    for _kind, data in re.findall(r'src="data:image/(png|jpeg);base64,([^"]+)"', page):
        image = Image.open(io.BytesIO(base64.b64decode(data)))
        image.load()
        found.append(image)
    return found


def test_build_writes_a_report_and_the_cli_renders_it_again(ray_session, image_folder, tmp_path):
    folder = image_folder(n=30, seed=8, exact_copies=3, broken=2)
    cfg = BuildConfig.model_validate(
        {
            "source": {"kind": "images", "path": str(folder), "files_per_task": 8},
            "stages": [
                {"name": "decode_image", "resize": {"size": 64}},
                {"name": "caption_filter", "min_words": 1},
                {"name": "exact_dedupe"},
                {
                    "name": "clip_score",
                    "model": "mmcurate-tiny",
                    "pretrained": None,
                    "num_gpus": 0,
                    "min_score": -1.0,
                },
            ],
            "output": {"path": str(tmp_path / "out"), "shard_max_samples": 10},
        }
    )
    run_build(cfg, progress=False)
    page = (tmp_path / "out" / "report.html").read_text()
    for title in SECTIONS:
        assert f"<h2>{title}" in page, title
    images = images_in(page)
    charts = charts_in(page)
    assert len(charts) == 4  # funnel, scores, shard sizes, throughput
    assert len(images) >= 24 + 3 + 2  # kept grid, copies and their kept ones, broken
    assert "decode_error (2)" in page and "not stored" not in page.split("Dropped samples")[0]
    (tmp_path / "out" / "report.html").unlink()
    result = subprocess.run(
        [sys.executable, "-m", "mmcurate", "report", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    again = (tmp_path / "out" / "report.html").read_text()
    assert len(images_in(again)) == len(images) and len(charts_in(again)) == len(charts)


def charts_in(page: str) -> list[ET.Element]:
    """Every inline chart, parsed as XML (a malformed one raises)."""
    return [ET.fromstring(svg) for svg in re.findall(r'<svg class="plot".*?</svg>', page)]


def bars(svg: str) -> list[ET.Element]:
    return ET.fromstring(svg).findall("{http://www.w3.org/2000/svg}rect")


def test_bar_chart_draws_one_bar_per_label_in_proportion():
    svg = bar_chart(["a<b", "b", "c"], [100, 50, 0], "samples")
    rects = bars(svg)
    widths = [float(r.get("width")) for r in rects]
    assert len(rects) == 3 and widths[0] == 2 * widths[1] and widths[2] == 0
    assert "a&lt;b" in svg  # labels are escaped
    assert [float(r.get("y")) for r in rects] == sorted(float(r.get("y")) for r in rects)


def test_histogram_counts_every_finite_value_and_draws_the_marker():
    values = [0.1, 0.2, 0.2, 0.9, float("nan")]
    svg = histogram(values, 4, "score", marker=(0.5, "min_score 0.5"))
    titles = [r.find("{http://www.w3.org/2000/svg}title").text for r in bars(svg)]
    counts = [int(t.rsplit(": ", 1)[1]) for t in titles]
    assert len(counts) == 4 and sum(counts) == 4 and counts[0] == 3  # 0.1-0.3 holds three
    line = ET.fromstring(svg).find("{http://www.w3.org/2000/svg}line[@stroke='red']")
    assert line is not None and "min_score 0.5" in svg
    for empty in ([], [3.0, 3.0]):  # no values, or all equal: a chart, not a crash
        assert len(bars(histogram(empty, 5, "x"))) == 5

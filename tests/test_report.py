"""report.html: written by every build, every embedded image decodes; `mmcurate report`."""

import base64
import io
import re
import subprocess
import sys

from PIL import Image

from pipeline.build import run_build
from pipeline.config import BuildConfig
from tests.test_config import REPO

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
    plots = [i for i in images if i.format == "PNG"]
    assert len(plots) == 4  # funnel, scores, shard sizes, throughput
    assert len(images) - len(plots) >= 24 + 3 + 2  # kept grid, copies and their kept ones, broken
    assert "decode_error (2)" in page and "not stored" not in page.split("Dropped samples")[0]
    (tmp_path / "out" / "report.html").unlink()
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "report", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    again = (tmp_path / "out" / "report.html").read_text()
    assert len(images_in(again)) == len(images)

"""keep_top_fraction ranks the samples that reached its stage (issue 45): a per-sample stage
listed after it (aspect_buckets waits for the score it reads, so it runs after the model)
must not shrink the count, and stats.json says what happened in config order."""

from __future__ import annotations

import io
import json
import math

import pyarrow.parquet as pq
import pytest
from mmcurate.pipeline.build import run_build
from mmcurate.pipeline.config import BuildConfig
from PIL import Image

from tests.kit_aesthetic import TINY, random_head, save_head
from tests.shapes import make_shapes, write_folder

SAMPLES, SMALL = 21, {1, 4, 7, 10, 13, 16, 19}  # the small ones: aspect_buckets drops them


def shrunk(jpg: bytes) -> bytes:
    out = io.BytesIO()
    Image.open(io.BytesIO(jpg)).resize((32, 32)).save(out, "JPEG", quality=90)
    return out.getvalue()


@pytest.mark.parametrize("stage", ["aesthetic_score", "clip_score"])
def test_fraction_counts_the_samples_that_reached_it(tmp_path, stage):
    samples = make_shapes(SAMPLES, seed=3)
    for i in SMALL:
        samples[i]["jpg"] = shrunk(samples[i]["jpg"])
    folder = write_folder(samples, tmp_path / "in")
    scorer = {"name": stage, **TINY, "keep_top_fraction": 0.5}
    if stage == "aesthetic_score":
        scorer["weights"] = save_head(random_head("mlp"), tmp_path, ".safetensors")
    cfg = BuildConfig.model_validate(
        {
            "source": {"kind": "images", "path": str(folder), "files_per_task": 8},
            "stages": [scorer, {"name": "aspect_buckets", "buckets": ["64x64"], "min_side": 48}],
            "output": {"path": str(tmp_path / "out")},
        }
    )
    manifest = run_build(cfg, progress=False)
    rows = pq.read_table(tmp_path / "out" / "signatures").to_pylist()
    assert len(rows) == SAMPLES and all(r[stage] is not None for r in rows)
    ranked = sorted(rows, key=lambda r: (-r[stage], r["key"]))
    top = math.ceil(0.5 * SAMPLES)  # 11 of the 21 that reached the stage
    small = {f"s3_{i:05d}" for i in SMALL}
    expected = {r["key"] for r in ranked[:top]} - small
    assert 0 < len(expected) < top  # some of the top are small: the check has teeth
    assert {r["key"] for r in rows if r["drop_reason"] is None} == expected
    assert manifest["samples"] == len(expected)
    stats = {
        s["name"]: s for s in json.loads((tmp_path / "out" / "stats.json").read_text())["stages"]
    }
    reason = "below_aesthetic_top_fraction" if stage == "aesthetic_score" else "below_top_fraction"
    assert (stats[stage]["in"], stats[stage]["out"]) == (SAMPLES, top)
    assert stats[stage]["dropped"] == {reason: SAMPLES - top}
    buckets = stats["aspect_buckets"]
    assert (buckets["in"], buckets["out"]) == (top, len(expected))
    assert buckets["dropped"] == {"too_small": top - len(expected)}

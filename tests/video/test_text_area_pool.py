"""text_area with its detector in an actor pool, chosen as for clip_score (`concurrency` CPU
actors here; GPU actors where the cluster has GPUs): the task decodes, an actor runs the same
TextDetector.detect. It must write exactly what the in-task detector writes."""

from __future__ import annotations

import json
import logging

from mmcurate.core.tario import iter_tar_samples
from mmcurate.pipeline.build import run_build
from mmcurate.pipeline.config import BuildConfig
from PIL import Image
from skimage import data

from tests.kit_text_area import jpeg, with_text
from tests.shapes import write_folder


def fields_of(cfg: dict) -> dict[str, tuple]:
    manifest = run_build(BuildConfig.model_validate(cfg), progress=False)
    out = {}
    for shard in manifest["shards"]:
        with open(f"{cfg['output']['path']}/{shard['name']}", "rb") as f:
            for sample in iter_tar_samples(f):
                meta = json.loads(sample["json"])
                out[sample["__key__"]] = (meta["text_area"], meta["text_boxes"])
    return out


def test_pool_writes_what_the_task_writes(ray_session, tmp_path, caplog) -> None:
    bases = [data.astronaut(), data.coffee(), data.chelsea(), data.rocket()]
    samples = []
    for n, base in enumerate(bases):
        picture, _ = with_text(Image.fromarray(base).resize((320, 240)), 18 + 4 * n, 1 + n % 3, n)
        samples.append({"__key__": f"p{n}", "jpg": jpeg(picture), "txt": f"picture {n}"})
    folder = write_folder(samples, tmp_path / "in")
    stage = {"name": "text_area", "short_side": 320, "num_gpus": 0}
    found = {}
    for where, extra in (("task", {}), ("pool", {"concurrency": 1})):
        cfg = {
            "source": {"kind": "images", "path": str(folder), "files_per_task": 2},
            "stages": [stage | extra],
            "output": {"path": str(tmp_path / where)},
        }
        with caplog.at_level(logging.INFO, logger="mmcurate.actors"):
            found[where] = fields_of(cfg)
    assert "text_area: 1 actors, 0 GPU each" in caplog.text  # the pool did run
    assert found["pool"] == found["task"]
    assert sorted(found["task"]) == ["p0", "p1", "p2", "p3"]
    assert all(area > 0.01 for area, _ in found["task"].values())  # text was found

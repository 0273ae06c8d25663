"""clip_split `mode: transnetv2` with the network in an actor pool, chosen as for clip_score
(`concurrency` CPU actors here; GPU actors where the cluster has GPUs): the decoder child scans,
the task feeds the same predictor with windows scored by an actor, the child cuts. It must cut
exactly the clips the in-task path cuts (stages/lib/transnet_pool.py)."""

from __future__ import annotations

import json
import logging

from mmcurate.core.tario import iter_tar_samples
from mmcurate.pipeline.build import run_build
from mmcurate.pipeline.config import BuildConfig

from tests.kit_transnet import edited_video, encode


def clips_of(cfg: dict) -> dict[str, tuple[float, float]]:
    manifest = run_build(BuildConfig.model_validate(cfg), progress=False)
    out = {}
    for shard in manifest["shards"]:
        with open(f"{cfg['output']['path']}/{shard['name']}", "rb") as f:
            for sample in iter_tar_samples(f):
                meta = json.loads(sample["json"])
                out[sample["__key__"]] = (meta["clip_start"], meta["clip_end"])
    return out


def test_pool_cuts_the_same_clips_as_the_task(ray_session, tmp_path, caplog) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "edited.mp4").write_bytes(encode(edited_video()[0]))
    stage = {"name": "clip_split", "mode": "transnetv2", "min_clip_s": 0.5, "num_gpus": 0}
    found = {}
    for where, extra in (("task", {}), ("pool", {"concurrency": 1})):
        cfg = {
            "source": {"kind": "videos", "path": str(folder), "files_per_task": 1},
            "stages": [stage | extra],
            "output": {"path": str(tmp_path / where)},
        }
        with caplog.at_level(logging.INFO, logger="mmcurate.actors"):
            found[where] = clips_of(cfg)
    assert "clip_split: 1 actors, 0 GPU each" in caplog.text  # the pool did run
    assert found["pool"] == found["task"]
    assert sorted(found["task"]) == [f"edited_{i:04d}" for i in range(5)]

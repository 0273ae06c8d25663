"""A build's output does not depend on how phases B and C group the signatures or where their
tasks run: one group in-process (small builds) and many groups in Ray tasks give the same
shards, signatures rows, embeddings and stats."""

import json

import mmcurate.pipeline.build as build_module
import numpy as np
import pyarrow.parquet as pq
from mmcurate.pipeline.build import run_build
from mmcurate.pipeline.config import BuildConfig
from test_dedupe_build import photo_folder

STAGES = [
    {"name": "decode_image", "resize": {"size": 64, "mode": "center_crop"}},
    {"name": "exact_dedupe"},
    {"name": "near_dedupe", "radius": 8},
    {
        "name": "clip_score",
        "model": "mmcurate-tiny",
        "pretrained": None,
        "num_gpus": 0,
        "keep_top_fraction": 0.8,
    },
]


def build(folder, out) -> dict:
    cfg = BuildConfig.model_validate(
        {
            "source": {"kind": "images", "path": str(folder), "files_per_task": 2},
            "stages": STAGES,
            "output": {"path": str(out), "shard_max_samples": 3},
        }
    )
    manifest = run_build(cfg, progress=False)
    rows = pq.read_table(out / "signatures").to_pylist()
    embeddings = sorted((out / "embeddings" / "img_emb").glob("*.npy"))
    meta = pq.read_table(out / "embeddings" / "metadata").to_pylist()
    return {
        "shards": [(e["name"], e["samples"], e["sha256"]) for e in manifest["shards"]],
        "rows": sorted(rows, key=lambda r: r["key"]),
        "stats": [
            s | {"seconds": 0} for s in json.loads((out / "stats.json").read_text())["stages"]
        ],
        "embeddings": np.concatenate([np.load(p) for p in embeddings]),
        "meta": meta,
        "signature_files": sorted(p.name for p in (out / "signatures").iterdir()),
        "files": manifest["files"],
    }


def test_grouping_and_runner_do_not_change_the_output(ray_session, tmp_path, monkeypatch):
    folder = photo_folder(tmp_path)
    one = build(folder, tmp_path / "one")
    monkeypatch.setattr(build_module, "IN_PROCESS_ROWS", 0)  # phases B and C in Ray tasks
    monkeypatch.setattr(build_module, "GROUP_ROWS", 4)  # 12 samples: groups of 2 partitions
    many = build(folder, tmp_path / "many")
    assert one["signature_files"] == ["part-000000.parquet"]
    assert many["signature_files"] == [f"part-{g:06d}.parquet" for g in range(3)]
    for name in ("shards", "rows", "stats", "meta"):
        assert many[name] == one[name], name
    assert np.array_equal(many["embeddings"], one["embeddings"])
    dropped = {r["drop_reason"] for r in one["rows"]}
    assert {"duplicate_exact", "duplicate_near", "below_top_fraction", None} <= dropped
    assert sum(s[1] for s in one["shards"]) == sum(r["drop_reason"] is None for r in one["rows"])
    assert set(many["files"]) >= {f"signatures/part-{g:06d}.parquet" for g in range(3)}

"""`mmcurate remove` on an object store (SeaweedFS S3 on loopback), `--storage-options` JSON:
killed with SIGKILL mid-swap, then run again, it ends as one run would: the removed samples
gone, the other shards byte-identical, the manifest naming what is there."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
from mmcurate.pipeline.build import run_build
from mmcurate.pipeline.config import BuildConfig
from mmcurate.pipeline.maintain.remove import main as remove_main

from tests.kit_remove import tar_samples

REPO = Path(__file__).resolve().parents[2]
CHILD = REPO / "tests" / "remove_kill_child.py"


def read_all(fs, root: str) -> dict[str, bytes]:
    fs.invalidate_cache()  # other processes wrote there since this client listed it
    return {p[len(root) + 1 :]: fs.cat_file(p) for p in fs.find(root)}


def test_remove_on_s3_killed_mid_swap_then_rerun(s3, s3_bucket, image_folder, tmp_path):
    out = f"s3://{s3_bucket}/build"
    cfg = BuildConfig.model_validate(
        {
            "source": {"kind": "images", "path": str(image_folder(n=16, exact_copies=2))},
            "stages": [{"name": "decode_image", "resize": {"size": 64}}, {"name": "exact_dedupe"}],
            "output": {"path": out, "shard_max_samples": 4},
            "storage_options": s3.storage_options,
        }
    )
    run_build(cfg, progress=False)
    fs, root = s3.filesystem(), f"{s3_bucket}/build"
    before = read_all(fs, root)
    table = pq.ParquetFile(fs.open(f"{root}/signatures/part-000000.parquet")).read().to_pylist()
    rows = sorted((r for r in table if r["shard"]), key=lambda r: r["key"])
    removed = {rows[0]["key"], rows[5]["key"]}
    holders = {r["shard"] for r in rows if r["key"] in removed}
    keys = tmp_path / "keys.txt"
    keys.write_text("\n".join(sorted(removed)))
    args = [out, "--keys", str(keys), "--storage-options", json.dumps(s3.storage_options)]
    child = [sys.executable, str(CHILD), "remove_swap:swap", "after", "3", "--", *args]
    assert subprocess.run(child, cwd=REPO, capture_output=True, timeout=120).returncode == -9
    assert remove_main(args) == 0
    after = read_all(fs, root)
    manifest = json.loads(after["manifest.json"])
    assert manifest["samples"] == json.loads(before["manifest.json"])["samples"] - 2
    assert not any(name.startswith("_work") for name in after)
    for entry in manifest["shards"]:
        data = after[entry["name"]]
        assert hashlib.sha256(data).hexdigest() == entry["sha256"]
        if entry["name"] in holders:
            old = tar_samples(before[entry["name"]])
            assert tar_samples(data) == {k: v for k, v in old.items() if k not in removed}
        else:
            assert data == before[entry["name"]]
    (audit,) = after["audit.jsonl"].splitlines()
    assert json.loads(audit)["removed"] == 2

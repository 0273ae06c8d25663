"""Helpers for the `mmcurate remove` tests: a small build of real photos fetched from a
loopback server (so it has urls, sha256, near hashes, embeddings and buckets.json), its
files read back, and checks that removed samples are gone from every output file."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from mmcurate.core.tario import split_member_name
from mmcurate.pipeline.build import run_build
from mmcurate.pipeline.config import BuildConfig
from mmcurate.pipeline.demo_data import make_demo_images

from tests.http_corpus import Corpus

STAGES = [
    {"name": "download", "allow_private_addresses": True, "threads": 4},
    {"name": "decode_image", "resize": {"size": 96}},
    {"name": "exact_dedupe"},
    {"name": "near_dedupe", "radius": 8},
    {"name": "aspect_buckets", "buckets": ["64x64", "64x48", "48x64"]},
    {"name": "clip_score", "model": "mmcurate-tiny", "pretrained": None, "num_gpus": 0},
]


def url_build(root: Path, server: Corpus, n: int = 36) -> tuple[Path, Path]:
    """Demo photos (with exact copies) served on loopback, listed with captions and built;
    returns (the photo folder, the output folder)."""
    photos = root / "photos"
    make_demo_images(photos, n=n, exact_copies=3, broken=0, seed=4)
    urls, captions = [], []
    for image in sorted(p for p in photos.iterdir() if p.suffix in (".jpg", ".png")):
        urls.append(server.serve(f"/img/{image.name}", image.read_bytes()))
        captions.append(image.with_suffix(".txt").read_text())
    listing = root / "urls.parquet"
    pq.write_table(pa.table({"url": urls, "caption": captions}), listing)
    out = root / "built"
    run_build(build_config(listing, out), progress=False)
    return photos, out


def build_config(listing: Path, out: Path, **output: object) -> BuildConfig:
    return BuildConfig.model_validate(
        {
            "source": {"kind": "urls", "path": str(listing), "files_per_task": 20},
            "stages": STAGES,
            "output": {"path": str(out), "shard_max_samples": 8, **output},
        }
    )


def copy_build(built: Path, to: Path) -> Path:
    shutil.copytree(built, to)
    return to


def files(out: Path) -> dict[str, bytes]:
    """Every file under the output folder, by relative name."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def comparable(out: Path) -> dict[str, object]:
    """The files, with what legitimately differs between two copies of one build made apart
    blanked: the folder's own path in report.html and the audit's `when` (planning time)."""
    found: dict[str, object] = {}
    for rel, data in files(out).items():
        if rel == "report.html":
            data = data.replace(str(out).encode(), b"OUT")
        if rel == "audit.jsonl":
            data = [{**json.loads(line), "when": None} for line in data.splitlines()]
        found[rel] = data
    return found


def signatures(out: Path) -> list[dict]:
    return pq.read_table(out / "signatures").to_pylist()


def kept_rows(out: Path) -> list[dict]:
    return [r for r in signatures(out) if r["shard"]]


def tar_samples(data: bytes) -> dict[str, dict[str, bytes]]:
    """key -> {member extension: bytes}, read with tarfile."""
    found: dict[str, dict[str, bytes]] = {}
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar:
            key, ext = split_member_name(member.name)
            found.setdefault(key, {})[ext] = tar.extractfile(member).read()
    return found


def check_removed(before: Path, after: Path, removed: set[str], summary: dict) -> None:
    """`removed` gone from every output file of `after`, everything else as in `before`."""
    old, new = files(before), files(after)
    manifest = json.loads(new["manifest.json"])
    holders = {r["shard"] for r in kept_rows(before) if r["key"] in removed}
    assert set(summary["shards_rewritten"]) | set(summary["shards_deleted"]) == holders
    for entry in manifest["shards"]:
        data = new[entry["name"]]
        assert hashlib.sha256(data).hexdigest() == entry["sha256"] and len(data) == entry["bytes"]
        if entry["name"] not in holders:
            assert data == old[entry["name"]]  # untouched shards: byte-identical
            assert new[entry["name"][:-4] + ".parquet"] == old[entry["name"][:-4] + ".parquet"]
            continue
        was = tar_samples(old[entry["name"]])
        assert tar_samples(data) == {k: v for k, v in was.items() if k not in removed}
    assert manifest["samples"] == sum(e["samples"] for e in manifest["shards"])
    assert manifest["samples"] == json.loads(old["manifest.json"])["samples"] - len(removed)
    check_tables(after, manifest, removed)
    urls = [r["url"].encode() for r in signatures(before) if r["key"] in removed]
    for rel, data in new.items():  # no removed sample's url in any file (keys are numbers)
        assert not any(url in data for url in urls), rel


def check_tables(out: Path, manifest: dict, removed: set[str]) -> None:
    """Shard parquets, signatures, embeddings, shard index, buckets and stats agree."""
    keys = {r["key"] for r in kept_rows(out)}
    for entry in manifest["shards"]:
        rows = pq.read_table(out / entry["name"].replace(".tar", ".parquet"))["key"].to_pylist()
        assert len(rows) == entry["samples"] and not set(rows) & removed
    assert not keys & removed and len(keys) == manifest["samples"]
    meta = pq.read_table(out / "embeddings" / "metadata")["key"].to_pylist()
    arrays = np.concatenate([np.load(p) for p in sorted((out / "embeddings/img_emb").iterdir())])
    assert len(arrays) == len(meta) and set(meta) == keys
    index = json.loads((out / "shardindex.json").read_text())
    assert [(s["url"], s["nsamples"]) for s in index["shardlist"]] == [
        (e["name"], e["samples"]) for e in manifest["shards"]
    ]
    buckets = json.loads((out / "buckets.json").read_text())
    assert buckets["samples"] == sum(buckets["counts"].values()) == manifest["samples"]
    stats = json.loads((out / "stats.json").read_text())
    assert stats["samples_out"] == stats["stages"][-1]["out"] == manifest["samples"]
    assert stats["stages"][-1]["name"] == "remove"

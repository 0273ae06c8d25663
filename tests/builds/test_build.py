"""End-to-end builds on the session Ray, to local folders and to SeaweedFS S3."""

import glob
import hashlib
import io
import json
import tarfile

import fsspec
import pyarrow.parquet as pq
import pytest
import ray
import webdataset as wds
from mmcurate.core.config_io import ConfigError
from mmcurate.pipeline.build import run_build
from mmcurate.pipeline.config import BuildConfig
from pyarrow.fs import FSSpecHandler, PyFileSystem

ALL_IMAGE_STAGES = [
    {"name": "decode_image", "resize": {"size": 64, "mode": "center_crop"}},
    {"name": "caption_filter", "min_words": 1},
    {"name": "exact_dedupe"},
]


def config(source, output, kind="images", storage_options=None, **output_opts) -> BuildConfig:
    return BuildConfig.model_validate(
        {
            "source": {"kind": kind, "path": str(source), "files_per_task": 64},
            "stages": ALL_IMAGE_STAGES,
            "output": {"path": str(output), **output_opts},
            "storage_options": storage_options or {},
        }
    )


def read_json(fs, path):
    return json.loads(fs.cat(path))


def shard_members(data: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return tar.getnames()


@pytest.mark.slow
def test_thousand_images_to_s3(ray_session, s3, s3_bucket, image_folder):
    folder = image_folder(n=980, exact_copies=10, broken=10, seed=1)
    out = f"s3://{s3_bucket}/build"
    manifest = run_build(
        config(folder, out, storage_options=s3.storage_options, shard_max_samples=300),
        progress=False,
    )
    fs = s3.filesystem()
    assert manifest["samples"] == 980  # distinct decodable samples
    assert [s["samples"] for s in manifest["shards"]] == [300, 300, 300, 80]
    stats = read_json(fs, f"{s3_bucket}/build/stats.json")
    by_name = {s["name"]: s for s in stats["stages"]}
    assert stats["samples_in"] == 1000 and stats["samples_out"] == 980
    assert by_name["decode_image"]["dropped"] == {"decode_error": 10}
    assert by_name["exact_dedupe"]["dropped"] == {"duplicate_exact": 10}
    for before, after in zip(stats["stages"], stats["stages"][1:], strict=False):
        assert after["in"] == before["out"]
        assert before["in"] - before["out"] == sum(before["dropped"].values())
    keys = []
    for shard in manifest["shards"]:
        data = fs.cat(f"{s3_bucket}/build/{shard['name']}")
        assert hashlib.sha256(data).hexdigest() == shard["sha256"]
        assert len(data) == shard["bytes"]
        keys += sorted({m.split(".")[0] for m in shard_members(data)})
    assert len(keys) == len(set(keys)) == 980
    assert not fs.exists(f"{s3_bucket}/build/_work")  # scratch space is cleaned up
    index = read_json(fs, f"{s3_bucket}/build/shardindex.json")  # for webdataset's wids
    assert index["__kind__"] == "wids-shard-index-v1"
    assert [(s["url"], s["nsamples"]) for s in index["shardlist"]] == [
        (s["name"], s["samples"]) for s in manifest["shards"]
    ]
    assert s3.storage_options["secret"] not in json.dumps(manifest)


def test_shards_load_in_webdataset_and_ray(ray_session, s3, s3_bucket, tar_shards, tmp_path):
    source = tar_shards(n_shards=3, per_shard=8, seed=2)
    inputs = {}
    for tar_path in sorted(source.glob("*.tar")):
        for sample in wds.WebDataset(str(tar_path), shardshuffle=False):
            inputs[sample["__key__"]] = sample["txt"].decode()
    local = tmp_path / "out"
    run_build(
        config(f"{source}/*.tar", local, kind="webdataset", shard_max_samples=10), progress=False
    )
    urls = sorted(glob.glob(f"{local}/shard-*.tar"))
    assert len(urls) == 3
    loaded = {
        k: t
        for k, _, t in wds.WebDataset(urls, shardshuffle=False)
        .decode("pil")
        .to_tuple("__key__", "jpg", "txt")
    }
    assert loaded == inputs  # keys and captions survive the build unchanged
    metas = {s["__key__"]: json.loads(s["json"]) for s in wds.WebDataset(urls, shardshuffle=False)}
    for tar_path in sorted(source.glob("*.tar")):  # so do img2dataset-style JSON fields
        for sample in wds.WebDataset(str(tar_path), shardshuffle=False):
            before = json.loads(sample["json"])
            after = metas[sample["__key__"]]
            kept = {k: v for k, v in before.items() if k not in ("width", "height")}
            assert kept.items() <= after.items()
            assert after["original_width"] == before.get("original_width", after["original_width"])
    rows = ray.data.read_webdataset(urls).take_all()
    assert sorted(r["__key__"] for r in rows) == sorted(inputs)

    remote = f"s3://{s3_bucket}/wds"
    run_build(
        config(f"{source}/*.tar", remote, kind="webdataset", storage_options=s3.storage_options),
        progress=False,
    )
    s3fs = fsspec.filesystem("s3", **s3.storage_options)
    arrow_fs = PyFileSystem(FSSpecHandler(s3fs))
    rows = ray.data.read_webdataset(
        f"{s3_bucket}/wds/shard-000000.tar", filesystem=arrow_fs
    ).take_all()
    assert {r["__key__"]: r["txt"] for r in rows} == inputs


def test_exact_duplicates_in_different_tasks(ray_session, image_folder, tmp_path):
    folder = image_folder(n=30, seed=3)
    original = sorted(folder.glob("*.jpg"))[0]
    for name in ("aaa_first", "zzz_last"):  # far apart in sorted order: other partitions
        (folder / f"{name}.jpg").write_bytes(original.read_bytes())
        (folder / f"{name}.txt").write_text("the same photo again")
    cfg = BuildConfig.model_validate(
        {
            "source": {"kind": "images", "path": str(folder), "files_per_task": 4},
            "stages": [{"name": "exact_dedupe"}],
            "output": {"path": str(tmp_path / "out")},
        }
    )
    manifest = run_build(cfg, progress=False)
    assert manifest["samples"] == 30
    table = pq.read_table(tmp_path / "out" / "signatures").to_pylist()
    dropped = {r["key"]: r["duplicate_of"] for r in table if r["drop_reason"]}
    assert dropped == {original.stem: "aaa_first", "zzz_last": "aaa_first"}


def test_rerun_is_identical_and_needs_overwrite(ray_session, image_folder, tmp_path):
    folder = image_folder(n=40, seed=4, exact_copies=3, broken=2)
    out = tmp_path / "out"
    first = run_build(config(folder, out, shard_max_samples=16), progress=False)
    assert run_build(config(folder, out, shard_max_samples=16), progress=False) == first  # no-op
    with pytest.raises(ConfigError, match="already holds a different build; pass --overwrite"):
        run_build(config(folder, out), progress=False)
    second = run_build(config(folder, out, shard_max_samples=16, overwrite=True), progress=False)
    assert first["shards"] == second["shards"]  # same names, counts, bytes and sha256
    assert sorted(p.name for p in out.glob("shard-*.tar")) == [s["name"] for s in first["shards"]]


def test_webdataset_from_s3_keeps_keys_unique(ray_session, s3, s3_bucket, tar_shards, tmp_path):
    source = tar_shards(n_shards=2, per_shard=6, seed=5)
    fs = s3.filesystem()
    for copy in ("a", "b"):  # the same shards twice: every key appears in two partitions
        for tar_path in sorted(source.glob("*.tar")):
            fs.put_file(str(tar_path), f"{s3_bucket}/in/{copy}/{tar_path.name}")
    cfg = BuildConfig.model_validate(
        {
            "source": {"kind": "webdataset", "path": f"s3://{s3_bucket}/in/*/*.tar"},
            "stages": [{"name": "decode_image", "resize": {"size": 32}}],
            "output": {"path": str(tmp_path / "out")},
            "storage_options": s3.storage_options,
        }
    )
    manifest = run_build(cfg, progress=False)
    assert manifest["samples"] == 12
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert stats["stages"][0] == {
        "name": "source",
        "in": 24,
        "out": 12,
        "dropped": {"duplicate_key": 12},
        "seconds": 0.0,
    }
    keys = [
        s["__key__"]
        for s in wds.WebDataset(
            sorted(glob.glob(str(tmp_path / "out" / "shard-*.tar"))), shardshuffle=False
        )
    ]
    assert len(keys) == len(set(keys)) == 12

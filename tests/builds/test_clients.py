"""A build's output read by the clients users read it with: webdataset, wids (through the
build's shardindex.json), Ray Data, our own readers; its parquet files by pyarrow and duckdb.
The sources have long, dotted, slashed and non-ASCII names, and json fields whose types differ
from shard to shard."""

from __future__ import annotations

import json
import os
import tarfile
from functools import partial
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
import ray.data
import torch
import webdataset as wds
import wids
from mmcurate.core.tario import CLEAN_KEY, KEY_MAX_BYTES, iter_tar_samples
from mmcurate.pipeline.build import run_build
from mmcurate.pipeline.config import BuildConfig
from mmcurate.trainer.config import TrainConfig
from mmcurate.trainer.data.dataset import ImageTransform, ShardDataset, make_loader
from mmcurate.trainer.data.manifest import read_manifest
from mmcurate.trainer.models import build_model
from wids.wids_decode import default_decoder

from tests.kit_keys import jpeg, make_awkward_folder, raw_headers, write_input_tar

TAR_KEYS = [
    "dir.x/k",
    "dir_x/k",
    "../../a",
    "./.x/y",
    "a.b.c/d e",  # WebDataset: a key ends at the first dot of the file name, not the folder
    "x" * 150,
    "写真/草 花",
    "Ω" * 60,
    "plain",
]


def build(source: Path, out: Path, kind: str) -> dict:
    cfg = BuildConfig.model_validate(
        {
            "source": {"kind": kind, "path": str(source), "files_per_task": 4},
            "stages": [{"name": "decode_image", "resize": {"size": 16, "mode": "center_crop"}}],
            "output": {"path": str(out), "shard_max_samples": 3},
        }
    )
    return run_build(cfg, progress=False)


def tar_meta(i: int) -> dict:
    """JSON whose fields change type between output shards (3 samples each)."""
    meta = {"n": i, "extra": None if i < 3 else i, "mixed": 1 if i < 3 else "one"}
    return meta | ({"late": True} if i >= 6 else {})


def make_tar_source(folder: Path) -> Path:
    folder.mkdir()
    members = []
    for i, key in enumerate(TAR_KEYS):
        meta = json.dumps(tar_meta(i)).encode()
        members += [(f"{key}.jpg", jpeg()), (f"{key}.txt", key.encode()), (f"{key}.json", meta)]
    write_input_tar(folder / "a.tar", members, format=tarfile.PAX_FORMAT)
    latin = [("caf\xe9.jpg", jpeg()), ("caf\xe9.txt", b"latin-1 name")]
    write_input_tar(folder / "b.tar", latin, format=tarfile.GNU_FORMAT, encoding="latin-1")
    return folder


@pytest.fixture(scope="module")
def builds(ray_session, tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    root = tmp_path_factory.mktemp("clients")
    images = root / "images"
    images.mkdir()
    make_awkward_folder(images)
    (images / "p.q").mkdir()
    (images / "p.q" / (".." + "é" * 70 + ".jpg")).write_bytes(jpeg("blue"))
    (images / "p.q" / (".." + "é" * 70 + ".txt")).write_text("dots and accents")
    with open(os.path.join(os.fsencode(images), b"caf\xe9.jpg"), "wb") as f:
        f.write(jpeg("green"))  # a local name that is not UTF-8
    with open(os.path.join(os.fsencode(images), b"caf\xe9.txt"), "wb") as f:
        f.write(b"latin-1 file name")
    tars = make_tar_source(root / "tars")
    return {
        "images": (root / "out-images", build(images, root / "out-images", "images")),
        "webdataset": (root / "out-wds", build(f"{tars}/*.tar", root / "out-wds", "webdataset")),
    }


EXPECTED = {"images": 14, "webdataset": len(TAR_KEYS) + 1}


def shard_paths(out: Path, manifest: dict) -> list[str]:
    return [str(out / shard["name"]) for shard in manifest["shards"]]


def own_reader(out: Path, manifest: dict) -> dict[str, dict]:
    samples = {}
    for path in shard_paths(out, manifest):
        with open(path, "rb") as f:
            samples.update({s["__key__"]: s for s in iter_tar_samples(f)})
    return samples


@pytest.mark.parametrize("name", ["images", "webdataset"])
def test_our_reader_gets_every_sample_whole_and_no_pax_headers(builds, name):
    out, manifest = builds[name]
    assert manifest["samples"] == EXPECTED[name] and len(manifest["shards"]) > 1
    samples = own_reader(out, manifest)
    assert len(samples) == EXPECTED[name]
    for key, sample in samples.items():
        assert CLEAN_KEY.fullmatch(key) and len(key) <= KEY_MAX_BYTES
        assert {"jpg", "txt", "json"} <= set(sample)
    for path in shard_paths(out, manifest):
        assert {flag for _, flag in raw_headers(Path(path).read_bytes())} == {b"0"}


def test_webdataset_source_keeps_the_tar_key_and_captions(builds):
    out, manifest = builds["webdataset"]
    samples = own_reader(out, manifest)
    members = {json.loads(s["json"]).get("source_member"): s for s in samples.values()}
    for i, key in enumerate(TAR_KEYS[:-1]):
        assert members[key]["txt"].decode() == key
        assert tar_meta(i).items() <= json.loads(members[key]["json"]).items()
    assert samples["plain"]["txt"] == b"plain"
    assert members["caf\\udce9"]["txt"] == b"latin-1 name"


@pytest.mark.parametrize("name", ["images", "webdataset"])
def test_webdataset_reads_every_sample(builds, name):
    out, manifest = builds[name]
    got = list(wds.WebDataset(shard_paths(out, manifest), shardshuffle=False))
    assert len(got) == EXPECTED[name]
    assert {s["__key__"] for s in got} == set(own_reader(out, manifest))
    assert all({"jpg", "txt", "json"} <= set(s) for s in got)
    assert all(isinstance(json.loads(s["json"]), dict) for s in got)


@pytest.mark.parametrize("name", ["images", "webdataset"])
def test_wids_reads_every_sample_through_the_shard_index(builds, name, tmp_path):
    out, manifest = builds[name]
    index = str(out / "shardindex.json")
    pil = partial(default_decoder, format="PIL")
    dataset = wids.ShardListDataset(index, cache_dir=str(tmp_path), transformations=[pil])
    assert len(dataset) == EXPECTED[name]
    got = [dataset[i] for i in range(len(dataset))]
    assert {s["__key__"] for s in got} == set(own_reader(out, manifest))
    for sample in got:
        assert {".jpg", ".txt", ".json"} <= set(sample)
        assert sample[".jpg"].size == (16, 16)  # decoded: the member is the whole image


@pytest.mark.parametrize("name", ["images", "webdataset"])
def test_ray_data_reads_the_output_folder_as_the_readme_shows(builds, name):
    out, manifest = builds[name]
    rows = ray.data.read_webdataset(str(out), file_extensions=["tar"]).take_all()
    assert len(rows) == EXPECTED[name]
    assert {r["__key__"] for r in rows} == set(own_reader(out, manifest))
    for row in rows:
        assert row["jpg"].shape == (16, 16, 3) and row["txt"] and isinstance(row["json"], dict)


@pytest.mark.parametrize("name", ["images", "webdataset"])
def test_the_trainer_reads_every_sample(builds, name):
    out, manifest = builds[name]
    cfg = TrainConfig.model_validate({"data": {"manifest": "x"}, "run": {"output": "x"}})
    _, preprocess, tokenizer = build_model(cfg.model, torch.device("cpu"))
    dataset = ShardDataset(
        read_manifest(str(out / "manifest.json")), ImageTransform(preprocess), tokenizer, 1
    )
    keys = [key for batch in make_loader(dataset, workers=0) for key in batch.keys]
    assert sorted(keys) == sorted(own_reader(out, manifest))
    assert dataset.counters.substituted == 0  # every sample had its image and caption


@pytest.mark.parametrize("name", ["images", "webdataset"])
def test_shard_parquet_files_read_as_one_table(builds, name):
    out, manifest = builds[name]
    files = sorted(str(p) for p in out.glob("shard-*.parquet"))
    assert len(files) == len(manifest["shards"]) > 1
    table = ds.dataset(files, format="parquet").to_table()
    assert sorted(table["key"].to_pylist()) == sorted(own_reader(out, manifest))
    by_duckdb = duckdb.sql(f"SELECT * FROM read_parquet({files!r})")
    assert by_duckdb.columns == table.column_names and len(by_duckdb.fetchall()) == table.num_rows
    assert table.schema.field("width").type == pa.int64()
    if name == "webdataset":
        assert table.schema.field("extra").type == pa.int64()  # null in the whole first shard
        assert table.schema.field("late").type == pa.bool_()  # absent from the first shard
        assert table.schema.field("mixed").type == pa.string()  # 1 and "one": JSON text
        rows = {r["n"]: r for r in table.to_pylist() if r["n"] is not None}
        assert rows[0]["mixed"] == "1" and rows[4]["mixed"] == '"one"'
        assert rows[7]["late"] is True and rows[0]["late"] is None

"""Partitions are typed, immutable records (pipeline/sources/records.py), one source object per
kind plans and reads them (pipeline/sources/partitions.py), and the build identity is the one
the plain-dict plans had: a build started before records resumes after them."""

import dataclasses
import pickle

import pytest
from mmcurate.pipeline.output.claim import build_identity
from mmcurate.pipeline.sources.partitions import SOURCES, plan_source, read_partition
from mmcurate.pipeline.sources.records import (
    FolderPartition,
    Partition,
    TarPartition,
    UrlPartition,
    VideoListPartition,
)
from mmcurate.pipeline.sources.staging import stage_sources

from tests.kit_sources import pin_config, rows, write_pin_inputs

# Computed with the code before partition records (commit 5f208f3, plain-dict plans hashed by
# build_identity), for the inputs tests/kit_sources.py:write_pin_inputs writes. Do not update
# these to make the test pass: a change here means a resumed build no longer finds its identity.
IDENTITIES_BEFORE_RECORDS = {
    "images": "2c4f4a24f81983a7b0110812d545376e67677e8a2f8bf5e280d9a1c3d81b1fa6",
    "webdataset": "554e6b98c9be690e19f8feda757f9cf2e98be1f7585d12dcd8207b55c26ff594",
    "urls": "890427f48fd810bc42600c59b420d73f5acbb4de45f77cc6b5b0af467aba224b",
    "urls_gz": "84a43c6e30d54ffa4c058e02193feaa331adcdfb6a66a576ddadd5352da361b9",
    "urls_parquet": "ba12a110dc998ac2ca42c1a55bbc69ff32fffc9fee3d333ea151bb806347c6e0",
    "videos": "2e6214a52317628f609d12027e469f8363cdc2c73fe139b9768bcd78bf105bc9",
    "video_glob": "237091d268008ccb7f42c18038d34a14b83d3ba3fa86b354c3a70d1e08b76c2d",
    "video_list": "a3eeb21d7493ff4d6ae5cc1f950e039557ca0204ae1ce94dc4ad8ec8cca0895c",
}
RECORD_OF = {
    "images": FolderPartition,
    "webdataset": TarPartition,
    "urls": UrlPartition,
    "urls_gz": UrlPartition,
    "urls_parquet": UrlPartition,
    "videos": FolderPartition,
    "video_glob": FolderPartition,
    "video_list": VideoListPartition,
}


@pytest.fixture(scope="module")
def pinned() -> dict[str, tuple]:
    return {
        name: (cfg, plan_source(cfg.source, {}))
        for name, cfg in ((n, pin_config(s)) for n, s in write_pin_inputs().items())
    }


def test_the_build_identity_is_the_one_plain_dict_plans_had(pinned):
    got = {name: build_identity(cfg, parts) for name, (cfg, parts) in pinned.items()}
    assert got == IDENTITIES_BEFORE_RECORDS


def test_each_kind_plans_typed_records_that_pickle_and_read_back_from_their_dicts(pinned):
    """Records travel to Ray tasks (pickle) and to an unfinished retry/append's record (their
    dict) and come back equal, so a resumed run plans and hashes the same partitions."""
    for name, (cfg, parts) in pinned.items():
        assert parts and all(type(p) is RECORD_OF[name] for p in parts), name
        assert [p.number for p in parts] == list(range(len(parts)))
        assert pickle.loads(pickle.dumps(parts)) == parts
        dicts = [p.to_dict() for p in parts]
        assert all(
            d["part"] == p.number and "number" not in d for d, p in zip(dicts, parts, strict=True)
        )
        assert [Partition.from_dict(d) for d in dicts] == parts
        assert build_identity(cfg, [Partition.from_dict(d) for d in dicts]) == build_identity(
            cfg, parts
        )
        assert SOURCES[parts[0].source_kind] is SOURCES[cfg.source.kind]


def test_records_are_immutable_and_staging_returns_new_ones(pinned, tmp_path):
    cfg, parts = pinned["urls_gz"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        parts[0].count = 1
    staged = stage_sources(parts, str(tmp_path / "_work"), {})
    assert all(p.staged_url is None for p in parts)  # the planned records are unchanged
    assert all(p.staged_url.startswith(str(tmp_path / "_work")) for p in staged)
    assert [dataclasses.replace(p, staged_url=None) for p in staged] == parts
    got = [r["txt"] for p in staged for r in rows(read_partition(p, {}))]
    assert got == [r["txt"] for p in parts for r in rows(read_partition(p, {}))]
    assert got == [f"c{i}" for i in range(7)]


def test_every_kind_reads_its_records(pinned):
    """One source object per kind reads what it planned: keys and partition numbers."""
    keys = {}
    for name in ("images", "webdataset", "urls", "videos", "video_list"):
        _, parts = pinned[name]
        got = [r for p in parts for r in rows(read_partition(p, {}))]
        assert all(r["__part__"] == p.number for p in parts for r in rows(read_partition(p, {})))
        keys[name] = [r["__key__"] for r in got]
    # each tar's caption member comes last, apart from its image: a second sample (dropped)
    assert keys["webdataset"] == ["s00", "s01", "s02", "s00", "s10", "s11", "s12", "s10"]
    assert keys["urls"] == [f"{i:09d}" for i in range(7)]
    assert keys["video_list"] == ["000000000", "000000001"]
    assert len(keys["images"]) == 6 and len(keys["videos"]) == 4

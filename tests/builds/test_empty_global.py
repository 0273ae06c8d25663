"""Global stages when no row has their column, and builds where no sample survives."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from mmcurate.pipeline.build import run_build
from mmcurate.pipeline.config import BuildConfig
from mmcurate.pipeline.demo_data import BROKEN_KINDS, broken_file, iter_samples, write_tar_shards
from mmcurate.stages.base import DROP, DROP_STAGE
from mmcurate.stages.near_dedupe import original_size
from mmcurate.stages.registry import build_stage

TINY = {"model": "mmcurate-tiny", "pretrained": None, "device": "cpu"}
GLOBAL_STAGES = [
    {"name": "exact_dedupe"},
    {"name": "near_dedupe", "radius": 4},
    {"name": "clip_score", **TINY, "num_gpus": 0, "keep_top_fraction": 0.5},
    {"name": "semantic_dedupe", **TINY, "clusters": 1},
]


def build(source, out, kind, stages, files_per_task=2, batch_size=64) -> dict:
    cfg = BuildConfig.model_validate(
        {
            "source": {"kind": kind, "path": str(source), "files_per_task": files_per_task},
            "stages": stages,
            "output": {"path": str(out)},
            "ray": {"batch_size": batch_size},
        }
    )
    return run_build(cfg, progress=False)


def assert_empty_build(out, manifest, samples_in) -> dict:
    """0 samples, no shards, and every input sample counted once under a drop reason."""
    assert manifest["samples"] == 0 and manifest["shards"] == []
    assert json.loads((out / "manifest.json").read_text()) == manifest
    stats = json.loads((out / "stats.json").read_text())
    assert stats["samples_in"] == samples_in and stats["samples_out"] == 0
    assert sum(n for s in stats["stages"] for n in s["dropped"].values()) == samples_in
    for stage in stats["stages"]:
        assert stage["in"] - stage["out"] == sum(stage["dropped"].values())
    rows = pq.read_table(out / "signatures").to_pylist()
    assert len(rows) == samples_in and all(r["drop_reason"] for r in rows)
    assert not (out / "_work").exists()
    return stats


def unreadable_tars(folder) -> None:
    """Files named .tar that no tar reader accepts: noise, text, a cut-off real shard."""
    folder.mkdir()
    (folder / "a-noise.tar").write_bytes(bytes(range(256)) * 9)
    (folder / "b-text.tar").write_text("this is a caption file, not a tar archive\n" * 40)
    real = folder.parent / "real"
    write_tar_shards(real, n_shards=1, per_shard=4, seed=1)
    data = next(real.glob("*.tar")).read_bytes()
    (folder / "c-cut.tar").write_bytes(data[:700])  # the first header, then half a member
    (folder / "d-empty.tar").write_bytes(b"")


def test_only_unreadable_tars_with_every_global_stage(ray_session, tmp_path):
    unreadable_tars(tmp_path / "tars")
    out = tmp_path / "out"
    manifest = build(f"{tmp_path / 'tars'}/*.tar", out, "webdataset", GLOBAL_STAGES)
    rows = pq.read_table(out / "signatures").num_rows  # an empty tar may hold no sample at all
    assert rows >= 3
    stats = assert_empty_build(out, manifest, samples_in=rows)
    source = stats["stages"][0]
    assert source["name"] == "source" and source["in"] == rows and source["out"] == 0
    assert all(reason.startswith("corrupt_tar") for reason in source["dropped"])
    names = [s["name"] for s in stats["stages"]]
    assert names == ["source", "exact_dedupe", "near_dedupe", "clip_score", "semantic_dedupe"]


def test_image_folder_of_only_broken_files(ray_session, tmp_path):
    import numpy as np

    folder = tmp_path / "broken"
    folder.mkdir()
    good = next(iter_samples(1, seed=2)).data
    rng = np.random.default_rng(0)
    for i, kind in enumerate(BROKEN_KINDS):
        ext, data = broken_file(kind, good, rng)
        (folder / f"b{i}.{ext}").write_bytes(data)
        (folder / f"b{i}.txt").write_text("a photo that will not decode")
    out = tmp_path / "out"
    stages = [{"name": "decode_image", "resize": {"size": 32}}, *GLOBAL_STAGES]
    manifest = build(folder, out, "images", stages)
    stats = assert_empty_build(out, manifest, samples_in=len(BROKEN_KINDS))
    by_name = {s["name"]: s for s in stats["stages"]}
    dropped = by_name["source"]["dropped"] | by_name["decode_image"]["dropped"]
    assert sum(dropped.values()) == len(BROKEN_KINDS)  # all before any global stage ran
    for name in ("exact_dedupe", "near_dedupe", "clip_score", "semantic_dedupe"):
        assert by_name[name]["in"] == by_name[name]["out"] == 0


def test_a_filter_that_drops_everything_before_global_stages(ray_session, tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    for sample in iter_samples(6, seed=3):
        (folder / f"{sample.key}.{sample.ext}").write_bytes(sample.data)
        (folder / f"{sample.key}.txt").write_text("two words")
    out = tmp_path / "out"
    stages = [{"name": "caption_filter", "min_words": 5}, *GLOBAL_STAGES]
    stats = assert_empty_build(out, build(folder, out, "images", stages), samples_in=6)
    assert stats["stages"][1]["name"] == "caption_filter"
    assert sum(stats["stages"][1]["dropped"].values()) == 6


def test_partition_whose_first_chunk_is_all_bad_keeps_later_columns(ray_session, tmp_path):
    """A chunk of only dropped samples has no sha256 column; the partition's later chunks do,
    and their duplicates must still be found."""
    folder = tmp_path / "mixed"
    folder.mkdir()
    for i in range(2):  # sorted first: the whole first chunk (batch_size 2) fails to decode
        (folder / f"a{i}.jpg").write_bytes(b"not an image")
        (folder / f"a{i}.txt").write_text("broken")
    samples = list(iter_samples(3, seed=4))
    for sample in samples:
        (folder / f"m_{sample.key}.{sample.ext}").write_bytes(sample.data)
        (folder / f"m_{sample.key}.txt").write_text("a photo")
    copy = samples[0]
    (folder / f"z_copy.{copy.ext}").write_bytes(copy.data)
    (folder / "z_copy.txt").write_text("the same photo")
    out = tmp_path / "out"
    stages = [{"name": "decode_image", "resize": {"size": 32}}, {"name": "exact_dedupe"}]
    manifest = build(folder, out, "images", stages, files_per_task=100, batch_size=2)
    assert manifest["samples"] == 3
    rows = {r["key"]: r for r in pq.read_table(out / "signatures").to_pylist()}
    assert rows["z_copy"]["drop_reason"] == "duplicate_exact"
    assert rows["z_copy"]["duplicate_of"] == f"m_{copy.key}"


def signatures_without(columns: dict, n: int = 3, dropped: bool = True) -> pa.Table:
    base = {
        "__key__": [f"k{i}" for i in range(n)],
        DROP: ["corrupt_tar" if dropped else None] * n,
        DROP_STAGE: ["source" if dropped else None] * n,
    }
    return pa.table({**base, **columns})


@pytest.mark.parametrize("stage", GLOBAL_STAGES, ids=lambda s: s["name"])
def test_decide_without_its_column_or_live_rows(stage):
    stage = build_stage(stage)
    assert stage.decide(signatures_without({})) == {}  # the column is missing altogether
    assert stage.decide(signatures_without({}, n=0, dropped=False)) == {}  # no rows at all
    nulls = {c: pa.nulls(3) for c in ("sha256", "phash", "clip_score", "embedding")}
    assert stage.decide(signatures_without(nulls, dropped=False)) == {}  # live, but never set


def test_bad_json_never_breaks_near_dedupe_or_clip_score():
    from mmcurate.core.formats import with_fields

    metas = [None, "{not json", "[1, 2]", '{"original_width": "x", "original_height": 3}']
    metas += ['{"original_width": 1e400, "original_height": 2}', '{"original_width": -4}']
    metas += ['{"original_width": 640, "original_height": 480}']
    sizes = [original_size(metas, row, (32, 24)) for row in range(len(metas))]
    assert sizes == [(32, 24)] * 6 + [(640, 480)]
    for text in metas:
        assert json.loads(with_fields(text, {"clip_score": 0.25}))["clip_score"] == 0.25


def test_tars_holding_no_sample_at_all(ray_session, tmp_path):
    import tarfile

    folder = tmp_path / "empty"
    folder.mkdir()
    with tarfile.open(folder / "a.tar", "w"):
        pass  # a valid tar with no members
    (folder / "b.tar").write_bytes(b"\0" * 1024)  # two zero blocks: the end-of-archive mark
    out = tmp_path / "out"
    manifest = build(f"{folder}/*.tar", out, "webdataset", GLOBAL_STAGES[:3])
    rows = pq.read_table(out / "signatures").num_rows
    stats = assert_empty_build(out, manifest, samples_in=rows)
    assert rows == 0 and stats["stages"][0]["in"] == 0

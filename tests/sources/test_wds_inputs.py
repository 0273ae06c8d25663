"""WebDataset inputs: a tar changed in place is another input, and members that are links are
counted, never lost without a trace."""

import io
import json
import os
import tarfile

import pytest
import webdataset as wds
from mmcurate.core.config_io import ConfigError
from mmcurate.core.tario import iter_tar_samples
from mmcurate.pipeline.build import run_build
from mmcurate.pipeline.config import BuildConfig, SourceConfig
from mmcurate.pipeline.output.claim import build_identity, claim_output
from mmcurate.pipeline.sources.partitions import plan_source, read_partition
from mmcurate.stages.base import DROP
from PIL import Image


def config(source: str, out, storage_options=None, **output) -> BuildConfig:
    return BuildConfig.model_validate(
        {
            "source": {"kind": "webdataset", "path": source},
            "stages": [{"name": "decode_image", "resize": {"size": 32}}],
            "output": {"path": str(out), **output},
            "storage_options": storage_options or {},
        }
    )


def identity(cfg: BuildConfig) -> str:
    return build_identity(cfg, plan_source(cfg.source, cfg.storage_options))


def change_in_place(tar) -> None:
    """Same name, same size, other bytes (a caption's letters), a later modification time."""
    data = bytearray(tar.read_bytes())
    at = data.index(b".txt") // 512 * 512 + 512  # the first caption's data block
    data[at] = ord("X") if data[at] != ord("X") else ord("Y")
    stat = tar.stat()
    tar.write_bytes(bytes(data))
    os.utime(tar, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


def test_a_tar_changed_in_place_is_refused_by_an_unfinished_build(tmp_path, tar_shards):
    source = tar_shards(n_shards=2, per_shard=3)
    cfg = config(f"{source}/*.tar", tmp_path / "out")
    claim_output(cfg, identity(cfg))  # the build started (and was interrupted)
    change_in_place(source / "shard-000001.tar")
    with pytest.raises(ConfigError, match="unfinished build of another config or input"):
        claim_output(cfg, identity(cfg))  # resuming would mix old and new input


def test_a_tar_replaced_on_s3_changes_the_plan(s3, s3_bucket, tar_shards):
    source = tar_shards(n_shards=1, per_shard=3)
    fs, tar = s3.filesystem(), source / "shard-000000.tar"
    fs.put_file(str(tar), f"{s3_bucket}/in/a.tar")
    cfg = SourceConfig(kind="webdataset", path=f"s3://{s3_bucket}/in/*.tar")
    single = SourceConfig(kind="webdataset", path=f"s3://{s3_bucket}/in/a.tar")
    before = [plan_source(c, s3.storage_options) for c in (cfg, single)]
    change_in_place(tar)
    fs.put_file(str(tar), f"{s3_bucket}/in/a.tar")
    fs.invalidate_cache()
    after = [plan_source(c, s3.storage_options) for c in (cfg, single)]
    assert before[0] == before[1] and after[0] == after[1]  # a glob or the tar itself
    assert before[0][0].inputs != after[0][0].inputs
    assert before[0][0].inputs.startswith(f"{tar.stat().st_size}:")


def test_a_finished_build_of_a_changed_tar_is_not_already_built(ray_session, tmp_path, tar_shards):
    source = tar_shards(n_shards=2, per_shard=3)
    cfg = config(f"{source}/*.tar", tmp_path / "out")
    first = run_build(cfg, False)
    assert run_build(cfg, False) == first  # unchanged: already built
    change_in_place(source / "shard-000000.tar")
    with pytest.raises(ConfigError, match="already holds a different build; pass --overwrite"):
        run_build(cfg, False)
    again = run_build(config(f"{source}/*.tar", tmp_path / "out", overwrite=True), False)
    assert again["build_id"] != first["build_id"]
    with tarfile.open(tmp_path / "out" / "shard-000000.tar") as tar:
        captions = [tar.extractfile(m).read() for m in tar if m.name.endswith(".txt")]
    assert any(caption[:1] in (b"X", b"Y") for caption in captions)  # the new input


def jpeg(color: str) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (24, 24), color).save(out, "JPEG")
    return out.getvalue()


def add(
    tar: tarfile.TarFile,
    name: str,
    data: bytes = b"",
    kind: bytes = tarfile.REGTYPE,
    link: str = "",
) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, link, len(data)
    tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def tar_with_links(path) -> None:
    """a: files; b: only a symbolic link; c: a file and a hard link; d/: a folder; e: files."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        add(tar, "a.jpg", jpeg("red"))
        add(tar, "a.txt", b"a red square")
        add(tar, "b.jpg", kind=tarfile.SYMTYPE, link="a.jpg")
        add(tar, "c.jpg", jpeg("blue"))
        add(tar, "c.txt", kind=tarfile.LNKTYPE, link="a.txt")
        add(tar, "d", kind=tarfile.DIRTYPE)
        add(tar, "e.jpg", jpeg("green"))
        add(tar, "e.txt", b"a green square")


def test_link_members_are_counted_drops(ray_session, tmp_path):
    tar = tmp_path / "in" / "links.tar"
    tar.parent.mkdir()
    tar_with_links(tar)
    part = plan_source(SourceConfig(kind="webdataset", path=str(tar)), {})[0]
    batch = read_partition(part, {})
    assert dict(zip(batch["__key__"], batch[DROP], strict=True)) == {
        "a": None,
        "b": "link_member",
        "c": "link_member",
        "e": None,
    }
    with open(tar, "rb") as f:  # read as WebDataset reads it: files only, links skipped
        plain = [(s["__key__"], sorted(s)) for s in iter_tar_samples(f)]
    theirs = [(s["__key__"], sorted(s)) for s in wds.WebDataset(str(tar), shardshuffle=False)]
    assert plain == [
        (k, [x for x in keys if not x.startswith("__") or x == "__key__"]) for k, keys in theirs
    ]

    manifest = run_build(config(str(tar), tmp_path / "out"), False)
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert stats["stages"][0] | {"seconds": 0} == {
        "name": "source",
        "in": 4,
        "out": 2,
        "dropped": {"link_member": 2},
        "seconds": 0,
    }
    for stage in stats["stages"]:
        assert stage["in"] - stage["out"] == sum(stage["dropped"].values())
    shards = [str(tmp_path / "out" / s["name"]) for s in manifest["shards"]]
    assert [s["__key__"] for s in wds.WebDataset(shards, shardshuffle=False)] == ["a", "e"]

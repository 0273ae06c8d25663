"""A build deletes only what a build of ours wrote, and never reads or deletes its input.

Refusals happen before Ray starts, so most tests here need no Ray; those that build use the
session Ray. Every test asserts that each foreign file survives byte-identical.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import mmcurate.pipeline.phase_c as phase_c_module
import pytest
import yaml
from mmcurate.core.config_io import ConfigError, validate
from mmcurate.pipeline.build import run_build
from mmcurate.pipeline.config import BuildConfig, overlaps
from mmcurate.pipeline.demo_data import write_tar_shards
from mmcurate.pipeline.output.claim import claim_output
from mmcurate.pipeline.output.names import manifest_files, safe_recorded

from tests.kit_builds import config

REPO = Path(__file__).resolve().parents[2]
FOREIGN = "no mmcurate build wrote"


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under `root` (relative path -> bytes)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def plant(root: Path, files: dict[str, bytes | str]) -> dict[str, bytes]:
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return snapshot(root)


def assert_survives(root: Path, before: dict[str, bytes]) -> None:
    after = snapshot(root)
    assert {k: after.get(k) for k in before} == before


def ours(out: Path, foreign: dict[str, bytes]) -> set[str]:
    return set(snapshot(out)) - set(foreign)


# ---- refusals (no Ray) ---------------------------------------------------------------------

COLLIDING = {
    "manifest not JSON": {"manifest.json": b"\x00\xffnot json at all"},
    "manifest of another tool": {"manifest.json": '{"format": "other/2", "files": ["a"]}'},
    "manifest without build id": {"manifest.json": '{"format": "mmcurate/1", "samples": 0}'},
    "manifest as a folder": {"manifest.json/part-0": "x"},
    "work of another tool": {"_work/state.db": b"\x01\x02"},
    "work marker not ours": {"_work/build.json": "{}"},
    "work marker not JSON": {"_work/build.json": "build 7 in progress"},
    "a shard": {"shard-000000.tar": b"someone's shard"},
    "a shard-like name": {"shard-notes.txt": "mine"},
    "report": {"report.html": "<html>my report</html>"},
    "stats": {"stats.json": '{"mine": 1}'},
    "signatures": {"signatures/other.parquet": b"PAR1"},
    "embeddings": {"embeddings/img_emb/x.npy": b"\x93NUMPY"},
}


@pytest.mark.parametrize("files", COLLIDING.values(), ids=COLLIDING.keys())
def test_foreign_file_where_a_build_writes_is_refused_even_with_overwrite(
    tmp_path, image_folder, files
):
    out = tmp_path / "out"
    before = plant(out, {**files, "notes.txt": "keep me"})
    cfg = config(image_folder(n=4), out, overwrite=True, allow_other_files=True)
    with pytest.raises(ConfigError, match=f"which {FOREIGN} and a build would overwrite"):
        run_build(cfg, progress=False)
    assert snapshot(out) == before  # nothing deleted, nothing written


@pytest.mark.parametrize("overwrite", [False, True])
def test_non_empty_foreign_folder_is_refused_unless_allowed(tmp_path, image_folder, overwrite):
    out = tmp_path / "out"
    before = plant(out, {"notes.txt": "keep me", "data/x.bin": b"\x00" * 10, "empty/.keep": ""})
    with pytest.raises(ConfigError, match=f"holds files {FOREIGN} .*allow_other_files"):
        run_build(config(image_folder(n=4), out, overwrite=overwrite), progress=False)
    assert snapshot(out) == before


@pytest.mark.parametrize("path", ["", "   ", "\t", "s3://", "file://  "])
@pytest.mark.parametrize("key", ["output", "source"])
def test_empty_or_blank_paths_are_refused(path, key):
    tree = {"source": {"kind": "images", "path": "/data"}, "output": {"path": "/out"}}
    tree[key]["path"] = path
    with pytest.raises(ConfigError, match=f"^{key}.path: must not be empty"):
        validate(BuildConfig, tree)


def test_output_overlapping_source_is_refused(tmp_path, monkeypatch):
    shards = tmp_path / "built"
    write_tar_shards(shards, n_shards=2, per_shard=3)
    before = snapshot(tmp_path)
    (tmp_path / "link").symlink_to(shards)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    in_place = [  # (source, output): dedupe a build in place, every spelling of it
        (f"{shards}/shard-*.tar", shards),
        (f"{shards}/shard-*.tar", f"{shards}/"),
        ("built/shard-*.tar", "./built/../built"),
        ("~/built/*.tar", f"{tmp_path}/link"),
        (f"{shards}/shard-000000.tar", shards),
        (f"{shards}/*.tar", f"{shards}/deduped"),  # output inside the source
        (f"{shards}/*.tar", tmp_path),  # output holding the source
        (f"file://{shards}/*.tar", f"{shards}"),
    ]
    for source, out in in_place:
        cfg = config(source, out, kind="webdataset", overwrite=True, allow_other_files=True)
        with pytest.raises(ConfigError, match="^output.path: .* overlaps source.path"):
            run_build(cfg, progress=False)
    assert snapshot(tmp_path) == before


def test_overlap_is_decided_by_location():
    assert overlaps("s3://b/out/*.tar", "s3://b/out")
    assert overlaps("s3://b/out/*/*.tar", "s3://b/out/x/")
    assert overlaps("s3://b/out", "s3://b")
    assert overlaps("s3a://b/out", "s3://b/out/")
    assert not overlaps("s3://b/out", "s3://b/out2")
    assert not overlaps("s3://b/out/*.tar", "s3://b/out2")
    assert not overlaps("s3://b/out", "s3://c/out")
    assert not overlaps("s3://b/out", "gs://b/out")
    assert not overlaps("/data/out", "s3://data/out")
    assert not overlaps("/data/out", "/data/out2")
    assert overlaps("/data/out", "/")


def test_forged_records_never_point_a_deletion_elsewhere(tmp_path, image_folder):
    assert safe_recorded(
        ["../x", "/etc/passwd", "a/../../b", "_work/x", "notes.txt", "shard-0.tar", 3]
        + ["signatures/p.parquet", "signatures/../../x", "embeddings/", "stats.json/x"]
    ) == ["shard-0.tar", "signatures/p.parquet"]
    out = tmp_path / "out"
    files = ["../victim.txt", "notes.txt", "/tmp/x", "shard-000000.tar"]
    manifest = {"format": "mmcurate/1", "build_id": "a" * 64, "files": files, "shards": []}
    plant(tmp_path, {"victim.txt": "v", "out/notes.txt": "n", "out/shard-000000.tar": "s"})
    (out / "manifest.json").write_text(json.dumps(manifest))
    cfg = config(image_folder(n=2), out, overwrite=True, allow_other_files=True)
    claim_output(cfg, "b" * 64)
    after = snapshot(tmp_path)
    assert "out/shard-000000.tar" not in after and "out/manifest.json" not in after
    assert {k: after.get(k) for k in ("victim.txt", "out/notes.txt")} == {
        "victim.txt": b"v",
        "out/notes.txt": b"n",
    }


def test_manifest_from_before_the_files_record(tmp_path, image_folder):
    """An older build's manifest has no `files`: it owns the names such a build wrote."""
    manifest = {"format": "mmcurate/1", "build_id": "c" * 64, "samples": 3}
    manifest["shards"] = [{"name": "shard-000000.tar", "samples": 3}]
    assert manifest_files(manifest) >= {
        "manifest.json",
        "shard-000000.tar",
        "shard-000000.parquet",
        "stats.json",
        "signatures/part-000000.parquet",
        "embeddings/img_emb/img_emb_0000.npy",
    }
    out = tmp_path / "out"
    old = {"shard-000000.tar": "t", "shard-000000.parquet": "p", "stats.json": "{}"}
    plant(out, {**old, "manifest.json": json.dumps(manifest), "notes.txt": "n"})
    claim_output(config(image_folder(n=2), out, overwrite=True, allow_other_files=True), "d" * 64)
    assert sorted(snapshot(out)) == ["_work/build.json", "notes.txt"]
    assert (out / "notes.txt").read_bytes() == b"n"


def test_an_interrupted_overwrite_is_finished_by_the_next_build(tmp_path, image_folder):
    """A crash while --overwrite deleted a build: the marker still lists what was left."""
    out = tmp_path / "out"
    marker = {"tool": "mmcurate", "build_id": None, "files": ["shard-000003.tar", "stats.json"]}
    plant(out, {"shard-000003.tar": "t", "stats.json": "{}", "notes.txt": "n"})
    plant(out, {"_work/build.json": json.dumps(marker), "_work/candidates/part-0.tar": "c"})
    claim_output(config(image_folder(n=2), out, allow_other_files=True), "e" * 64)
    assert sorted(snapshot(out)) == ["_work/build.json", "notes.txt"]
    assert json.loads((out / "_work" / "build.json").read_text())["build_id"] == "e" * 64


def test_output_path_that_is_a_file_is_refused(tmp_path, image_folder):
    (tmp_path / "out").write_text("a file")
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        run_build(config(image_folder(n=2), tmp_path / "out", overwrite=True), False)
    assert (tmp_path / "out").read_text() == "a file"


def run_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "mmcurate", "build", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_cli_refusals_are_one_line_exit_2(tmp_path, image_folder):
    """`--set output.path=$UNSET` in a folder of shards; dedupe in place; a foreign folder."""
    here = tmp_path / "here"
    shards = tmp_path / "shards"
    write_tar_shards(shards, n_shards=1, per_shard=2)
    foreign = tmp_path / "foreign"
    plant(here, {"shard-000000.tar": b"precious", "report.html": "mine"})
    plant(foreign, {"notes.txt": "n", "stats.json": "{}"})
    cfg = tmp_path / "build.yaml"
    cfg.write_text(yaml.safe_dump(config(image_folder(n=2), tmp_path / "x").model_dump()))
    before = snapshot(tmp_path)
    cases = [
        (["--set", "output.path=", "--overwrite"], "error: output.path: must not be empty"),
        (
            ["--set", "source.kind=webdataset", "--set", f"source.path={shards}/shard-*.tar"]
            + ["--set", f"output.path={shards}", "--overwrite"],
            f"error: output.path: {shards} overlaps source.path",
        ),
        (
            ["--set", f"output.path={foreign}", "--overwrite", "--allow-other-files"],
            f"error: output.path: {foreign} holds stats.json, which {FOREIGN}",
        ),
    ]
    for args, message in cases:
        result = run_cli([str(cfg), *args], cwd=here)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
        assert lines[0].startswith(message), lines[0]
    assert snapshot(tmp_path) == before


# ---- builds (session Ray) ------------------------------------------------------------------


def test_allowed_foreign_files_survive_builds_and_overwrites(ray_session, tmp_path, image_folder):
    folder = image_folder(n=12, exact_copies=2, broken=1)
    out = tmp_path / "out"
    foreign = plant(out, {"notes.txt": "keep", "data/x.bin": b"\x00\x01", "shard": "no dash"})
    first = run_build(config(folder, out, allow_other_files=True, shard_max_samples=4), False)
    assert_survives(out, foreign)
    assert ours(out, foreign) == {*first["files"], "manifest.json"}  # exactly what it wrote
    assert sum(name.endswith(".tar") for name in first["files"]) == len(first["shards"]) == 3
    again = run_build(config(folder, out, allow_other_files=True, shard_max_samples=4), False)
    assert again == first  # a finished build again is a no-op
    with pytest.raises(ConfigError, match=f"holds files {FOREIGN}"):  # still needs the option
        run_build(config(folder, out, overwrite=True), False)
    second = run_build(config(folder, out, overwrite=True, allow_other_files=True), False)
    assert len(second["shards"]) == 1 and second["build_id"] != first["build_id"]
    assert ours(out, foreign) == {*second["files"], "manifest.json"}  # old shards are gone
    assert_survives(out, foreign)


def test_interrupted_build_resumes_or_is_replaced(ray_session, tmp_path, image_folder, monkeypatch):
    folder = image_folder(n=10, exact_copies=1)
    clean = run_build(config(folder, tmp_path / "clean", shard_max_samples=4), False)
    out = tmp_path / "out"

    def crash(*_):
        raise RuntimeError("killed before the manifest")

    with monkeypatch.context() as patch:
        patch.setattr(phase_c_module, "final_files", crash)
        with pytest.raises(RuntimeError, match="killed"):
            run_build(config(folder, out, shard_max_samples=4), False)
    assert (out / "shard-000000.tar").exists() and not (out / "manifest.json").exists()
    marker = json.loads((out / "_work" / "build.json").read_text())
    assert "shard-000000.tar" in marker["files"] and "manifest.json" in marker["files"]
    leftover = out / ("shard-000001.tar.tmp-" + "0" * 32)  # an atomic write a crash cut short
    leftover.write_bytes(b"half")
    with pytest.raises(ConfigError, match="unfinished build of another config"):
        run_build(config(folder, out, shard_max_samples=5), False)
    resumed = run_build(config(folder, out, shard_max_samples=4), False)
    assert resumed["shards"] == clean["shards"]
    assert set(snapshot(out)) == {*resumed["files"], "manifest.json"}  # leftover removed
    replaced = run_build(config(folder, out, shard_max_samples=5, overwrite=True), False)
    assert set(snapshot(out)) == {*replaced["files"], "manifest.json"}


def s3_snapshot(fs, root: str) -> dict[str, bytes]:
    fs.invalidate_cache()
    return {p[len(root) + 1 :]: fs.cat_file(p) for p in fs.find(root)}


def test_s3_output_keeps_foreign_objects_and_apart_from_source(
    ray_session, s3, s3_bucket, tar_shards
):
    fs = s3.filesystem()
    for tar in sorted(tar_shards(n_shards=2, per_shard=4, seed=3).glob("*.tar")):
        fs.put_file(str(tar), f"{s3_bucket}/in/{tar.name}")
    fs.pipe({f"{s3_bucket}/out/notes.txt": b"keep", f"{s3_bucket}/out/d/x.bin": b"\x00"})
    fs.pipe({f"{s3_bucket}/bad/manifest.json": b"not json"})
    before = s3_snapshot(fs, s3_bucket)
    opts = s3.storage_options

    def cfg(out: str, **output) -> BuildConfig:
        return config(f"s3://{s3_bucket}/in/*.tar", out, "webdataset", opts, **output)

    for out in ("in", "in/", "in/sub", ""):  # the source's own folder, inside it, around it
        with pytest.raises(ConfigError, match="overlaps source.path"):
            run_build(cfg(f"s3://{s3_bucket}/{out}", overwrite=True), False)
    with pytest.raises(ConfigError, match=f"holds manifest.json, which {FOREIGN}"):
        run_build(cfg(f"s3://{s3_bucket}/bad", overwrite=True, allow_other_files=True), False)
    with pytest.raises(ConfigError, match=f"holds files {FOREIGN}"):
        run_build(cfg(f"s3://{s3_bucket}/out", overwrite=True), False)
    assert s3_snapshot(fs, s3_bucket) == before
    assert run_build(cfg(f"s3://{s3_bucket}/in2"), False)["samples"] == 8  # "in2" is not "in"
    first = run_build(cfg(f"s3://{s3_bucket}/out/", allow_other_files=True), False)
    second = run_build(
        cfg(f"s3://{s3_bucket}/out", overwrite=True, allow_other_files=True, shard_max_samples=3),
        False,
    )
    assert len(first["shards"]) == 1 and len(second["shards"]) == 3
    after = s3_snapshot(fs, s3_bucket)
    assert {k: after.get(k) for k in before} == before  # source and foreign objects intact
    out_files = {k.removeprefix("out/") for k in after if k.startswith("out/")}
    assert out_files == {*second["files"], "manifest.json", "notes.txt", "d/x.bin"}

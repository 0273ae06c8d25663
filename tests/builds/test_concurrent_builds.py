"""Two builds on one output.path: one holds it at a time, and none trusts what another wrote.

A run's claim (`_work/build.json`) names the run; a run that finds another's there stops with a
one-line error, and done markers count only when they name this build and a run it trusts (a
crashed run of the same build: resuming stays the contract). A `_work/` left without its
marker, holding only what a build writes there, is an interrupted build's scratch: cleared.
"""

import json
import uuid
from pathlib import Path

import mmcurate.pipeline.build as build_module
import mmcurate.pipeline.output.claim as resume
import mmcurate.pipeline.phase_c as phase_c_module
import pytest
from mmcurate.core.config_io import ConfigError
from mmcurate.pipeline.build import run_build
from mmcurate.pipeline.config import BuildConfig
from mmcurate.pipeline.output.claim import (
    AlreadyBuilt,
    TookOver,
    build_identity,
    claim_output,
    record_files,
)
from mmcurate.pipeline.output.markers import (
    done_parts,
    done_shards,
    mark,
    part_marker,
    shard_marker,
)
from mmcurate.pipeline.sources.partitions import plan_source

STAGES = [{"name": "decode_image", "resize": {"size": 32}}, {"name": "exact_dedupe"}]
TOOK_OVER = "another build took over output.path"
ENTRY = {"name": "shard-000000.tar", "samples": 3, "bytes": 3072, "sha256": "0" * 64}


def config(source, out, storage_options=None, **output) -> BuildConfig:
    return BuildConfig.model_validate(
        {
            "source": {"kind": "images", "path": str(source), "files_per_task": 4},
            "stages": STAGES,
            "output": {"path": str(out), **output},
            "storage_options": storage_options or {},
        }
    )


def identity(cfg: BuildConfig) -> str:
    return build_identity(cfg, plan_source(cfg.source, {}))


def claim(cfg: BuildConfig):
    return claim_output(cfg, identity(cfg))


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def plant(root: Path, files: dict[str, bytes | str]) -> None:
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data if isinstance(data, bytes) else data.encode())


def marker(out: Path) -> dict:
    return json.loads((out / "_work" / "build.json").read_text())


def between_look_and_write(monkeypatch, other_run) -> None:
    """Run `other_run()` once, right after this run's first look at output.path: another
    run's claim lands between this run's look and its own write (the race, made certain)."""
    look = resume.inspect_output
    pending = [other_run]

    def looked(*args):
        state = look(*args)
        if pending:
            pending.pop()()
        return state

    monkeypatch.setattr(resume, "inspect_output", looked)


# ---- the claim (no Ray) --------------------------------------------------------------------


def test_two_builds_claiming_an_empty_output_at_once(tmp_path, image_folder, monkeypatch):
    """Another config: the later claim is refused. The same config: the later run takes the
    build over (trusting the other's finished work) and the other finds its claim gone."""
    folder, out = image_folder(n=4), tmp_path / "out"
    mine, theirs = config(folder, out, shard_max_samples=3), config(folder, out)
    other = {}
    between_look_and_write(monkeypatch, lambda: other.update(run=claim(theirs)))
    with pytest.raises(ConfigError, match="unfinished build of another config"):
        claim(mine)
    assert marker(out)["build_id"] == identity(theirs) and marker(out)["run"] == other["run"].run
    other["run"].check()  # still theirs

    out = tmp_path / "same"
    cfg = config(folder, out)
    between_look_and_write(monkeypatch, lambda: other.update(run=claim(cfg)))
    mine = claim(cfg)
    assert mine.holds() and not other["run"].holds()
    assert mine.runs == (other["run"].run, mine.run)  # it resumes the other's build
    with pytest.raises(TookOver, match=TOOK_OVER) as lost:
        other["run"].check()
    assert "\n" not in str(lost.value)


@pytest.mark.parametrize("same_config", [True, False], ids=["same config", "other config"])
def test_overwrite_takes_the_output_and_never_trusts_the_old_run(
    tmp_path, image_folder, same_config
):
    folder, out = image_folder(n=4), tmp_path / "out"
    old = claim(config(folder, out, shard_max_samples=3))
    mark(old, shard_marker(old.work_url, "shard-000000.tar"), ENTRY)
    cfg = config(folder, out, shard_max_samples=3 if same_config else 5)
    new = claim(config(folder, out, shard_max_samples=cfg.output.shard_max_samples, overwrite=True))
    for stops in (old.check, lambda: record_files(old, ["shard-000001.tar"])):
        with pytest.raises(TookOver, match=TOOK_OVER):
            stops()
    assert not old.holds() and new.holds()
    # The old run's tasks that were mid-write land after the takeover: never trusted.
    mark(old, shard_marker(old.work_url, "shard-000001.tar"), ENTRY | {"name": "shard-000001.tar"})
    mark(old, part_marker(old.work_url, 0), {"part": 0})
    plant(out, {"_work/signatures/part-000000.parquet": b"PAR1"})
    assert done_shards(new) == {} and done_parts(new) == set()
    # The new run's own work is trusted by a rerun after it crashed (the resume contract).
    mark(new, shard_marker(new.work_url, "shard-000002.tar"), ENTRY | {"name": "shard-000002.tar"})
    mark(new, part_marker(new.work_url, 0), {"part": 0})
    rerun = claim(cfg)
    assert rerun.runs == (new.run, rerun.run)
    assert done_shards(rerun) == {"shard-000002.tar": ENTRY | {"name": "shard-000002.tar"}}
    assert done_parts(rerun) == {0}


LEFTOVERS = {
    "killed at its first marker write": {f"_work/build.json.tmp-{'0' * 32}": '{"tool": "mm'},
    "killed while dropping _work": {},
    "a run that wrote on after another finished": {
        "_work/candidates/part-000003.tar": b"\0" * 1024,
        f"_work/candidates/part-000003.parquet.tmp-{'a' * 32}": b"PAR",
        "_work/signatures/part-000003.parquet": b"PAR1",
        "_work/parts/part-000003.json": "{}",
        "_work/shards/shard-000001.json": "{}",
        "_work/decide/shuffle-001/m000000-r0001.parquet": b"PAR1",
        "_work/source/0123456789abcdef-5000/000000.parquet": b"PAR1",
    },
}


@pytest.mark.parametrize("files", LEFTOVERS.values(), ids=LEFTOVERS.keys())
@pytest.mark.parametrize("overwrite", [False, True])
def test_work_left_without_its_marker_is_cleared(tmp_path, image_folder, files, overwrite):
    folder, out = image_folder(n=4), tmp_path / "out"
    (out / "_work").mkdir(parents=True)
    plant(out, files)
    run = claim(config(folder, out, overwrite=overwrite))
    assert list(snapshot(out)) == ["_work/build.json"] and marker(out)["run"] == run.run

    # Beside a finished build of this config: "already built", the scratch dropped.
    cfg = config(folder, out, overwrite=overwrite)
    manifest = {"format": "mmcurate/1", "build_id": identity(cfg), "samples": 1, "shards": []}
    manifest["files"] = ["shard-000000.tar"]
    (out / "_work" / "build.json").unlink()
    plant(out, {**files, "manifest.json": json.dumps(manifest), "shard-000000.tar": "t"})
    if overwrite:
        claim(cfg)
        assert list(snapshot(out)) == ["_work/build.json"]
    else:
        with pytest.raises(AlreadyBuilt):
            claim(cfg)
        assert sorted(snapshot(out)) == ["manifest.json", "shard-000000.tar"]
        assert not (out / "_work").exists()


@pytest.mark.parametrize("overwrite", [False, True])
def test_other_files_in_work_keep_it_foreign(tmp_path, image_folder, overwrite):
    """What a build never writes there (another tool's, a user's) is never deleted."""
    folder = image_folder(n=2)
    for name in ("_work/candidates/notes.txt", "_work/mine/part-000000.tar", "_work/build.json"):
        out = tmp_path / name.replace("/", "_")
        plant(out, {"_work/candidates/part-000000.tar": b"c", name: "theirs"})
        before = snapshot(out)
        with pytest.raises(ConfigError, match="holds _work/, which no mmcurate build wrote"):
            claim(config(folder, out, overwrite=overwrite, allow_other_files=True))
        assert snapshot(out) == before


def test_object_store_claims(s3, s3_bucket, image_folder):
    """On S3: scratch without marker is cleared; --overwrite takes the output over."""
    fs, opts = s3.filesystem(), s3.storage_options
    fs.pipe({f"{s3_bucket}/out/_work/candidates/part-000000.tar": b"c"})
    folder = image_folder(n=2)
    old = claim(config(folder, f"s3://{s3_bucket}/out", opts))
    fs.invalidate_cache()
    assert fs.find(f"{s3_bucket}/out") == [f"{s3_bucket}/out/_work/build.json"]
    new = claim(config(folder, f"s3://{s3_bucket}/out", opts, overwrite=True))
    with pytest.raises(TookOver, match=TOOK_OVER):
        old.check()
    assert new.holds() and not old.holds()


# ---- whole builds (session Ray) -------------------------------------------------------------


def test_a_rerun_takes_over_a_running_build(ray_session, tmp_path, image_folder, monkeypatch):
    """The same config started again while the first still runs (here: once the first has
    finished its partitions): the rerun reuses that work and commits; the first stops."""
    folder, out = image_folder(n=12, exact_copies=2), tmp_path / "out"
    clean = run_build(config(folder, tmp_path / "clean", shard_max_samples=4), False)
    decide, rerun = build_module.decide, {}
    again = config(folder, out, shard_max_samples=4)
    pending = [lambda: rerun.update(manifest=run_build(again, False))]

    def decide_after_a_rerun(*args):
        if pending:
            pending.pop()()
        return decide(*args)

    monkeypatch.setattr(build_module, "decide", decide_after_a_rerun)
    with pytest.raises(TookOver, match=TOOK_OVER) as lost:
        run_build(config(folder, out, shard_max_samples=4), False)
    assert "\n" not in str(lost.value)
    assert rerun["manifest"]["shards"] == clean["shards"]
    assert set(snapshot(out)) == {*rerun["manifest"]["files"], "manifest.json"}


def test_overwrite_never_uses_shards_of_the_build_it_replaced(
    ray_session, tmp_path, image_folder, monkeypatch
):
    """An earlier build's shard task still running under --overwrite lands its shard and
    marker after the new build's claim: the new build writes that shard itself."""
    folder, out = image_folder(n=12), tmp_path / "out"
    clean = run_build(config(folder, tmp_path / "clean", shard_max_samples=5), False)
    first = run_build(config(folder, out, shard_max_samples=3), False)
    old_shard = (out / "shard-000000.tar").read_bytes()
    old_run = {"build_id": first["build_id"], "run": uuid.uuid4().hex}
    done = phase_c_module.done_shards

    def old_task_lands(*args):
        plant(out, {"shard-000000.tar": old_shard})
        entry = json.dumps(first["shards"][0] | old_run)
        plant(out, {"_work/shards/shard-000000.json": entry})
        return done(*args)

    monkeypatch.setattr(phase_c_module, "done_shards", old_task_lands)
    second = run_build(config(folder, out, shard_max_samples=5, overwrite=True), False)
    assert second["shards"] == clean["shards"]
    clean_shard = (tmp_path / "clean" / "shard-000000.tar").read_bytes()
    assert (out / "shard-000000.tar").read_bytes() == clean_shard

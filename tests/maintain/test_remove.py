"""`mmcurate remove` on a finished build of real photos fetched from loopback: each selector
takes out exactly its samples from every output file, other shards stay byte-identical, a
kill -9 at any step then the same command equals one uninterrupted run, a second run is a
no-op, and the result reads in webdataset, duckdb and the trainer (whose shard cache never
serves a rewritten shard's old bytes)."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import fsspec
import pytest
import torch
import webdataset as wds
from mmcurate.core.config_io import ConfigError
from mmcurate.pipeline.build import run_build
from mmcurate.pipeline.config import BuildConfig
from mmcurate.pipeline.maintain.remove import main as remove_main
from mmcurate.pipeline.output.existing import only_scratch
from mmcurate.stages.lib.image_hash import image_signals
from mmcurate.trainer.config import TrainConfig
from mmcurate.trainer.data.dataset import ImageTransform, ShardDataset, make_loader
from mmcurate.trainer.data.manifest import read_manifest
from mmcurate.trainer.data.reader import ShardReader
from mmcurate.trainer.models import build_model
from PIL import Image

from tests.http_corpus import Corpus
from tests.kit_remove import (
    check_removed,
    comparable,
    copy_build,
    files,
    kept_rows,
    signatures,
    tar_samples,
    url_build,
)

REPO = Path(__file__).resolve().parents[2]
CHILD = REPO / "tests" / "remove_kill_child.py"


@pytest.fixture(scope="module")
def built(ray_session, tmp_path_factory):
    """(photos folder, finished build): 39 URLs (3 exact copies), 36 kept in 5 shards."""
    server = Corpus().start()
    try:
        yield url_build(tmp_path_factory.mktemp("remove"), server)
    finally:
        server.stop()


def chosen(out: Path) -> list[dict]:
    """Three kept samples in two shards."""
    rows = sorted(kept_rows(out), key=lambda r: r["key"])
    return [rows[1], rows[2], rows[12]]


def selector_file(tmp_path: Path, photos: Path, out: Path, kind: str) -> tuple[Path, set[str]]:
    """The selector's file (folder for like) and the kept keys it must remove."""
    rows = chosen(out)
    if kind == "like":
        return like_folder(tmp_path, photos, out)
    column = {"keys": "key", "urls": "url", "sha256": "sha256"}[kind]
    path = tmp_path / f"{kind}.txt"
    path.write_text("".join(f"{r[column]}\n" for r in rows) + "\nnot-in-the-build\n")
    wanted = {r[column] for r in rows}
    return path, {r["key"] for r in kept_rows(out) if r[column] in wanted}


def like_folder(tmp_path: Path, photos: Path, out: Path) -> tuple[Path, set[str]]:
    """A folder with the original photo of a sample stored uncropped, a smaller re-encoded
    copy of another sample's stored image, and a file that is no image; the kept keys whose
    near hashes (frame or windows) are within the build's radius (8) of any of theirs."""
    folder = tmp_path / "like"
    folder.mkdir()
    rows = sorted(kept_rows(out), key=lambda r: r["key"])
    plain = next(r for r in rows if r["crop_share"] < 0.05 and "/sample_" in r["url"])
    name = plain["url"].rsplit("/", 1)[1]
    shutil.copy(photos / name, folder / name)
    other = rows[12]
    stored = tar_samples((out / other["shard"]).read_bytes())[other["key"]]["jpg"]
    image = Image.open(io.BytesIO(stored))
    image.resize((image.width * 4 // 5, image.height * 4 // 5)).save(
        folder / "copy.jpg", quality=70
    )
    (folder / "notes.txt").write_text("not an image")
    queries = [image_signals(p.read_bytes()) for p in (folder / name, folder / "copy.jpg")]
    hashes = [h for full, crops, _, _ in queries for h in (full, *crops)]
    near = {
        r["key"]
        for r in kept_rows(out)
        if min((a ^ b).bit_count() for a in hashes for b in (r["phash"], *r["phash_crops"])) <= 8
    }
    assert {plain["key"], other["key"]} <= near
    return folder, near


def remove(out: Path, kind: str, path: Path, capsys) -> dict:
    assert remove_main([str(out), f"--{kind}", str(path)]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", ["keys", "urls", "sha256", "like"])
def test_each_selector_removes_exactly_its_samples(built, tmp_path, capsys, kind):
    photos, original = built
    out = copy_build(original, tmp_path / "out")
    path, removed = selector_file(tmp_path, photos, out, kind)
    summary = remove(out, kind, path, capsys)
    assert summary["removed"] == len(removed) > 0
    check_removed(original, out, removed, summary)
    (audit,) = [json.loads(line) for line in (out / "audit.jsonl").read_text().splitlines()]
    assert audit["selector"] == kind and audit["removed"] == len(removed)
    if kind != "like":
        assert audit["selector_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert len(audit["record_sha256"]) == len(removed)
    gone = [r for r in signatures(original) if r["key"] in removed]
    assert sorted(audit["content_sha256"]) == sorted(r["sha256"] for r in gone)
    assert not (out / "_work").exists()
    if kind == "like":
        assert summary["unreadable_images"] == 1


def test_a_second_run_changes_nothing_and_records_nothing(built, tmp_path, capsys):
    photos, original = built
    out = copy_build(original, tmp_path / "out")
    path, removed = selector_file(tmp_path, photos, out, "keys")
    remove(out, "keys", path, capsys)
    after = files(out)
    assert remove(out, "keys", path, capsys)["removed"] == 0
    assert files(out) == after  # the audit has one line: a no-op is not recorded
    assert len((out / "audit.jsonl").read_text().splitlines()) == 1


@pytest.fixture(scope="module")
def uninterrupted(built, tmp_path_factory):
    """The build after one uninterrupted remove of `chosen` keys (and the keys file)."""
    photos, original = built
    root = tmp_path_factory.mktemp("reference")
    path, _ = selector_file(root, photos, original, "keys")
    out = copy_build(original, root / "out")
    assert remove_main([str(out), "--keys", str(path)]) == 0
    return comparable(out), path


KILL_POINTS = [
    ("remove:make_plan", "after", 1),  # planned, nothing staged
    ("remove_stage:stage_shard", "after", 1),  # one shard staged of two
    ("remove:stage_all", "after", 1),  # all staged, nothing swapped
    ("remove_swap:swap", "after", 2),  # the first shard's tar and parquet swapped
    ("remove_swap:swap", "before", 6),  # shards and signatures swapped, the rest not
    ("remove_swap:rerender_report", "after", 1),  # all but the manifest
    ("remove_swap:drop_scratch", "before", 1),  # committed, scratch still there
]


@pytest.mark.parametrize(("point", "when", "nth"), KILL_POINTS)
def test_kill_9_then_rerun_equals_an_uninterrupted_remove(
    built, uninterrupted, tmp_path, point, when, nth
):
    _, original = built
    expected, keys = uninterrupted
    out = copy_build(original, tmp_path / "out")
    child = [sys.executable, str(CHILD), point, when, str(nth), "--", str(out), "--keys", str(keys)]
    killed = subprocess.run(child, cwd=REPO, capture_output=True, timeout=120)
    assert killed.returncode == -9, killed.stderr.decode()[-2000:]
    assert (out / "_work" / "remove").exists()
    assert remove_main([str(out), "--keys", str(keys)]) == 0
    assert comparable(out) == expected


def test_an_interrupted_remove_is_scratch_and_a_rebuild_keeps_the_result(image_folder, tmp_path):
    """An interrupted remove's `_work/remove/` is the build's scratch; rerunning the build then
    finds it finished with the samples removed (audit.jsonl is its file), another config
    needs --overwrite, which deletes the audit log with the rest."""
    folder, out = image_folder(n=12, exact_copies=0, broken=0), tmp_path / "out"
    cfg = small_config(folder, out)
    before = run_build(cfg, progress=False)
    keys = tmp_path / "keys.txt"
    keys.write_text(kept_rows(out)[0]["key"] + "\n")
    child = [sys.executable, str(CHILD), "remove:stage_all", "after", "1", "--", str(out)]
    assert subprocess.run([*child, "--keys", str(keys)], cwd=REPO, timeout=120).returncode == -9
    assert only_scratch(fsspec.filesystem("file"), str(out / "_work"))
    with pytest.raises(ConfigError, match="different build"):  # still ours, not foreign
        run_build(small_config(folder, out, shard_max_samples=5), progress=False)
    assert remove_main([str(out), "--keys", str(keys)]) == 0
    manifest = run_build(cfg, progress=False)  # already built: returns the manifest as it is
    assert manifest["samples"] == before["samples"] - 1 and "audit.jsonl" in manifest["files"]
    run_build(small_config(folder, out, shard_max_samples=5, overwrite=True), progress=False)
    assert not (out / "audit.jsonl").exists()


def test_a_rebuild_over_a_remove_killed_mid_swap_refuses_and_the_remove_still_finishes(
    image_folder, tmp_path
):
    """Killed after some files were swapped and before the manifest: a rerun of the same build
    refuses in one line (it used to take the old manifest as finished and drop the remove's
    plan with the rest of _work/, leaving shards the manifest does not describe), the remove's
    scratch stays, and rerunning the remove finishes it."""
    folder, out = image_folder(n=12, exact_copies=0, broken=0), tmp_path / "out"
    cfg = small_config(folder, out)
    before = run_build(cfg, progress=False)
    keys = tmp_path / "keys.txt"
    keys.write_text(kept_rows(out)[0]["key"] + "\n")
    child = [sys.executable, str(CHILD), "remove_swap:swap", "after", "2", "--", str(out)]
    assert subprocess.run([*child, "--keys", str(keys)], cwd=REPO, timeout=120).returncode == -9
    plan = out / "_work" / "remove" / "plan.json"
    with pytest.raises(ConfigError, match="unfinished `mmcurate remove`"):
        run_build(cfg, progress=False)
    assert plan.exists()
    assert remove_main([str(out), "--keys", str(keys)]) == 0
    manifest = run_build(cfg, progress=False)
    assert manifest["samples"] == before["samples"] - 1 and not (out / "_work").exists()


def small_config(folder: Path, out: Path, **output: object) -> BuildConfig:
    return BuildConfig.model_validate(
        {
            "source": {"kind": "images", "path": str(folder)},
            "stages": [{"name": "decode_image", "resize": {"size": 64}}, {"name": "exact_dedupe"}],
            "output": {"path": str(out), "shard_max_samples": 4, **output},
        }
    )


def test_bad_requests_are_one_line_and_exit_2(built, tmp_path, capsys):
    _, original = built
    out = copy_build(original, tmp_path / "out")
    keys = tmp_path / "k.txt"
    keys.write_text("x\n")
    cases = [
        ([str(tmp_path / "nothing"), "--keys", str(keys)], "no finished mmcurate build"),
        ([str(out), "--keys", str(tmp_path / "missing.txt")], "cannot read"),
        ([str(out), "--keys", str(keys), "--storage-options", "[1]"], "JSON object"),
        ([str(out), "--like", str(tmp_path)], "no readable images"),
    ]
    for argv, message in cases:
        assert remove_main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["config"]["stages"] = [
        s for s in manifest["config"]["stages"] if s["name"] != "near_dedupe"
    ]
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert remove_main([str(out), "--like", str(tmp_path)]) == 2
    assert "no near hashes" in capsys.readouterr().err


def read_through_cache(out: Path, cache: Path) -> tuple[list[str], dict[str, int]]:
    """Every sample key of the build, read by the trainer's shard reader through its cache."""
    manifest = read_manifest(str(out / "manifest.json"))
    reader = ShardReader(manifest.shards, cache=(str(cache), 1 << 30))
    keys = [s["__key__"] for i in range(len(manifest.shards)) for s in reader.samples(i)]
    return keys, reader.cache.counters()


def test_webdataset_duckdb_and_the_trainer_read_the_result(built, tmp_path, capsys):
    """The trainer's cache holds the old shards; after the remove it downloads each rewritten
    shard again (a copy is named by the manifest's sha256: the old bytes are never served),
    and reads the others from the cache."""
    photos, original = built
    out = copy_build(original, tmp_path / "out")
    cache = tmp_path / "cache"
    before, _ = read_through_cache(out, cache)
    path, removed = selector_file(tmp_path, photos, out, "keys")
    summary = remove(out, "keys", path, capsys)
    old_copies = set(cache.glob("*.tar"))
    after, counters = read_through_cache(out, cache)
    assert sorted(after) == sorted(set(before) - removed)
    assert counters["misses"] == len(summary["shards_rewritten"]) == 2
    assert counters["hits"] == 5 - 2 and counters["damaged"] == 0
    assert old_copies < set(cache.glob("*.tar"))  # the old copies were there, not served
    manifest = json.loads((out / "manifest.json").read_text())
    names = [str(out / e["name"]) for e in manifest["shards"]]
    read = [s["__key__"] for s in wds.WebDataset(names, shardshuffle=False)]
    assert sorted(read) == sorted(after)
    query = f"select key from read_parquet('{out}/shard-*.parquet')"
    assert sorted(k for (k,) in duckdb.sql(query).fetchall()) == sorted(after)
    transform, tokenizer = tiny_transform()
    dataset = ShardDataset(read_manifest(str(out / "manifest.json")), transform, tokenizer, 11)
    batches = list(make_loader(dataset, workers=0))
    assert sorted(k for batch in batches for k in batch.keys) == sorted(after)[: 33 // 11 * 11]


def tiny_transform():  # noqa: ANN201 - (transform, tokenizer)
    cfg = TrainConfig.model_validate({"data": {"manifest": "x"}, "run": {"output": "x"}})
    _, preprocess, tokenizer = build_model(cfg.model, torch.device("cpu"))
    return ImageTransform(preprocess), tokenizer

"""`mmcurate retry OUTPUT`: a build whose server failed about a fifth of its requests (503s
and a stall past the timeout) gets those samples fetched again and added as if they had been
there from the start: kept set equal to a build where nothing failed, dedupe decided again
over every row, the shards whose contents change rewritten and the others byte-identical; a
kill -9 midway then a rerun gives the same result."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from mmcurate.core.manifest import parse_manifest
from mmcurate.pipeline.cli import main as cli_main
from mmcurate.pipeline.maintain.retry import retry

from tests.host_server import Route
from tests.kit_builds import wait_for
from tests.kit_grow import (
    FlakySite,
    assert_manifest_matches,
    build,
    kept,
    kept_urls,
    photo,
    shard_bytes,
    url_list,
)

REPO = Path(__file__).resolve().parents[2]
FAILING = (3, 7, 12, 18, 25, 28)  # 503 while the site is broken
STALLING = (21,)  # answers after the timeout while broken


@pytest.fixture
def flaky(tmp_path):
    """A site of 30 photos, a byte copy of #3 (after it in the list) and of #5, and a 404;
    the list, and the build made while the site was broken."""
    site = FlakySite().start()
    bodies = [photo(i) for i in range(30)]
    urls = [site.route(f"/img/{i}.jpg", Route(200, body)) for i, body in enumerate(bodies)]
    urls.append(site.route("/img/copy-of-3.jpg", Route(200, bodies[3])))
    urls.append(site.route("/img/copy-of-5.jpg", Route(200, bodies[5])))
    urls.append(site.base + "/gone.jpg")  # 404: permanent, never fetched again
    site.failing = {f"/img/{i}.jpg" for i in FAILING}
    site.stalling = {f"/img/{i}.jpg" for i in STALLING}
    source = url_list(tmp_path / "urls.parquet", urls)
    build(source, tmp_path / "out")
    site.broken = False
    yield site, source, tmp_path / "out"
    site.stop()


def test_retry_recovers_the_transient_failures_as_if_nothing_had_failed(flaky, tmp_path):
    site, source, out = flaky
    before = shard_bytes(out)
    failed = [r for r in signature_rows(out) if r["drop_reason"] in ("http_503", "timeout")]
    assert {f"/img/{i}.jpg" for i in (*FAILING, *STALLING)} <= {
        r["url"].removeprefix(site.base) for r in failed
    }
    assert kept_urls(out)["000000030"].endswith("/img/copy-of-3.jpg")  # #3 failed: its copy kept

    manifest = retry(str(out), {})
    build(source, tmp_path / "reference")  # the site healthy from the start

    assert kept_urls(out) == kept_urls(tmp_path / "reference")
    assert kept(out) == kept(tmp_path / "reference")  # the shards hold the same images
    assert site.hits["/gone.jpg"] == 2  # the first build's and the reference's: not retried
    record = manifest["maintenance"][-1]
    assert record["fetched"] == len(failed) and record["added"] == len(failed)
    assert record["dropped_from_shards"] == 1  # the copy of #3: #3 comes first now
    rewritten = {name.removesuffix(".tar") for name in record["shards_rewritten"]}
    assert rewritten and record["shards_added"]
    after = shard_bytes(out)
    for name, data in before.items():
        if name.rsplit(".", 1)[0] not in rewritten:
            assert after[name] == data, name  # untouched shards: byte-identical
    assert counts(out) == counts(tmp_path / "reference")  # stats.json counted again
    read = parse_manifest(str(out / "manifest.json"), manifest)  # as the trainer reads it
    assert read.samples == len(kept_urls(out))
    assert fates(out) == fates(tmp_path / "reference")  # every row's, in signatures/
    assert_manifest_matches(out)
    assert not (out / "_grow").exists()
    assert retry(str(out), {}) == json.loads((out / "manifest.json").read_text())  # no-op


def test_a_retry_killed_midway_then_run_again_gives_the_same_result(flaky, tmp_path):
    _, _, out = flaky
    twin = tmp_path / "twin"
    shutil.copytree(out, twin)
    retry(str(twin), {})  # uninterrupted

    driver = subprocess.Popen(
        [sys.executable, "-m", "mmcurate", "retry", str(out), "--no-progress"],
        cwd=REPO,
        env=dict(os.environ),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "retry.err").open("wb"),
    )
    signatures = out / "_grow" / "build" / "_work" / "signatures"
    wait_for(lambda: any(signatures.glob("part-*.parquet")) or driver.poll() is not None)
    os.killpg(driver.pid, signal.SIGKILL)  # its own process group, by its pid
    assert driver.wait() == -signal.SIGKILL, (tmp_path / "retry.err").read_text()
    assert (out / "_grow").exists()  # killed midway: its scratch is left
    assert cli_main(["retry", str(out), "--no-progress"]) == 0

    assert shard_bytes(out) == shard_bytes(twin)
    assert kept_urls(out) == kept_urls(twin)
    assert_manifest_matches(out)


@pytest.mark.parametrize("stopped_after", ["plan", "manifest"])
def test_a_retry_stopped_after_its_plan_or_its_manifest_finishes_on_the_rerun(
    flaky, tmp_path, stopped_after
):
    """The states a kill -9 leaves once the plan is written (published files about to be
    replaced) and once the manifest is (scratch not yet dropped): a rerun finishes it."""
    from mmcurate.pipeline.maintain.grow_publish import apply_plan
    from mmcurate.pipeline.maintain.grow_run import candidates_url, make_plan, new_rows
    from mmcurate.pipeline.maintain.grow_state import finished_build, start_op, sub_config
    from mmcurate.pipeline.maintain.retry import failed_parts
    from mmcurate.stages.registry import build_stages

    _, _, out = flaky
    twin = tmp_path / "twin"
    shutil.copytree(out, twin)
    retry(str(twin), {})  # uninterrupted
    build_ = finished_build(str(out), {})
    op = start_op(build_, "retry", None, failed_parts(build_))
    sub = sub_config(build_)
    stages = build_stages(sub.stages)
    plan = make_plan(build_, op, sub, stages, new_rows(sub, stages, op["parts"], False))
    if stopped_after == "manifest":
        apply_plan(build_, plan, candidates_url(sub))
    assert (out / "_grow").exists()
    assert cli_main(["retry", str(out), "--no-progress"]) == 0

    assert shard_bytes(out) == shard_bytes(twin)
    assert kept_urls(out) == kept_urls(twin)
    assert_manifest_matches(out)
    assert not (out / "_grow").exists()


def test_retry_on_an_object_store(s3, s3_bucket, tmp_path):
    """The same on S3 (SeaweedFS): recovered, deduplicated, the manifest matching the store."""
    import fsspec

    site = FlakySite().start()
    try:
        bodies = [photo(i) for i in range(12)]
        urls = [site.route(f"/img/{i}.jpg", Route(200, body)) for i, body in enumerate(bodies)]
        urls.append(site.route("/img/copy-of-3.jpg", Route(200, bodies[3])))
        site.failing = {"/img/3.jpg", "/img/8.jpg"}
        source = url_list(tmp_path / "urls.parquet", urls)
        out = f"s3://{s3_bucket}/out"
        build(source, out, s3.storage_options)
        site.broken = False
        manifest = retry(out, s3.storage_options)
        build(source, tmp_path / "reference")
    finally:
        site.stop()
    fs = fsspec.filesystem("s3", **s3.storage_options)
    import pyarrow.parquet as pq

    rows = pq.read_table(f"{s3_bucket}/out/signatures", filesystem=fs).to_pylist()
    assert {r["key"]: r["url"] for r in rows if r["drop_reason"] is None} == kept_urls(
        tmp_path / "reference"
    )
    assert manifest["maintenance"][-1]["shards_rewritten"]  # the copy of #3 left its shard
    for entry in manifest["shards"]:
        data = fs.cat_file(f"{s3_bucket}/out/{entry['name']}")
        assert hashlib.sha256(data).hexdigest() == entry["sha256"]
    assert not fs.exists(f"{s3_bucket}/out/_grow/op.json")


def test_a_folder_without_a_build_is_one_line_exit_2(tmp_path, capsys):
    assert cli_main(["retry", str(tmp_path)]) == 2
    assert "no finished mmcurate build" in capsys.readouterr().err
    assert cli_main(["retry", str(tmp_path), "--storage-options", "[1]"]) == 2


def counts(out: Path) -> list[tuple]:
    stats = json.loads((out / "stats.json").read_text())
    return [(s["name"], s["in"], s["out"], s["dropped"]) for s in stats["stages"]]


def fates(out: Path) -> list[tuple]:
    wanted = ("key", "url", "sha256", "drop_reason", "drop_stage", "duplicate_of")
    return [tuple(row[c] for c in wanted) for row in signature_rows(out)]


def signature_rows(out: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(out / "signatures").to_pylist()

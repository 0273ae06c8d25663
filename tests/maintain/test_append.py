"""`mmcurate append OUTPUT CONFIG.yaml`: a second URL list added to a finished build goes
through the build's stages, is deduplicated against everything already there (an exact
copy of an earlier sample is dropped: the earlier one stays), only new shards are written
(the old ones byte-identical), keys stay unique, and the kept set equals one build of both
lists; a kill -9 midway then a rerun gives the same result."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mmcurate.pipeline.cli import main as cli_main
from mmcurate.pipeline.maintain.append import append

from tests.host_server import Route, Site
from tests.kit_builds import wait_for
from tests.kit_grow import (
    assert_manifest_matches,
    build,
    kept,
    kept_urls,
    photo,
    shard_bytes,
    url_list,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def two_lists(tmp_path):
    """List one: 12 photos (#4 twice). List two: 4 new photos, byte copies of #2 and #9 of
    list one, a copy of its own first photo, and a 404. The build of list one."""
    site = Site().start()
    bodies = [photo(i) for i in range(16)]
    first = [site.route(f"/a/{i}.jpg", Route(200, bodies[i])) for i in range(12)]
    first.append(site.route("/a/again-4.jpg", Route(200, bodies[4])))
    second = [site.route(f"/b/{i}.jpg", Route(200, bodies[i])) for i in range(12, 16)]
    second += [site.route(f"/b/copy-{i}.jpg", Route(200, bodies[i])) for i in (2, 9, 12)]
    second.append(site.base + "/b/gone.jpg")
    lists = (url_list(tmp_path / "one.parquet", first), url_list(tmp_path / "two.parquet", second))
    build(lists[0], tmp_path / "out")
    yield site, lists, tmp_path / "out"
    site.stop()


def source(path: Path) -> dict:
    return {"kind": "urls", "path": str(path), "files_per_task": 10}


def test_append_dedupes_across_both_lists_and_writes_only_new_shards(two_lists, tmp_path):
    site, (one, two), out = two_lists
    before = shard_bytes(out)
    manifest = append(str(out), source(two), {})
    both = url_list(tmp_path / "both.parquet", [*urls_of(one), *urls_of(two)])
    build(both, tmp_path / "reference")  # one build of both lists

    assert kept_urls(out) == kept_urls(tmp_path / "reference")
    assert kept(out) == kept(tmp_path / "reference")
    urls = set(kept_urls(out).values())
    assert f"{site.base}/a/2.jpg" in urls and f"{site.base}/b/copy-2.jpg" not in urls
    assert f"{site.base}/b/12.jpg" in urls and f"{site.base}/b/copy-12.jpg" not in urls
    after = shard_bytes(out)
    assert {k: after[k] for k in before} == before  # every earlier shard byte-identical
    record = manifest["maintenance"][-1]
    assert record["added"] == 4 and not record["shards_rewritten"]
    assert {n for n in after if n.endswith(".tar")} - set(before) == set(record["shards_added"])
    assert_manifest_matches(out)
    keys = [k for k in kept_urls(out)]
    assert len(keys) == len(set(keys))


def test_an_append_killed_midway_then_run_again_gives_the_same_result(two_lists, tmp_path):
    _, (_, two), out = two_lists
    twin = tmp_path / "twin"
    shutil.copytree(out, twin)
    append(str(twin), source(two), {})  # uninterrupted
    config = tmp_path / "more.yaml"
    config.write_text(yaml.safe_dump({"source": source(two)}))

    command = [sys.executable, "-m", "mmcurate", "append", str(out), str(config), "--no-progress"]
    driver = subprocess.Popen(
        command, cwd=REPO, start_new_session=True, stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "append.err").open("wb"),
    )  # fmt: skip
    signatures = out / "_grow" / "build" / "_work" / "signatures"
    wait_for(lambda: any(signatures.glob("part-*.parquet")) or driver.poll() is not None)
    os.killpg(driver.pid, signal.SIGKILL)  # its own process group, by its pid
    assert driver.wait() == -signal.SIGKILL, (tmp_path / "append.err").read_text()
    assert cli_main(command[3:]) == 0

    assert shard_bytes(out) == shard_bytes(twin)
    assert kept_urls(out) == kept_urls(twin)
    assert_manifest_matches(out)
    assert not (out / "_grow").exists()


def test_an_append_config_with_stages_is_one_line_exit_2(two_lists, tmp_path, capsys):
    _, (_, two), out = two_lists
    config = tmp_path / "more.yaml"
    config.write_text(yaml.safe_dump({"source": source(two), "stages": []}))
    assert cli_main(["append", str(out), str(config)]) == 2
    assert "only `source`" in capsys.readouterr().err


def urls_of(path: Path) -> list[str]:
    import pyarrow.parquet as pq

    return pq.read_table(path)["url"].to_pylist()


def test_an_append_never_brings_back_what_a_remove_took_out(two_lists, tmp_path):
    """List two holds a byte copy of list one's #2 under another URL: once a remove took #2
    out, the copy is left out of the append too (audit.jsonl's content hashes), and counted."""
    site, (_, two), out = two_lists
    takedown = tmp_path / "takedown.txt"
    takedown.write_text(f"{site.base}/a/2.jpg\n")
    assert cli_main(["remove", str(out), "--urls", str(takedown)]) == 0
    manifest = append(str(out), source(two), {})
    urls = set(kept_urls(out).values())
    assert f"{site.base}/a/2.jpg" not in urls and f"{site.base}/b/copy-2.jpg" not in urls
    assert f"{site.base}/b/12.jpg" in urls  # the rest of list two still arrives
    assert manifest["maintenance"][-1]["taken_down"] == 1
    assert_manifest_matches(out)


def test_remove_and_append_never_run_over_each_others_unfinished_work(two_lists, tmp_path, capsys):
    """An unfinished append (its `_grow/op.json`) stops a remove, and an unfinished remove (its
    `_work/remove/plan.json`) stops an append and a retry: each rewrites what the other reads.
    One line, exit 2, naming the command to run again."""
    site, (_, two), out = two_lists
    listed = tmp_path / "urls.txt"
    listed.write_text(f"{site.base}/a/3.jpg\n")
    (out / "_grow").mkdir()
    (out / "_grow" / "op.json").write_text('{"op": "x", "command": "append"}')
    assert cli_main(["remove", str(out), "--urls", str(listed)]) == 2
    assert "unfinished `mmcurate append`" in capsys.readouterr().err
    (out / "_grow" / "op.json").unlink()
    (out / "_grow").rmdir()
    (out / "_work" / "remove").mkdir(parents=True)
    (out / "_work" / "remove" / "plan.json").write_text('{"plan": 1}')
    config = tmp_path / "more.yaml"
    config.write_text(yaml.safe_dump({"source": source(two)}))
    assert cli_main(["append", str(out), str(config)]) == 2
    assert cli_main(["retry", str(out)]) == 2
    assert capsys.readouterr().err.count("unfinished `mmcurate remove`") == 2


def test_a_build_that_publishes_embeddings_is_refused_in_one_line(two_lists, tmp_path, capsys):
    """retry and append do not update embeddings/ yet: such a build is refused, not left with
    embeddings out of step with its shards."""
    _, (_, two), out = two_lists
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["files"] = [*manifest["files"], "embeddings/img_emb/img_emb_0000.npy"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    before = shard_bytes(out)
    config = tmp_path / "more.yaml"
    config.write_text(yaml.safe_dump({"source": source(two)}))
    assert cli_main(["append", str(out), str(config)]) == 2
    assert cli_main(["retry", str(out)]) == 2
    assert capsys.readouterr().err.count("publishes embeddings/") == 2
    assert shard_bytes(out) == before

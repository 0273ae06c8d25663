"""`mmcurate remove`, step 3: the staged files moved over the build's, in staged.json's order
(shards, their parquets, signatures, embeddings, buckets, stats, shard index, audit), then
report.html rendered again, then the manifest (the commit: until it moves, the old manifest
still names the old shards' sha256, so a reader that checks them skips a rewritten shard
rather than trusting it), then the scratch dropped.

Each swap is idempotent: a staged file that is still there is moved (a rename on file systems;
copy then delete on object stores, where a kill between the two only repeats the copy), one
that is gone was moved by an earlier run; a shard to delete is deleted if present. So a kill
at any point followed by the same command ends exactly where an uninterrupted run ends.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from typing import Any

from mmcurate.core.storage import is_local, join, remove_tree, with_retries
from mmcurate.pipeline.maintain.common import FinishedBuild
from mmcurate.pipeline.output.names import MANIFEST, REMOVE, WORK_DIR
from mmcurate.pipeline.output.names import remove_staged as staged_name

log = logging.getLogger("mmcurate.remove")


def swap_all(build: FinishedBuild, actions: list[list[str]]) -> None:
    """Every swap in order, the report before the manifest; then the scratch dropped."""
    for rel, action in actions:
        if rel == MANIFEST:
            rerender_report(build)
        swap(build, rel, action)
    drop_scratch(build)


def swap(build: FinishedBuild, rel: str, action: str) -> None:
    fs, target = build.fs, build.path(rel)
    if action == "delete":
        with contextlib.suppress(FileNotFoundError):
            fs.rm_file(target)
        return
    staged = build.work(staged_name(rel))
    if is_local(fs):
        with contextlib.suppress(FileNotFoundError):  # moved by an earlier run
            os.replace(staged, target)
        return
    fs.invalidate_cache(os.path.dirname(staged))
    if not fs.exists(staged):
        return
    with_retries(lambda: fs.copy(staged, target))
    with contextlib.suppress(FileNotFoundError):
        fs.rm_file(staged)


def rerender_report(build: FinishedBuild) -> None:
    """report.html drawn again from the swapped files (it shows samples: the removed ones must
    go), while the new manifest is still staged; a report that cannot be drawn is deleted
    rather than left showing removed samples (`mmcurate report` draws it again)."""
    staged = build.work(staged_name(MANIFEST))
    try:
        manifest = json.loads(build.fs.cat_file(staged))
    except FileNotFoundError:
        return  # the manifest moved already: so did the report
    from mmcurate.pipeline.report.page import render_report

    try:
        render_report(build.url, build.storage_options, manifest)
    # Why broad: the report is a view; nothing in it may stop the commit (as in a build).
    except Exception as err:  # noqa: BLE001
        log.warning("report.html not drawn again (%s: %s); deleted", type(err).__name__, err)
        with contextlib.suppress(FileNotFoundError):
            build.fs.rm_file(build.path("report.html"))


def drop_scratch(build: FinishedBuild) -> None:
    """`_work/remove/`, then `_work/` if nothing else is in it."""
    fs = build.fs
    remove_tree(fs, build.work(REMOVE))
    work = join(build.root, WORK_DIR)
    fs.invalidate_cache(work)
    with contextlib.suppress(FileNotFoundError):
        if not [p for p in fs.find(work, withdirs=True) if p.rstrip("/") != work.rstrip("/")]:
            remove_tree(fs, work)


def read_staged(build: FinishedBuild) -> dict[str, Any] | None:
    from mmcurate.pipeline.output.existing import read_json
    from mmcurate.pipeline.output.names import remove_file

    staged = read_json(build.fs, build.work(remove_file("staged.json")))
    return staged if isinstance(staged, dict) and "actions" in staged else None

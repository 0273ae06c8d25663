"""Takedowns stay taken down: `mmcurate retry` and `mmcurate append` never add back a sample
whose content a `mmcurate remove` took out of the build. The build's `audit.jsonl` lists the
removed samples' content hashes (`content_sha256`, when the build computed a `sha256`); new
rows with one of them are left out before any decision, and counted."""

from __future__ import annotations

import json
import logging

import pyarrow as pa
import pyarrow.compute as pc
from mmcurate.core.storage import filesystem, join, with_retries
from mmcurate.pipeline.maintain.remove_audit import AUDIT

log = logging.getLogger("mmcurate.maintain")


def removed_hashes(url: str, storage_options: dict) -> set[str]:
    """Every content hash the build's removes recorded (an unreadable line: passed over)."""
    fs, root = filesystem(url, storage_options)
    try:
        blob = with_retries(lambda: fs.cat_file(join(root, AUDIT)))
    except FileNotFoundError:
        return set()
    hashes: set[str] = set()
    for line in blob.decode(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        found = record.get("content_sha256") if isinstance(record, dict) else None
        hashes.update(h for h in found or () if isinstance(h, str))
    return hashes


def without_taken_down(new: pa.Table, hashes: set[str]) -> tuple[pa.Table, int]:
    """The new rows less those whose `sha256` a remove took out; and how many those were."""
    if not hashes or "sha256" not in new.column_names or new.num_rows == 0:
        return new, 0
    taken = pc.is_in(new["sha256"], value_set=pa.array(sorted(hashes), new["sha256"].type))
    taken = pc.fill_null(taken, False)
    count = int(pc.sum(taken).as_py() or 0)
    if count:
        log.info("left out %d new samples a remove took out of this build before", count)
    return new.filter(pc.invert(taken)), count

"""What `mmcurate remove` records: one line in the build's `audit.jsonl` per remove that took
something out (what was asked: the selector and its file's sha256, never its values; when;
how many; the removed samples' hashes, never their content or captions), the `remove` stage
in stats.json, and buckets.json counted again."""

from __future__ import annotations

import json
from typing import Any

from mmcurate.core.storage import with_retries
from mmcurate.pipeline.maintain.common import FinishedBuild
from mmcurate.pipeline.output.buckets_file import bucket_figures, group_sums

AUDIT = "audit.jsonl"
STAGE = "remove"


def audit_record(plan: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    """The audit line: `record_sha256` hashes each removed sample's bytes as its shard held
    them (its tar record); `content_sha256` is the build's own sha256 of each (the fetched or
    stored media, as download or exact_dedupe recorded it), where the build has one."""
    records = sorted(h for shard in plan["shards"].values() for h in shard["record_sha256"])
    return {
        "command": "remove",
        "when": plan["when"],
        **plan["request"],
        **{k: summary[k] for k in ("removed", "signature_rows_deleted")},
        **{k: summary[k] for k in ("samples_before", "samples_after")},
        **{k: summary[k] for k in ("shards_rewritten", "shards_deleted")},
        "record_sha256": records,
        "content_sha256": plan["content_sha256"],
    }


def audit_bytes(build: FinishedBuild, plan: dict[str, Any], summary: dict[str, Any]) -> bytes:
    """The audit log with this remove's line appended (object stores cannot append: the file
    is written whole, as every staged file is)."""
    try:
        before = with_retries(lambda: build.fs.cat_file(build.path(AUDIT)))
    except FileNotFoundError:
        before = b""
    if before and not before.endswith(b"\n"):
        before += b"\n"
    line = json.dumps(audit_record(plan, summary), sort_keys=True)
    return before + line.encode() + b"\n"


def stats_after(stats: dict[str, Any], plan: dict[str, Any], summary: dict[str, Any]) -> dict:
    """stats.json with a last stage `remove` (in: the samples before the first remove; out:
    the samples now; dropped by selector: `removed_keys`, `removed_urls`, `removed_sha256`,
    `removed_like`), and samples_out the samples now. Each remove adds to the same entry."""
    stages = [dict(s) for s in stats.get("stages", [])]
    if not stages or stages[-1].get("name") != STAGE:
        stages.append({"name": STAGE, "in": summary["samples_before"], "out": 0, "dropped": {}})
    entry = stages[-1]
    reason = f"removed_{plan['request']['selector']}"
    dropped = dict(entry.get("dropped", {}))
    dropped[reason] = dropped.get(reason, 0) + summary["removed"]
    entry.update(out=summary["samples_after"], dropped=dropped)
    return {**stats, "stages": stages, "samples_out": summary["samples_after"]}


def buckets_after(
    build: FinishedBuild, groups: list[tuple[str, bool]], staged: str
) -> dict[str, Any] | None:
    """buckets.json counted again over the signatures as they will be (a changed group's from
    its staged copy); its bucket list and parameters stay. None: the build has none."""
    try:
        old = json.loads(with_retries(lambda: build.fs.cat_file(build.path("buckets.json"))))
    except FileNotFoundError:
        return None
    sums = [
        group_sums(
            staged if changed else build.url,
            build.storage_options,
            int(rel.rsplit("-", 1)[1].removesuffix(".parquet")),
        )
        for rel, changed in groups
    ]
    return old | bucket_figures(list(old.get("counts", {})), sums)

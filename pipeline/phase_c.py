"""Phase C and the commit: each signature group's kept rows, the shard plan streamed from
their sizes (pipeline/output/layout.py), each shard written in a task from byte spans of the
candidates; then per group the published signatures and embeddings, stats.json, report.html
and manifest.json last (the commit marker), and the scratch dropped."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from functools import partial
from typing import Any

from mmcurate.core.atomic import write_bytes_atomic
from mmcurate.core.manifest import manifest_document
from mmcurate.core.mapreduce import Runner
from mmcurate.core.redaction import redact
from mmcurate.core.storage import filesystem, join
from mmcurate.pipeline.build_run import BuildRun
from mmcurate.pipeline.config import BuildConfig
from mmcurate.pipeline.output.buckets_file import write_buckets_file
from mmcurate.pipeline.output.claim import Claim, drop_work, final_files, record_files
from mmcurate.pipeline.output.groups import Groups
from mmcurate.pipeline.output.layout import (
    ShardLayout,
    kept_starts,
    kept_tables,
    plan_layout,
    spans_spec,
)
from mmcurate.pipeline.output.markers import done_shards, mark, shard_marker
from mmcurate.pipeline.output.names import MANIFEST, output_files, shard_files
from mmcurate.pipeline.output.publish import Publication, publish, wids_index
from mmcurate.pipeline.output.retire import shard_written, start_retiring
from mmcurate.pipeline.output.shard_format import ShardSpec
from mmcurate.pipeline.output.shard_metadata import plan_shard_schema
from mmcurate.pipeline.output.shard_refs import referring_parts, with_refs
from mmcurate.pipeline.output.shards import write_shard
from mmcurate.pipeline.output.stats import timing_columns
from mmcurate.pipeline.phase_a import stopped
from mmcurate.pipeline.report.page import render_report

log = logging.getLogger("mmcurate.build")


@dataclass(frozen=True)
class Outcome:
    """What the phases leave for the commit (pipeline/build.py builds it)."""

    groups: Groups
    plan: Publication  # which signature rows and embeddings get published, and where
    stats: dict[str, Any]  # stats.json, less the phase times
    entries: list[dict]  # the shards' manifest entries, by name
    phases: dict[str, float]  # seconds per phase so far


def phase_c(
    run: BuildRun, groups: Groups, final: str, runner: Runner
) -> tuple[list[dict], ShardLayout]:
    """Write the final shards; returns manifest entries, where groups and shards start, and
    the groups' stats shares."""
    cfg, stages, claim = run.cfg, run.stages, run.claim
    found = kept_tables(groups, final, timing_columns(stages), runner)
    kept = [share["kept"] for share in found]
    specs = plan_layout(groups, kept, cfg.output.shard_max_samples, cfg.output.shard_max_bytes)
    parts = sorted({part for share in found for part in share["parts"]})
    candidates = join(groups.work_url, "candidates")
    fields, keys = plan_shard_schema(candidates, parts, cfg.storage_options, runner)
    starts = kept_starts(kept)
    # one parquet schema for all shards, and one key set in every sample's json
    specs = [spec.replace(fields=fields, json_keys=keys) for spec in specs]
    record_files(claim, [name for spec in specs for name in shard_files(spec.name)])
    done = done_shards(claim)
    todo = [i for i, s in enumerate(specs) if s.name not in done]
    referring = referring_parts(claim)  # samples whose payloads are stored elsewhere
    retirer = start_retiring(groups, found, specs, done, referring, runner)
    task = partial(shard_task, groups=groups, starts=starts, cfg=cfg, claim=claim)
    task = partial(task, referring=frozenset(retirer.reading))
    written = partial(shard_written, retirer=retirer, todo=todo)
    entries = run.runtime.run_tasks(
        [specs[i] for i in todo], task, "shards", progress=run.progress, on_result=written
    )
    stopped(claim, entries)
    entries += [done[s.name] for s in specs if s.name in done]
    shard_starts = [spec.start for spec in specs]
    layout = ShardLayout(starts, shard_starts, [share["counts"] for share in found])
    return sorted(entries, key=lambda e: e["name"]), layout


def shard_task(
    spec: ShardSpec,
    groups: Groups,
    starts: list[int],
    cfg: BuildConfig,
    claim: Claim,
    referring: frozenset[int] = frozenset(),
) -> dict | None:
    """Ray task body: write one planned shard, then its marker (so a rerun skips it); returns
    its manifest entry. None (nothing written) once another run holds the output."""
    if not claim.holds():
        return None
    candidates = join(groups.work_url, "candidates")
    spec = with_refs(spans_spec(spec, groups, starts), candidates, referring, cfg.storage_options)
    entry = write_shard(spec, candidates, cfg.output.path, cfg.storage_options)
    mark(claim, shard_marker(groups.work_url, entry["name"]), entry)
    return entry


def commit(run: BuildRun, outcome: Outcome, runner: Runner) -> dict[str, Any]:
    """Signatures, embeddings and stats, then the manifest (the commit marker), then drop the
    scratch. Every file is recorded before it is written; the manifest lists those that were."""
    cfg, claim = run.cfg, run.claim
    groups, stats, entries = outcome.groups, outcome.stats, outcome.entries
    fs, out = filesystem(cfg.output.path, cfg.storage_options)
    expected = output_files([e["name"] for e in entries], groups.count)
    record_files(claim, [*expected, MANIFEST])
    publish(groups, outcome.plan, runner)
    write_buckets_file(cfg, groups.count, runner)  # counted from the signatures just published
    stats["phases"] = dict(outcome.phases)
    write_bytes_atomic(fs, join(out, "stats.json"), json.dumps(stats, indent=2).encode())
    config = redact(json.loads(cfg.model_dump_json()))
    models = [model for stage in run.stages for model in stage.models()]
    manifest = manifest_document(entries, config, claim.build_id, models)
    write_bytes_atomic(fs, join(out, "shardindex.json"), json.dumps(wids_index(entries)).encode())
    write_report(cfg, manifest)
    manifest["files"] = final_files(claim, expected)  # TookOver if another run holds it now
    write_bytes_atomic(fs, join(out, MANIFEST), json.dumps(manifest, indent=2).encode())
    drop_work(fs, out)
    return manifest


def write_report(cfg: BuildConfig, manifest: dict) -> None:
    """report.html before the manifest; a report that fails is logged, never fails the build."""
    try:
        render_report(cfg.output.path, cfg.storage_options, manifest, cfg.source.path)
    # Why broad: the report is a view of a finished build; nothing in it may stop the commit.
    except Exception as err:  # noqa: BLE001
        log.warning("report.html not written: %s: %s", type(err).__name__, err)

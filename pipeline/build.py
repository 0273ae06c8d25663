"""A build, in three phases (DESIGN.md, "Data flow").

A. Per partition, in a Ray task: read, run the per-sample stages, write the live samples as a
   candidate tar, then one signature row per input sample (no media) as its completion mark.
B. On signatures only, in tasks over groups of partitions (pipeline/decide.py): repeated keys,
   then each global decision (dedupe, top fraction); the driver holds file lists and counts.
C. Each group's kept rows and stats share (tasks), the shard plan streamed from their sizes
   (pipeline/layout.py), each shard written in a Ray task; then per group the published
   signatures and embeddings, stats.json, and manifest.json last (the commit marker).
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from functools import partial
from typing import Any

import pyarrow as pa

from core.config_io import ConfigError
from core.manifest import manifest_document
from core.mapreduce import LocalRunner, Runner
from core.redaction import redact, redact_text
from core.spill import (
    Spilled,
    remove_folder,
    set_task_folder,
    spill_folder,
    sweep_folders,
)
from core.storage import (
    check_reachable,
    filesystem,
    join,
    write_bytes_atomic,
    write_parquet,
)
from pipeline.actors import RemoteEncoder, start_pools, stop_pools
from pipeline.buckets_file import write_buckets_file
from pipeline.candidates import ClaimLost, noted, run_chain, write_candidate
from pipeline.config import BuildConfig, check_paths, check_ray_resources
from pipeline.decide import decide
from pipeline.groups import ROWS_PER_GROUP, Groups, plan_groups, scan_footers
from pipeline.layout import kept_starts, kept_tables, plan_layout, spans_spec
from pipeline.media_index import (
    Index,
    PartitionMedia,
    finish_partition,
    partition_done,
    start_run_index,
)
from pipeline.publish import (
    MANIFEST,
    Publication,
    output_files,
    publish,
    shard_files,
    wids_index,
)
from pipeline.raysession import connect, fitted_memory, run_tasks
from pipeline.raysession import runner as runtime_runner
from pipeline.report import render_report
from pipeline.resume import (
    AlreadyBuilt,
    Claim,
    build_identity,
    claim_output,
    drop_work,
    final_files,
    record_files,
)
from pipeline.retire import shard_written, start_retiring
from pipeline.samples import Reading
from pipeline.shard_refs import referring_parts, with_refs
from pipeline.shards import (
    candidate_metadata,
    candidate_name,
    done_parts,
    done_shards,
    mark,
    metadata_name,
    part_marker,
    plan_metadata_fields,
    shard_marker,
    write_shard,
)
from pipeline.signatures import signature_table
from pipeline.source_staging import stage_sources
from pipeline.sources import plan_source, read_chunks
from pipeline.stats import build_stats, merge_counts, timing_columns
from stages.base import DROP, Stage
from stages.registry import build_stages, stage_order

log = logging.getLogger("mmcurate.build")
# Phases B and C run their tasks in this process up to this many signature rows: below it a
# round of Ray tasks costs more than the work (the same code runs either way).
IN_PROCESS_ROWS = 200_000
GROUP_ROWS = ROWS_PER_GROUP  # signature rows a phase B/C task handles (pipeline/groups.py)


def run_build(cfg: BuildConfig, progress: bool = True) -> dict[str, Any]:
    """Run (or resume) a whole build; returns the manifest. Config problems raise ConfigError
    before anything runs; rerunning a finished build returns its manifest untouched."""
    stages = build_stages(cfg.stages)
    parts = preflight(cfg, stages)
    identity = build_identity(cfg, parts)
    try:
        claim = claim_output(cfg, identity)
    except AlreadyBuilt as built:
        log.info("%s already holds this build; nothing to do", redact_text(cfg.output.path))
        return built.manifest
    try:
        return build_claimed(cfg, stages, parts, claim, progress)
    except Exception:
        if not claim.holds():  # another run took over (and its scratch replaced this one's)
            raise claim.lost() from None
        raise


def build_claimed(
    cfg: BuildConfig, stages: list[Stage], parts: list[dict], claim: Claim, progress: bool
) -> dict[str, Any]:
    """The phases and the commit, while this run holds output.path."""
    connect(cfg.ray)
    timer = PhaseTimer()
    work_url = claim.work_url
    # After the claim: staged copies of the source (gzip lists, huge row groups) are _work scratch.
    parts = stage_sources(parts, work_url, cfg.storage_options, partial(run_tasks, label="staging"))
    timer.run("candidates", phase_a, cfg, stages, parts, claim, progress)
    groups, schema = signature_groups(cfg, parts, work_url)
    runner = LocalRunner() if sum(groups.rows) <= IN_PROCESS_ROWS else runtime_runner()
    final = timer.run("decide", decide, groups, stages, runner)
    claim.check()  # another run's scratch may have replaced ours: stop before using it
    args = (cfg, groups, stages, final, runner, claim, progress)
    entries, layout = timer.run("shards", phase_c, *args)
    plan = Publication(
        cfg.output.path, final, schema, layout["kept_starts"], layout["shard_starts"]
    )
    stats = build_stats(merge_counts(layout["counts"]), stages)
    args = (cfg, groups, plan, stats, entries, timer, claim, runner)
    return timer.run("commit", commit, *args)


def preflight(cfg: BuildConfig, stages: list[Stage]) -> list[dict[str, Any]]:
    """Fail fast, before Ray starts: paths apart, models, storage reachable, source non-empty."""
    check_paths(cfg)
    check_ray_resources(cfg)
    for stage in stages:
        stage.check()
    check_reachable(cfg.source.path, cfg.storage_options, "source.path")
    check_reachable(cfg.output.path, cfg.storage_options, "output.path")
    parts = plan_source(cfg.source, cfg.storage_options)
    if not parts:
        raise ConfigError(f"source.path: no input files in {cfg.source.path}")
    return parts


# ---- phase A -------------------------------------------------------------------------------


def phase_a(
    cfg: BuildConfig, stages: list[Stage], parts: list[dict], claim: Claim, progress: bool
) -> None:
    """Process the partitions not done by an earlier run of this build (each writes its
    signatures file). Model stages that want an actor pool get one for this phase."""
    claim.check()
    done = done_parts(claim)
    todo = [p for p in parts if p["part"] not in done]
    if done:
        log.info("resuming: %d of %d partitions already done", len(done), len(parts))
    encoders = start_pools(stages) if todo else {}  # stops its own pools if it fails
    index = None
    try:
        index = start_run_index(claim, done, todo, cfg.output)
        client = None if index is None else index.client  # plain data, for the tasks
        task = partial(partition_task, cfg=cfg, claim=claim, encoders=encoders, media=client)
        arrived = partial(partition_done, run_index=index, todo=todo)
        memory = fitted_memory(cfg)
        held = run_tasks(todo, task, "partitions", progress, cfg.ray.resources, memory, arrived)
    finally:
        stop_pools(encoders)
        if index is not None:
            index.stop()
    stopped(claim, held)


def stopped(claim: Claim, results: list) -> None:
    """TookOver when another run took the claim (a task found it gone and stopped)."""
    claim.check()
    if None in results:
        raise claim.lost()


def partition_task(
    part: dict,
    cfg: BuildConfig,
    claim: Claim,
    encoders: dict[int, RemoteEncoder],
    media: Index | None = None,
) -> int | None:
    """Ray task body: one partition, with the worker's stages; a model stage served by an
    actor pool gets the pool's encoder, starting its turns at this partition. None (nothing
    done) once another run holds the output."""
    if not claim.holds():
        return None
    stages = [
        stage.served_by(encoders[stage.index].starting_at(part["part"]))
        if stage.index in encoders
        else stage
        for stage in worker_stages(cfg)
    ]
    return process_partition(part, cfg, stages, claim, media)


_WORKER_STAGES: dict[str, list[Stage]] = {}


def worker_stages(cfg: BuildConfig) -> list[Stage]:
    """Stages in execution order, built once per worker process and config (set-up, e.g. a
    model load, is paid once)."""
    key = cfg.model_dump_json(include={"stages"})
    if key not in _WORKER_STAGES:
        _WORKER_STAGES.clear()
        _WORKER_STAGES[key] = stage_order(build_stages(cfg.stages))
    return _WORKER_STAGES[key]


def process_partition(
    part: dict, cfg: BuildConfig, stages: list[Stage], claim: Claim, index: Index | None = None
) -> int | None:
    """Candidates, their metadata, who wrote them (the marker), then the signatures: written
    last, they mark it done. Written only while this run still holds the output (else None).
    The partition streams through in chunks (`source.chunk_bytes`); media above
    `source.spill_bytes` wait on local disk, in a spill folder of this task's own."""
    sweep_folders()  # those of killed workers
    folder = spill_folder()
    set_task_folder(folder)
    try:
        return write_partition(part, cfg, stages, claim, folder, index)
    finally:
        set_task_folder(None)
        remove_folder(folder)


def write_partition(
    part: dict, cfg: BuildConfig, stages: list[Stage], claim: Claim, spill: str, index: Index | None
) -> int | None:
    """Stored payloads are referred to (pipeline/media_index.py), registered once done."""
    src = cfg.source
    reading = Reading(cfg.ray.batch_size, src.chunk_bytes, src.spill_bytes, spill)
    inputs: deque[list[Spilled]] = deque()  # each chunk's Spilled values as it was read
    chunks = map(partial(noted, inputs=inputs), read_chunks(part, cfg.storage_options, reading))
    folder = join(claim.work_url, "candidates")
    url = join(folder, candidate_name(part["part"]))
    media = None if index is None else PartitionMedia(part["part"], index)
    try:
        chain = run_chain(chunks, stages)
        rows = write_candidate(chain, inputs, url, cfg.storage_options, claim, media)
    except ClaimLost:
        return None
    live = [row for row in rows if row[DROP] is None]  # key, caption, json: shard metadata
    write_parquet(
        candidate_metadata(live), join(folder, metadata_name(part["part"])), cfg.storage_options
    )
    record = {"part": part["part"]} | finish_partition(media, folder, cfg.storage_options)
    mark(claim, part_marker(claim.work_url, part["part"]), record)
    signatures_url = join(claim.work_url, "signatures", f"part-{part['part']:06d}.parquet")
    write_parquet(signature_table(rows), signatures_url, cfg.storage_options)
    if media is not None:
        media.register()  # pending until the driver has this task's result
    return len(rows)


# ---- phase B: decisions on partitioned signatures (pipeline/decide.py) -----------------------


def signature_groups(
    cfg: BuildConfig, parts: list[dict], work_url: str
) -> tuple[Groups, pa.Schema]:
    """The partitions' signature row counts, bytes and columns (footers only), grouped."""
    numbers = [p["part"] for p in parts]
    rows, sizes, schema = scan_footers(work_url, numbers, cfg.storage_options, runtime_runner())
    members = plan_groups(numbers, rows, GROUP_ROWS, sizes=sizes)  # capped by rows and bytes
    counts = dict(zip(numbers, rows, strict=True))
    group_rows = [sum(counts[p] for p in group) for group in members]
    return Groups(work_url, cfg.storage_options, members, group_rows), schema


# ---- phase C and commit --------------------------------------------------------------------


def phase_c(
    cfg: BuildConfig,
    groups: Groups,
    stages: list[Stage],
    final: str,
    runner: Runner,
    claim: Claim,
    progress: bool,
) -> tuple[list[dict], dict[str, list]]:
    """Write the final shards; returns manifest entries, where groups and shards start, and
    the groups' stats shares."""
    found = kept_tables(groups, final, timing_columns(stages), runner)
    kept = [share["kept"] for share in found]
    specs = plan_layout(groups, kept, cfg.output.shard_max_samples, cfg.output.shard_max_bytes)
    parts = sorted({part for share in found for part in share["parts"]})
    candidates = join(groups.work_url, "candidates")
    fields = plan_metadata_fields(candidates, parts, cfg.storage_options, runner)
    starts = kept_starts(kept)
    specs = [spec | {"fields": fields} for spec in specs]  # one parquet schema for all shards
    record_files(claim, [name for spec in specs for name in shard_files(spec["name"])])
    done = done_shards(claim)
    todo = [i for i, s in enumerate(specs) if s["name"] not in done]
    referring = referring_parts(claim)  # samples whose payloads are stored elsewhere
    retirer = start_retiring(groups, found, specs, done, referring, runner)
    task = partial(shard_task, groups=groups, starts=starts, cfg=cfg, claim=claim)
    task = partial(task, referring=frozenset(retirer.reading))
    written = partial(shard_written, retirer=retirer, todo=todo)
    entries = run_tasks([specs[i] for i in todo], task, "shards", progress, on_result=written)
    stopped(claim, entries)
    entries += [done[s["name"]] for s in specs if s["name"] in done]
    layout = {
        "kept_starts": starts,
        "shard_starts": [spec["start"] for spec in specs],
        "counts": [share["counts"] for share in found],
    }
    return sorted(entries, key=lambda e: e["name"]), layout


def shard_task(
    spec: dict,
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


def commit(
    cfg: BuildConfig,
    groups: Groups,
    plan: Publication,
    stats: dict[str, Any],
    entries: list[dict],
    timer: PhaseTimer,
    claim: Claim,
    runner: Runner,
) -> dict[str, Any]:
    """Signatures, embeddings and stats, then the manifest (the commit marker), then drop the
    scratch. Every file is recorded before it is written; the manifest lists those that were."""
    fs, out = filesystem(cfg.output.path, cfg.storage_options)
    expected = output_files([e["name"] for e in entries], groups.count)
    record_files(claim, [*expected, MANIFEST])
    publish(groups, plan, runner)
    write_buckets_file(cfg, groups.count, runner)  # counted from the signatures just published
    stats["phases"] = dict(timer.seconds)
    write_bytes_atomic(fs, join(out, "stats.json"), json.dumps(stats, indent=2).encode())
    manifest = manifest_document(entries, redact(json.loads(cfg.model_dump_json())), claim.build_id)
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


class PhaseTimer:
    """Runs phases and records their wall time."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def run(self, name: str, fn: Any, *args: Any) -> Any:
        started = time.perf_counter()
        result = fn(*args)
        self.seconds[name] = round(time.perf_counter() - started, 3)
        log.info("phase %s done in %.1fs", name, self.seconds[name])
        return result

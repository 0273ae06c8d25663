"""A build, in three phases (DESIGN.md, "Data flow").

A. Per partition, in a Ray task: read, run the per-sample stages, write the live samples as a
   candidate tar, then one signature row per input sample (no media) as its completion mark.
B. On the driver, on signatures only: global decisions (dedupe), then stats.
C. Plan the final shards from the kept signatures and write each in a Ray task; then the
   signatures parquet, stats.json, and manifest.json last (the commit marker).
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from core.config_io import ConfigError
from core.manifest import manifest_document
from core.mapreduce import RayRunner
from core.redaction import redact, redact_text
from core.storage import (
    check_reachable,
    filesystem,
    join,
    put_file_atomic,
    write_bytes_atomic,
    write_parquet,
)
from core.tario import write_tar
from pipeline.actors import RemoteEncoder, start_pools, stop_pools
from pipeline.config import BuildConfig, check_paths, check_ray_resources
from pipeline.embeddings import write_embeddings
from pipeline.raysession import connect, run_tasks
from pipeline.report import render_report
from pipeline.resume import (
    MANIFEST,
    WORK_DIR,
    AlreadyBuilt,
    build_identity,
    claim_output,
    done_parts,
    done_shards,
    drop_work,
    final_files,
    output_files,
    read_signatures,
    record_files,
    shard_files,
    shard_marker,
    signatures_name,
)
from pipeline.shards import (
    candidate_name,
    metadata_name,
    plan_metadata_fields,
    shard_specs,
    write_shard,
)
from pipeline.signatures import signature_table, with_string_columns, write_signatures
from pipeline.source_staging import stage_sources
from pipeline.sources import iter_chunks, plan_source, read_partition
from pipeline.stats import build_stats, stage_seconds
from stages.base import DROP, DROP_STAGE, Stage
from stages.registry import build_stages, stage_order

log = logging.getLogger("mmcurate.build")


def run_build(cfg: BuildConfig, progress: bool = True) -> dict[str, Any]:
    """Run (or resume) a whole build; returns the manifest. Config problems raise ConfigError
    before anything runs; rerunning a finished build returns its manifest untouched."""
    stages = build_stages(cfg.stages)
    parts = preflight(cfg, stages)
    identity = build_identity(cfg, parts)
    try:
        claim_output(cfg, identity)
    except AlreadyBuilt as built:
        log.info("%s already holds this build; nothing to do", redact_text(cfg.output.path))
        return built.manifest
    connect(cfg.ray)
    timer = PhaseTimer()
    work_url = join(cfg.output.path, WORK_DIR)
    # After the claim: staged copies of the source (gzip lists, huge row groups) are _work scratch.
    parts = stage_sources(parts, work_url, cfg.storage_options, partial(run_tasks, label="staging"))
    signatures = timer.run("candidates", phase_a, cfg, stages, parts, work_url, progress)
    signatures = timer.run("decide", phase_b, signatures, stages)
    entries, shard_of = timer.run("shards", phase_c, cfg, signatures, work_url, progress)
    signatures = with_string_columns(
        signatures, {"shard": [shard_of.get(k) for k in signatures["__key__"].to_pylist()]}
    )
    stats = build_stats(signatures, stages, stage_seconds(signatures, stages))
    stats["phases"] = timer.seconds
    return timer.run("commit", commit, cfg, signatures, entries, stats, work_url, identity)


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
    cfg: BuildConfig, stages: list[Stage], parts: list[dict], work_url: str, progress: bool
) -> pa.Table:
    """Process the partitions not done by an earlier run; read every partition's signatures.
    Model stages that want an actor pool get one for this phase."""
    done = done_parts(work_url, cfg.storage_options)
    todo = [p for p in parts if p["part"] not in done]
    if done:
        log.info("resuming: %d of %d partitions already done", len(done), len(parts))
    encoders = start_pools(stages) if todo else {}  # stops its own pools if it fails
    try:
        task = partial(partition_task, cfg=cfg, work_url=work_url, encoders=encoders)
        run_tasks(todo, task, "partitions", progress, resources=cfg.ray.resources)
    finally:
        stop_pools(encoders)
    return read_signatures(work_url, [p["part"] for p in parts], cfg.storage_options)


def partition_task(
    part: dict, cfg: BuildConfig, work_url: str, encoders: dict[int, RemoteEncoder]
) -> None:
    """Ray task body: one partition, with the worker's stages; a model stage served by an
    actor pool gets the pool's encoder, starting its turns at this partition."""
    stages = [
        stage.served_by(encoders[stage.index].starting_at(part["part"]))
        if stage.index in encoders
        else stage
        for stage in worker_stages(cfg)
    ]
    process_partition(part, cfg, stages, work_url)


_WORKER_STAGES: dict[str, list[Stage]] = {}


def worker_stages(cfg: BuildConfig) -> list[Stage]:
    """Stages in execution order, built once per worker process and config (set-up, e.g. a
    model load, is paid once)."""
    key = cfg.model_dump_json(include={"stages"})
    if key not in _WORKER_STAGES:
        _WORKER_STAGES.clear()
        _WORKER_STAGES[key] = stage_order(build_stages(cfg.stages))
    return _WORKER_STAGES[key]


def process_partition(part: dict, cfg: BuildConfig, stages: list[Stage], work_url: str) -> int:
    """Candidates, their metadata, then the signatures: written last, they mark it done."""
    rows: list[dict[str, Any]] = []
    chunks = iter_chunks(read_partition(part, cfg.storage_options), cfg.ray.batch_size)
    for chunk in run_chain(chunks, stages):
        rows.extend(
            dict(zip(chunk, values, strict=True)) for values in zip(*chunk.values(), strict=True)
        )
    live = [row for row in rows if row[DROP] is None]
    folder = join(work_url, "candidates")
    spans = write_candidate(live, join(folder, candidate_name(part["part"])), cfg)
    for row, (offset, length) in zip(live, spans, strict=True):
        row["__offset__"], row["__bytes__"] = offset, length
    write_candidate_metadata(live, join(folder, metadata_name(part["part"])), cfg)
    signatures_url = join(work_url, "signatures", signatures_name(part["part"]))
    write_parquet(signature_table(rows), signatures_url, cfg.storage_options)
    return len(rows)


def apply(chunk: dict, stages: list[Stage]) -> dict:
    for stage in stages:
        chunk = stage(chunk)
    return chunk


def run_chain(chunks: Iterator[dict], stages: list[Stage]) -> Iterator[dict]:
    """Run the stages over chunks; leading I/O-bound stages (download) work one chunk ahead
    in a thread, so the network wait overlaps the CPU work on the previous chunk."""
    lead = 0
    while lead < len(stages) and stages[lead].io_bound:
        lead += 1
    if lead == 0:
        yield from (apply(chunk, stages) for chunk in chunks)
        return
    with ThreadPoolExecutor(1, thread_name_prefix="io-ahead") as ahead:
        pending = None
        for chunk in chunks:
            submitted = ahead.submit(apply, chunk, stages[:lead])
            if pending is not None:
                yield apply(pending.result(), stages[lead:])
            pending = submitted
        if pending is not None:
            yield apply(pending.result(), stages[lead:])


def write_candidate(samples: list[dict], url: str, cfg: BuildConfig) -> list[tuple[int, int]]:
    """The partition's live samples as one tar; returns each sample's byte span in it."""
    fs, path = filesystem(url, cfg.storage_options)
    with tempfile.NamedTemporaryFile(prefix="mmcurate-cand-", suffix=".tar") as tmp:
        spans = write_tar(samples, tmp)
        tmp.flush()
        put_file_atomic(fs, tmp.name, path)
    return spans


def write_candidate_metadata(samples: list[dict], url: str, cfg: BuildConfig) -> None:
    """Key, caption and JSON of the live samples, for the per-shard metadata parquet."""
    columns = ("__key__", "txt", "json")
    table = pa.table({c: pa.array([s.get(c) for s in samples], pa.string()) for c in columns})
    write_parquet(table, url, cfg.storage_options)


# ---- phase B -------------------------------------------------------------------------------


def phase_b(signatures: pa.Table, stages: list[Stage]) -> pa.Table:
    """Apply each global stage's decisions to the signatures (drop reason, kept key)."""
    signatures = signatures.sort_by([("__part__", "ascending"), ("__index__", "ascending")])
    drops = signatures[DROP].to_pylist()
    drop_stages = signatures[DROP_STAGE].to_pylist()
    drop_repeated_keys(signatures["__key__"].to_pylist(), drops, drop_stages)
    signatures = with_string_columns(signatures, {DROP: drops, DROP_STAGE: drop_stages})
    duplicate_of: list[str | None] = [None] * signatures.num_rows
    keys = signatures["__key__"].to_pylist()
    runner = RayRunner()
    for stage in (s for s in stages if s.is_global):
        decided = stage.decide(signatures, runner)
        for i, key in enumerate(keys):
            if key in decided and drops[i] is None:
                drops[i], duplicate_of[i] = decided[key]
                drop_stages[i] = stage.label
        signatures = with_string_columns(signatures, {DROP: drops, DROP_STAGE: drop_stages})
    return with_string_columns(signatures, {"duplicate_of": duplicate_of})


def drop_repeated_keys(keys: list[str], drops: list, drop_stages: list) -> None:
    """Keys must be unique in the output: the first live sample (in input order) keeps it."""
    seen: set[str] = set()
    for i, key in enumerate(keys):
        if drops[i] is None:
            if key in seen:
                drops[i], drop_stages[i] = "duplicate_key", "source"
            seen.add(key)


# ---- phase C and commit --------------------------------------------------------------------


def phase_c(
    cfg: BuildConfig, signatures: pa.Table, work_url: str, progress: bool
) -> tuple[list[dict], dict[str, str]]:
    """Write the final shards; returns manifest entries and each kept key's shard."""
    kept = signatures.filter(pc.is_null(signatures[DROP]))
    rows = kept.select(["__key__", "__part__", "__offset__", "__bytes__"]).to_pylist()
    specs = shard_specs(rows, cfg.output.shard_max_samples, cfg.output.shard_max_bytes)
    parts = sorted({row["__part__"] for row in rows})
    candidates = join(work_url, "candidates")
    fields = plan_metadata_fields(candidates, parts, cfg.storage_options, RayRunner())
    specs = [spec | {"fields": fields} for spec in specs]  # one parquet schema for all shards
    record_files(cfg, [name for spec in specs for name in shard_files(spec["name"])])
    done = done_shards(work_url, cfg.storage_options)
    todo = [s for s in specs if s["name"] not in done]
    task = partial(shard_task, work_url=work_url, cfg=cfg)
    entries = run_tasks(todo, task, "shards", progress)
    entries += [done[s["name"]] for s in specs if s["name"] in done]
    shard_of = {
        key: spec["name"] for spec in specs for _, spans in spec["parts"] for key, _, _ in spans
    }
    return sorted(entries, key=lambda e: e["name"]), shard_of


def shard_task(spec: dict, work_url: str, cfg: BuildConfig) -> dict:
    """Ray task body: write one planned shard, then its marker (so a rerun skips it); returns
    its manifest entry."""
    candidates = join(work_url, "candidates")
    entry = write_shard(spec, candidates, cfg.output.path, cfg.storage_options)
    fs, marker = filesystem(shard_marker(work_url, entry["name"]), cfg.storage_options)
    write_bytes_atomic(fs, marker, json.dumps(entry).encode())
    return entry


def commit(
    cfg: BuildConfig,
    signatures: pa.Table,
    entries: list[dict],
    stats: dict,
    work_url: str,
    identity: str,
) -> dict[str, Any]:
    """Signatures and stats, then the manifest (the commit marker), then drop the scratch.
    Every file is recorded before it is written; the manifest lists those that were."""
    fs, out = filesystem(cfg.output.path, cfg.storage_options)
    expected = output_files([e["name"] for e in entries], signatures.num_rows)
    record_files(cfg, [*expected, MANIFEST])
    write_signatures(cfg.output.path, signatures, cfg.storage_options)
    write_embeddings(cfg.output.path, signatures, cfg.storage_options)
    write_bytes_atomic(fs, join(out, "stats.json"), json.dumps(stats, indent=2).encode())
    manifest = manifest_document(entries, redact(json.loads(cfg.model_dump_json())), identity)
    write_bytes_atomic(fs, join(out, "shardindex.json"), json.dumps(wids_index(entries)).encode())
    write_report(cfg, manifest)
    manifest["files"] = final_files(cfg, expected)
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


def wids_index(entries: list[dict]) -> dict[str, Any]:
    """The shard index `wids` (webdataset's indexed reader) loads; urls relative to it."""
    shards = [{"url": e["name"], "nsamples": e["samples"], "filesize": e["bytes"]} for e in entries]
    return {"__kind__": "wids-shard-index-v1", "wids_version": 1, "shardlist": shards}


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

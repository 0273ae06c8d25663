"""A build, in three phases (DESIGN.md, "Data flow").

A. Per partition, in a Ray task: read, run the per-sample stages, write the live samples as a
   candidate tar, then one signature row per input sample (no media) as its completion mark.
B. On signatures only, in tasks over groups of partitions (pipeline/decide/phase_b.py):
   repeated keys, then each global decision (dedupe, top fraction); the driver holds file lists
   and counts.
C. Each group's kept rows and stats share (tasks), the shard plan streamed from their sizes
   (pipeline/output/layout.py), each shard written in a Ray task; then per group the published
   signatures and embeddings, stats.json, and manifest.json last (the commit marker).
"""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import Any

import pyarrow as pa
from mmcurate.core.config_io import ConfigError
from mmcurate.core.mapreduce import LocalRunner
from mmcurate.core.redaction import redact_text
from mmcurate.core.storage import check_reachable
from mmcurate.pipeline.build_run import BuildRun
from mmcurate.pipeline.config import BuildConfig, check_paths, check_ray_resources
from mmcurate.pipeline.decide.phase_b import decide
from mmcurate.pipeline.output.claim import AlreadyBuilt, build_identity, claim_output
from mmcurate.pipeline.output.groups import (
    BYTES_PER_GROUP,
    ROWS_PER_GROUP,
    Groups,
    plan_groups,
    scan_footers,
)
from mmcurate.pipeline.output.publish import Publication
from mmcurate.pipeline.output.stats import build_stats, merge_counts
from mmcurate.pipeline.phase_a import phase_a
from mmcurate.pipeline.phase_c import Outcome, commit, phase_c
from mmcurate.pipeline.runtime.session import Runtime, connect
from mmcurate.pipeline.sources.partitions import plan_source
from mmcurate.pipeline.sources.records import Partition
from mmcurate.pipeline.sources.staging import stage_sources
from mmcurate.stages.base import Stage
from mmcurate.stages.registry import build_stages

log = logging.getLogger("mmcurate.build")
# Phases B and C run their tasks in this process up to this many signature rows: below it a
# round of Ray tasks costs more than the work (the same code runs either way).
IN_PROCESS_ROWS = 200_000
GROUP_ROWS = ROWS_PER_GROUP  # signature rows a phase B/C task handles (pipeline/output/groups.py)


def run_build(
    cfg: BuildConfig, progress: bool = True, runtime: Runtime | None = None
) -> dict[str, Any]:
    """Run (or resume) a whole build; returns the manifest. Config problems raise ConfigError
    before anything runs; rerunning a finished build returns its manifest untouched.
    `runtime`: one `prestart` made (the caller closes it); else the build makes its own
    (`connect`) and closes it when it returns."""
    stages = build_stages(cfg.stages)
    own = runtime is None
    if own and cfg.ray.runtime == "local":
        runtime = connect(cfg.ray)  # the pool's zygote forks before preflight loads any model
    try:
        parts = preflight(cfg, stages)
        identity = build_identity(cfg, parts)
        try:
            claim = claim_output(cfg, identity)
        except AlreadyBuilt as built:
            log.info("%s already holds this build; nothing to do", redact_text(cfg.output.path))
            return built.manifest
        runtime = connect(cfg.ray, runtime)
        return build_claimed(BuildRun(cfg, stages, claim, runtime, progress), parts)
    finally:
        if own and runtime is not None:
            runtime.close()


def build_claimed(run: BuildRun, parts: list[Partition]) -> dict[str, Any]:
    """The phases and the commit, while this run holds output.path."""
    try:
        return build_phases(run, parts)
    except Exception:
        if not run.claim.holds():  # another run took over (and its scratch replaced this one's)
            raise run.claim.lost() from None
        raise


def build_phases(run: BuildRun, parts: list[Partition]) -> dict[str, Any]:
    cfg, runtime = run.cfg, run.runtime
    timer = PhaseTimer()
    work_url = run.claim.work_url
    # After the claim: staged copies of the source (gzip lists, huge row groups) are _work scratch.
    staging = partial(runtime.run_tasks, label="staging")
    parts = stage_sources(parts, work_url, cfg.storage_options, staging)
    timer.run("candidates", phase_a, run, parts)
    groups, schema = signature_groups(cfg, parts, work_url, runtime)
    in_process = sum(groups.rows) <= IN_PROCESS_ROWS
    runner = LocalRunner() if in_process else runtime.runner(BYTES_PER_GROUP)
    final = timer.run("decide", decide, groups, run.stages, runner)
    run.claim.check()  # another run's scratch may have replaced ours: stop before using it
    entries, layout = timer.run("shards", phase_c, run, groups, final, runner)
    plan = Publication(cfg.output.path, final, schema, layout.kept_starts, layout.shard_starts)
    stats = build_stats(merge_counts(layout.counts), run.stages)
    outcome = Outcome(groups, plan, stats, entries, timer.seconds)
    return timer.run("commit", commit, run, outcome, runner)


def preflight(cfg: BuildConfig, stages: list[Stage]) -> list[Partition]:
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


def signature_groups(
    cfg: BuildConfig, parts: list[Partition], work_url: str, runtime: Runtime
) -> tuple[Groups, pa.Schema]:
    """The partitions' signature row counts, bytes and columns (footers only), grouped."""
    numbers = [p.number for p in parts]
    rows, sizes, schema = scan_footers(
        work_url, numbers, cfg.storage_options, runtime.runner(BYTES_PER_GROUP)
    )
    members = plan_groups(numbers, rows, GROUP_ROWS, sizes=sizes)  # capped by rows and bytes
    counts = dict(zip(numbers, rows, strict=True))
    group_rows = [sum(counts[p] for p in group) for group in members]
    return Groups(work_url, cfg.storage_options, members, group_rows), schema


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

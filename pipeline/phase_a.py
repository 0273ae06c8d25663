"""Phase A: one partition per task. Read it in chunks (pipeline/sources/), run the per-sample
stages, write the live samples into the partition's candidate tar as they arrive
(pipeline/output/candidates.py), then its metadata, its marker and, last, one signature row per
input sample (no media): the signatures file marks the partition done."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator
from functools import partial

from mmcurate.core.atomic import write_parquet
from mmcurate.core.progress import report
from mmcurate.core.spill import Spilled, remove_folder, set_task_folder, spill_folder, sweep_folders
from mmcurate.core.storage import join
from mmcurate.pipeline.build_run import BuildRun
from mmcurate.pipeline.config import BuildConfig
from mmcurate.pipeline.output.candidates import ClaimLost, noted, run_chain, write_candidate
from mmcurate.pipeline.output.claim import Claim
from mmcurate.pipeline.output.groups import signatures_name
from mmcurate.pipeline.output.markers import done_parts, mark, part_marker
from mmcurate.pipeline.output.media_index import (
    Index,
    PartitionMedia,
    finish_partition,
    partition_done,
    start_run_index,
)
from mmcurate.pipeline.output.names import CANDIDATES, SIGNATURES
from mmcurate.pipeline.output.shard_metadata import candidate_metadata, metadata_name
from mmcurate.pipeline.output.shards import candidate_name
from mmcurate.pipeline.output.signatures import signature_table
from mmcurate.pipeline.runtime.actors import RemoteEncoder, start_pools, stop_pools
from mmcurate.pipeline.sources.partitions import read_chunks
from mmcurate.pipeline.sources.records import Partition
from mmcurate.pipeline.sources.samples import Reading
from mmcurate.stages.base import DROP, Stage
from mmcurate.stages.registry import build_stages, stage_order

log = logging.getLogger("mmcurate.build")


def phase_a(run: BuildRun, parts: list[Partition]) -> None:
    """Process the partitions not done by an earlier run of this build (each writes its
    signatures file). Model stages that want an actor pool get one for this phase."""
    cfg, claim, local = run.cfg, run.claim, run.runtime.kind == "local"
    claim.check()
    done = done_parts(claim)
    todo = [p for p in parts if p.number not in done]
    if done:
        log.info("resuming: %d of %d partitions already done", len(done), len(parts))
    encoders = start_pools(run.stages, local) if todo else {}  # stops its own pools if it fails
    index = None
    try:
        index = start_run_index(claim, done, todo, cfg.output, local)
        client = None if index is None else index.client  # plain data, for the tasks
        task = partial(partition_task, cfg=cfg, claim=claim, encoders=encoders, media=client)
        held = run.runtime.run_tasks(
            todo,
            task,
            "partitions",
            progress=run.progress,
            resources=cfg.ray.resources,
            memory=run.runtime.task_memory(cfg),
            on_result=partial(partition_done, run_index=index, todo=todo),
        )
    finally:
        stop_pools(encoders)
        if index is not None:
            index.stop()
        sweep_folders(again=True)  # of workers stopped mid-task when a task failed
    stopped(claim, held)


def stopped(claim: Claim, results: list) -> None:
    """TookOver when another run took the claim (a task found it gone and stopped)."""
    claim.check()
    if None in results:
        raise claim.lost()


def partition_task(
    part: Partition,
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
        stage.served_by(encoders[stage.index].starting_at(part.number))
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
    part: Partition, cfg: BuildConfig, stages: list[Stage], claim: Claim, index: Index | None = None
) -> int | None:
    """Candidates, their metadata, who wrote them (the marker), then the signatures: written
    last, they mark it done. Written only while this run still holds the output (else None).
    The partition streams through in chunks (`source.chunk_bytes`); media above
    `source.spill_bytes` wait on local disk, in a spill folder of this task's own."""
    sweep_folders()  # those of killed workers
    folder = spill_folder()
    set_task_folder(folder, cfg.source.spill_bytes, cfg.source.chunk_bytes)
    try:
        return write_partition(part, cfg, stages, claim, folder, index)
    finally:
        set_task_folder(None)
        remove_folder(folder)


def write_partition(
    part: Partition,
    cfg: BuildConfig,
    stages: list[Stage],
    claim: Claim,
    spill: str,
    index: Index | None,
) -> int | None:
    """Stored payloads are referred to (pipeline/output/media_index.py), registered once done."""
    src = cfg.source
    reading = Reading(cfg.ray.batch_size, src.chunk_bytes, src.spill_bytes, spill)
    inputs: deque[list[Spilled]] = deque()  # each chunk's Spilled values as it was read
    sizes: deque[int] = deque()  # each chunk's samples as read, reported once it is written
    read = read_chunks(part, cfg.storage_options, reading)
    if part.only_keys is not None:  # `mmcurate retry`: just these samples of it
        chosen = map(partial(selected, keys=frozenset(part.only_keys)), read)
        read = (chunk for chunk in chosen if chunk.get("__key__"))
    read = map(partial(sized, sizes=sizes), read)
    chunks = map(partial(noted, inputs=inputs), read)
    folder = join(claim.work_url, CANDIDATES)
    url = join(folder, candidate_name(part.number))
    media = None if index is None else PartitionMedia(part.number, index)
    try:
        chain = counted(run_chain(chunks, stages), sizes)
        rows = write_candidate(chain, inputs, url, cfg.storage_options, claim, media)
    except ClaimLost:
        return None
    live = [row for row in rows if row[DROP] is None]  # key, caption, json: shard metadata
    write_parquet(
        candidate_metadata(live), join(folder, metadata_name(part.number)), cfg.storage_options
    )
    record = {"part": part.number} | finish_partition(media, folder, cfg.storage_options)
    mark(claim, part_marker(claim.work_url, part.number), record)
    signatures_url = join(claim.work_url, SIGNATURES, signatures_name(part.number))
    write_parquet(signature_table(rows), signatures_url, cfg.storage_options)
    if media is not None:
        media.register()  # pending until the driver has this task's result
    return len(rows)


def selected(chunk: dict, keys: frozenset[str]) -> dict:
    """The chunk's rows whose key is one of `keys` (columns are lists, one value per row)."""
    rows = chunk.get("__key__") or []
    at = [i for i, key in enumerate(rows) if key in keys]
    return {
        name: [values[i] for i in at]
        if isinstance(values, list) and len(values) == len(rows)
        else values
        for name, values in chunk.items()
    }


def sized(chunk: dict, sizes: deque[int]) -> dict:
    sizes.append(len(chunk.get("__key__") or ()))
    return chunk


def counted(chain: Iterator[dict], sizes: deque[int]) -> Iterator[dict]:
    """The chunks as they are; each chunk's source samples are reported done (core/progress.py)
    once the writer has taken it and asks for the next."""
    for chunk in chain:
        yield chunk
        report(sizes.popleft(), "samples")

"""What a build publishes: the commit's per-group work, in tasks (each signature group's
signatures file, every row with its fate and shard, and its embeddings file set; nothing comes
back), and the shard index wids reads. The names it writes are pipeline/output/names.py's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from mmcurate.core.mapreduce import Runner
from mmcurate.pipeline.output.embeddings import write_embeddings
from mmcurate.pipeline.output.groups import Groups, conform, read_fate, read_group, with_fate
from mmcurate.pipeline.output.layout import shard_of_rows
from mmcurate.pipeline.output.shard_format import shard_name
from mmcurate.pipeline.output.signatures import write_signatures
from mmcurate.stages.base import DROP


@dataclass(frozen=True)
class Publication:
    """What every group's task needs besides its own rows: plain data."""

    output: str
    final_round: str
    schema: pa.Schema  # the union of the partitions' signature columns
    kept_starts: list[int]  # global kept position of each group's first kept row
    shard_starts: list[int]  # global kept position of each shard's first row


def publish(groups: Groups, plan: Publication, runner: Runner) -> None:
    """Every group's published files."""
    runner.run(publish_group, [(groups, plan, g) for g in range(groups.count)])


def publish_group(groups: Groups, plan: Publication, group: int) -> None:
    """Task body: one group's signatures file and embeddings."""
    table = conform(read_group(groups, group), plan.schema)
    table = with_fate(table, read_fate(groups, plan.final_round, group))
    table = table.append_column("shard", shard_column(table, plan, group))
    write_signatures(plan.output, table, groups.storage_options, group)
    write_embeddings(plan.output, table, groups.storage_options, group)


def shard_column(table: pa.Table, plan: Publication, group: int) -> pa.Array:
    """Each kept row's shard name (null for dropped rows)."""
    kept = pc.is_null(table[DROP]).to_numpy(zero_copy_only=False)
    positions = plan.kept_starts[group] + np.cumsum(kept) - 1
    names = np.full(table.num_rows, None, dtype=object)
    if kept.any():
        index = shard_of_rows(positions[kept], plan.shard_starts)
        names[kept] = [shard_name(int(i)) for i in index]
    return pa.array(names.tolist(), pa.string())  # a list: an ndarray imports numpy.ma (~20 ms)


def wids_index(entries: list[dict]) -> dict[str, Any]:
    """The shard index `wids` (webdataset's indexed reader) loads; urls relative to it."""
    shards = [{"url": e["name"], "nsamples": e["samples"], "filesize": e["bytes"]} for e in entries]
    return {"__kind__": "wids-shard-index-v1", "wids_version": 1, "shardlist": shards}

"""Everything a build writes, in `_work/` and in output.path, and what makes it resumable.

Phase A's work: `candidates` (a partition's candidate tar, written as its chunks arrive),
`signatures` (one row per input sample, no media: the partition's completion mark),
`media_index` / `media_table` (each distinct payload stored once), `markers` (the done markers a
rerun trusts). Phases B and C read the signatures in `groups`. Phase C's output: `layout` (the
shard plan), `shards` (one shard copied from byte spans of the candidates, hashed as written),
`shard_format`, `shard_metadata` (one parquet schema for all shards), `shard_refs` (samples
whose payloads are references), `retire` (candidates deleted once every shard that needs them
is written), `embeddings`, `stats`, `buckets_file`, and `publish` (the published files and the
names a build may write). `resume` holds the build's identity, its claim on output.path and
its ledger; `existing` reads what output.path already holds.

May import: core, stages, pipeline.config, pipeline.sources (the sample batch),
pipeline.runtime.
"""

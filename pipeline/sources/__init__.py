"""Every source kind: planning partitions on the driver and reading one partition in a task.

`partitions` holds one source object per `source.kind` (`SOURCES`: each plans and reads) over
`images` (folders, and video folders), `webdataset` (tar shards), `urls` (LAION-style lists;
`csv_lists`, `ranges`, `infer`, `infer_json` and `tables` read csv / tsv / jsonl / parquet
without holding a whole file, `staging` copies a list no partition can slice, returning new
records) and `videos` (folders, globs and list files). `records` are the typed, immutable
partitions they plan and read (`to_dict()`: the plan entry the build identity hashes).
`samples` is the batch every source yields (fixed columns, keys, captions, chunks capped by
samples and bytes); `files` reads a partition's files in byte-bounded groups; `synth` makes
synthetic URL lists for tests and benches.

May import: core, stages, pipeline.config. Nothing else of pipeline imports below it.
"""

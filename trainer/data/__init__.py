"""The training loader: a build's shards, streamed or through the node's cache, as batches.

`manifest` reads a build's manifest.json; `plan` splits each epoch over ranks and loader
workers (pure); `reader`, `verify` and `cache` read shards (size and sha256 checked, the NVMe
cache shared by every rank of a node); `hold` keeps read-ahead samples within a byte budget;
`dataset` (ShardDataset, `make_loader`) follows the plan and `collate` turns raw samples into a
batch with `transform`'s train transform; `ring` and `batch` pass batches through reused
shared memory; `prefetch` moves them onto the device. `buckets` and `bucket_plan` are the
aspect-ratio bucketed loader for Stable Diffusion-style training; `resplit` re-splits the rest
of an epoch when a run resumes on another number of ranks or workers.

May import: core, and trainer.run_log for one type (the stall meter prefetch reports to).
"""

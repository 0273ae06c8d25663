"""Stream mmcurate shards into CLIP training, and evaluate CLIP models.

At the top: `config` (typed train config), `units` (byte sizes), `models` (open_clip models;
registers `mmcurate-tiny`), `precision`, `outputs` (where a run's files live), `run_log`
(metrics.jsonl, sample logs, TensorBoard), `checkpoint`, `step` (loss, accumulation,
optimizer), `loop_state` (where training stands), `resume` (checkpoints and resume),
`train_data` (a run's loaders from its config), `train` (the loop), `launch` (Ray Train), `cli`
(`python -m mmcurate.trainer`).
Sub-packages: `data/` (the loader), `dist/` (ranks, FSDP, sharded checkpoints), `eval/`
(`mmcurate eval`), `health/` (guards, alerts, GPU telemetry), `probe/` (`mmcurate probe`);
each `__init__` says what it owns and may import. Importing this package itself stays cheap:
torch and open_clip load only with the modules that need them.
"""

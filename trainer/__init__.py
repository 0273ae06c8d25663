"""Stream mmcurate shards into CLIP training, and evaluate CLIP models.

Modules: `config` (typed train config), `manifest` (read a build's manifest.json), `plan`
(each rank's epoch, pure), `reader` / `verify` / `cache` (shards streamed or through the NVMe
cache, size and sha256 checked), `data` / `transform` / `ring` / `batch` (decode, batch, move
batches through shared memory), `models` (open_clip models; registers `mmcurate-tiny`),
`distributed` (the one place that reads RANK / WORLD_SIZE), `step` (loss, accumulation,
optimizer), `prefetch` (device copies), `train_state` (checkpoints and resume), `run_log`
(metrics.jsonl, sample logs, TensorBoard), `train` (the loop), `train_eval` (evaluation during
training), `eval` / `eval_data` / `eval_tasks` / `eval_metrics` (`mmcurate eval`), `launch`
(Ray Train), `cli` (`python -m trainer`). Importing this package itself stays cheap: torch and
open_clip load only with the modules that need them.
"""

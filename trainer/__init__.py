"""Stream mmcurate shards into CLIP training.

Modules: `config` (typed train config), `manifest` (read a build's manifest.json), `data`
(streaming shard dataset and loader), `models` (open_clip models; importing it registers the
`mmcurate-tiny` config), `train` (the loop, metrics and checkpoints), `cli` (`python -m trainer`).
Importing this package itself stays cheap: torch and open_clip load only with `data`, `models`
and `train`.
"""

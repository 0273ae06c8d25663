"""`mmcurate eval` (also `python -m mmcurate.trainer.eval`): zero-shot retrieval and classification.

`evaluate` is the command; `config` its config models (below trainer/config.py, which embeds
its sections for evaluation during training); `data` the eval sets (a build's shards, image
folders, manifests); `tasks` embeds them; `metrics` scores (pure); `in_training` runs the same
tasks on the model being trained.

May import: core, trainer.config, trainer.units, trainer.models, trainer.precision,
trainer.data, trainer.dist.
"""

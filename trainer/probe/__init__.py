"""`mmcurate probe` (also `python -m mmcurate.trainer.probe`):
the largest batch a device holds and the
loader throughput it needs. `run` is the command, `ladder` the batch-size ladder of real
training steps, `sizing` the arithmetic docs/sizing.md derives.

May import: everything in trainer (it drives the training loop's parts); nothing imports it
but the CLI.
"""

"""What keeps a long run healthy: `checks` (non-finite loss and gradient guards, loss spikes),
`guard` (what the loop does with their verdicts: skip, restore the last good checkpoint,
stop), `alerts` (webhook events) and `telemetry` (GPU temperature, power, ECC errors and
throttling through nvidia-ml-py, sampled off the training thread).

May import: core, trainer.config, trainer.step, trainer.loop_state, trainer.resume,
trainer.checkpoint, trainer.data (the batch type), trainer.dist.
"""

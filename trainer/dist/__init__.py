"""How ranks share a training job: `world` (the one place that reads RANK / WORLD_SIZE and
starts the process group), `fsdp` (strategy fsdp: FSDP2 sharding of model and optimizer) and
`sharded` (torch.distributed.checkpoint checkpoints that load on any number of ranks).

May import: core.
"""

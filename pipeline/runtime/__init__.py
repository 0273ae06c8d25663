"""Where a build's tasks run, and the local services tests and the demo start.

`session` is the only place that starts or joins a runtime (Ray, or `localpool`'s warm worker
processes on one machine) and runs a list of tasks with progress and memory requests; `actors`
holds the model stages' actor pools. `objectstore` (with `objectstore_probe`) starts a
throwaway SeaweedFS S3 on loopback; `loopback` is the environment that keeps a test, the demo
or a bench on this machine.

May import: core, stages, pipeline.config.
"""

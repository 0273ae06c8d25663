"""Phase B: every global decision (repeated keys, exact / near / semantic dedupe, score
percentiles, keep_top_fraction) made on the signatures alone, never on media.

`phase_b` runs the decisions as rounds of tasks over signature groups; `rounds` is what every
round shares (a group's live rows, the shuffle's file names); `top_fraction` keeps exactly
ceil(f x N) of N rows across partitions.

May import: core, stages, pipeline.config, pipeline.output (signature groups),
pipeline.runtime.
"""

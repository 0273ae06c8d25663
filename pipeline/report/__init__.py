"""report.html: one static page per build (`page`), its charts as inline SVG (`charts`) and
its aspect-ratio bucket section (`buckets`).

May import: core, stages, pipeline.output (buckets.json).
"""

"""The `features` that Hugging Face `datasets`' webdataset loader needs to read a build whole.

The loader infers its features from the first five samples of the first shard. Every json of
a build carries the same keys (pipeline/output/json_fill.py), but a key whose values in those
samples are all null is typed null there, and a later shard's text then fails to cast
("Couldn't cast array of type string to null"). Passing these features avoids inference:

    features = webdataset_features("out/")
    load_dataset("webdataset", data_files=..., features=features)

Types come from the build's planned field kinds (every shard parquet's footer: the same for
all shards); the members from the first sample of the first shard.
"""

from __future__ import annotations

import json
import tarfile
from typing import Any

import pyarrow.parquet as pq
from mmcurate.core.storage import filesystem, join
from mmcurate.pipeline.output.shard_metadata import FIELDS_KEY, JSON_KEYS_KEY

VALUE_TYPES = {"bool": "bool", "int": "int64", "float": "float64", "string": "string"}


def webdataset_features(output: str, storage_options: dict | None = None) -> Any:
    """`datasets.Features` for the build at `output` (needs `datasets` installed)."""
    import datasets
    from datasets.packaged_modules.webdataset.webdataset import WebDataset

    fs, root = filesystem(output, storage_options or {})
    with fs.open(join(root, "shard-000000.parquet"), "rb") as f:
        footer = pq.ParquetFile(f).schema_arrow.metadata or {}
    fields, keys = json.loads(footer[FIELDS_KEY]), json.loads(footer[JSON_KEYS_KEY])
    with fs.open(join(root, "shard-000000.tar"), "rb") as f:
        members = first_sample_members(f)
    features: dict[str, Any] = {"__key__": datasets.Value("string")}
    for ext in members:
        last = ext.rsplit(".", 1)[-1]
        if ext == "json":
            features[ext] = {key: json_feature(fields.get(key, "null")) for key in keys}
        elif last in WebDataset.IMAGE_EXTENSIONS:
            features[ext] = datasets.Image()
        elif last in WebDataset.VIDEO_EXTENSIONS:
            features[ext] = datasets.Video()
        else:
            features[ext] = datasets.Value("string" if last in ("txt", "text") else "binary")
    features["__url__"] = datasets.Value("string")
    return datasets.Features(features)


def json_feature(kind: str) -> Any:
    import datasets

    if kind in VALUE_TYPES:
        return datasets.Value(VALUE_TYPES[kind])
    return datasets.Json() if kind == "json" else datasets.Value("string")


def first_sample_members(fileobj: Any) -> list[str]:
    """The member extensions of a tar's first sample, read as a stream (no seeking)."""
    found: list[str] = []
    key = None
    with tarfile.open(fileobj=fileobj, mode="r|") as tar:
        for member in tar:
            stem, _, ext = member.name.partition(".")
            if key is not None and stem != key:
                break
            key = stem
            found.append(ext)
    return found

"""The signatures table: one row per input sample without its media (what phase A writes per
partition, what global stages decide on, what `signatures/part-*.parquet` publishes)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from mmcurate.core.atomic import write_parquet
from mmcurate.core.formats import is_media_column
from mmcurate.core.storage import join
from mmcurate.pipeline.output.embeddings import EMBEDDING_COLUMNS
from mmcurate.pipeline.output.names import signatures_file
from mmcurate.stages.base import DROP, DROP_STAGE

# plus every media column (is_media_column); `__json_at__` goes to the candidate metadata
NOT_SIGNATURE = {"txt", "json", "__json_at__"}
UNPUBLISHED = {"thumb"}  # near_dedupe's 32x32 thumbnails: phase B reads them, users need not


def signature_table(rows: list[dict[str, Any]]) -> pa.Table:
    """One row per sample without media; fixed types for the columns every build has."""
    types = {
        "__key__": pa.string(),
        "__part__": pa.int64(),
        "__index__": pa.int64(),
        "__source__": pa.string(),
        DROP: pa.string(),
        DROP_STAGE: pa.string(),
        "__bytes__": pa.int64(),
        "__offset__": pa.int64(),
        "__parent__": pa.string(),
        "sha256": pa.string(),
        "url": pa.string(),
        "fetched_at": pa.string(),  # download's fetch time (not in the json: see download.py)
        "phash": pa.uint64(),
        "phash_crops": pa.list_(pa.uint64()),
        "thumb": pa.binary(),
        "width": pa.int64(),
        "height": pa.int64(),
        "clip_score": pa.float32(),
        "language": pa.string(),
        "language_confidence": pa.float32(),
        "embedding": pa.list_(pa.float16()),
        "text_embedding": pa.list_(pa.float16()),
        "bucket": pa.string(),  # aspect_buckets (buckets.json is counted from these three)
        "aspect_error": pa.float32(),
        "crop_share": pa.float32(),
        "aesthetic_score": pa.float32(),
    }
    seen = dict.fromkeys(c for row in rows for c in row) if rows else types  # chunks differ
    columns = [c for c in seen if c not in NOT_SIGNATURE and not is_media_column(c)]
    columns += [c for c in ("__bytes__", "__offset__") if c not in columns]
    arrays = {c: pa.array([r.get(c) for r in rows], type=types.get(c)) for c in columns}
    return pa.table(arrays)


def published_table(signatures: pa.Table) -> pa.Table:
    """The columns users get, under their published names (internal ones left out)."""
    names = {
        "__key__": "key",
        "__source__": "source",
        DROP: "drop_reason",
        DROP_STAGE: "drop_stage",
        "__bytes__": "bytes",
        "__parent__": "parent",
    }
    keep = [
        c
        for c in signatures.column_names
        if (c in names or not c.startswith("__"))
        and c not in EMBEDDING_COLUMNS
        and c not in UNPUBLISHED
    ]
    return signatures.select(keep).rename_columns([names.get(c, c) for c in keep])


def write_signatures(
    output: str, signatures: pa.Table, storage_options: dict[str, Any], group: int = 0
) -> None:
    """One group's rows, each with its fate, as `signatures_file(group)`."""
    url = join(output, signatures_file(group))
    write_parquet(published_table(signatures), url, storage_options)

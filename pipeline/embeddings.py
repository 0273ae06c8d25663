"""Embeddings of the kept samples, laid out as clip-retrieval writes them.

    embeddings/img_emb/img_emb_0000.npy      float16 [n, dim], L2-normalized image embeddings
    embeddings/text_emb/text_emb_0000.npy    the same for captions (when clip_score ran)
    embeddings/metadata/metadata_0000.parquet  key, shard, clip_score, url: row i of each file
                                               belongs to row i of the arrays

One file of each per 1M samples. The signatures parquet leaves the embeddings out (they would
double its size); these files are what a user (or a later build) reuses.
"""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from core.storage import filesystem, join, write_bytes_atomic, write_parquet
from stages.base import DROP

EMBEDDING_COLUMNS = {"embedding": "img_emb", "text_embedding": "text_emb"}
ROWS_PER_FILE = 1_000_000


def write_embeddings(output: str, signatures: pa.Table, storage_options: dict) -> int:
    """Write the kept samples' embeddings; returns how many rows (0 when none were computed)."""
    if "embedding" not in signatures.column_names:
        return 0
    kept = signatures.filter(
        pc.and_(pc.is_null(signatures[DROP]), pc.is_valid(signatures["embedding"]))
    )
    meta_columns = [c for c in ("__key__", "shard", "clip_score", "url") if c in kept.column_names]
    fs, root = filesystem(join(output, "embeddings"), storage_options)
    for index, start in enumerate(range(0, kept.num_rows, ROWS_PER_FILE)):
        chunk = kept.slice(start, ROWS_PER_FILE)
        for column, folder in EMBEDDING_COLUMNS.items():
            if column in chunk.column_names and chunk[column].null_count == 0:
                path = join(root, folder, f"{folder}_{index:04d}.npy")
                write_bytes_atomic(fs, path, npy_bytes(stack(chunk[column])))
        metadata = chunk.select(meta_columns).rename_columns(
            ["key" if c == "__key__" else c for c in meta_columns]
        )
        write_parquet(
            metadata,
            join(output, "embeddings", "metadata", f"metadata_{index:04d}.parquet"),
            storage_options,
        )
    return kept.num_rows


def stack(column: pa.ChunkedArray) -> np.ndarray:
    return np.stack(column.to_numpy(zero_copy_only=False)).astype(np.float16)


def npy_bytes(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()

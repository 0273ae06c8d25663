"""Embeddings of the kept samples, laid out as clip-retrieval writes them.

    embeddings/img_emb/img_emb_0000.npy      float16 [n, dim], L2-normalized image embeddings
    embeddings/text_emb/text_emb_0000.npy    the same for captions (when clip_score ran)
    embeddings/metadata/metadata_0000.parquet  key, shard, clip_score, url: row i of each file
                                               belongs to row i of the arrays

One file of each per signature group (up to about 1M samples; pipeline/output/groups.py). The
signatures parquet leaves the embeddings out (they would double its size); these files are
what a user (or a later build) reuses.
"""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from mmcurate.core.atomic import write_bytes_atomic, write_parquet
from mmcurate.core.storage import filesystem, join
from mmcurate.stages.base import DROP

EMBEDDING_COLUMNS = {"embedding": "img_emb", "text_embedding": "text_emb"}
ROWS_PER_FILE = 1_000_000


def write_embeddings(
    output: str, signatures: pa.Table, storage_options: dict, index: int = 0
) -> int:
    """Write the kept samples' embeddings as file set `index` (one per signature group);
    returns how many rows (0, and no files, when none were computed or kept)."""
    if "embedding" not in signatures.column_names:
        return 0
    kept = signatures.filter(
        pc.and_(pc.is_null(signatures[DROP]), pc.is_valid(signatures["embedding"]))
    )
    if kept.num_rows == 0:
        return 0
    meta_columns = [c for c in ("__key__", "shard", "clip_score", "url") if c in kept.column_names]
    fs, root = filesystem(join(output, "embeddings"), storage_options)
    for column, folder in EMBEDDING_COLUMNS.items():
        if column in kept.column_names and kept[column].null_count == 0:
            path = join(root, folder, f"{folder}_{index:04d}.npy")
            write_bytes_atomic(fs, path, npy_bytes(stack(kept[column])))
    metadata = kept.select(meta_columns).rename_columns(
        ["key" if c == "__key__" else c for c in meta_columns]
    )
    url = join(output, "embeddings", "metadata", f"metadata_{index:04d}.parquet")
    write_parquet(metadata, url, storage_options)
    return kept.num_rows


def stack(column: pa.ChunkedArray) -> np.ndarray:
    return np.stack(column.to_numpy(zero_copy_only=False)).astype(np.float16)


def npy_bytes(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()

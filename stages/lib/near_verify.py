"""near_dedupe's candidates and their check, on signature rows (no media, no Ray).

Candidates: each node (one distinct whole-frame hash) enters the Hamming tables with its
whole-frame hash and its leader's inset hashes (`phash_crops`), all under the node's id, so a
crop meets its original through the inset that lines up with it. A pair is verified on the
leaders' 32x32 thumbnails (`thumb_match.mismatch`) and, where both rows carry a CLIP
`embedding`, also on its cosine.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from mmcurate.stages.lib.thumb_match import mismatch, thumbnails


def class_leaders(inverse: np.ndarray, rank: np.ndarray, classes: int) -> np.ndarray:
    """leader[c] = the best-ranked row whose class (inverse) is c."""
    order = np.lexsort((rank, inverse))
    first = np.concatenate(([True], inverse[order][1:] != inverse[order][:-1]))
    leader = np.empty(classes, np.int64)
    leader[inverse[order][first]] = order[first]
    return leader


def candidate_entries(
    live: pa.Table, unique: np.ndarray, leader: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(hashes, owner node) of every entry: each node's hash, then its leader's inset hashes."""
    nodes = np.arange(len(unique), dtype=np.int64)
    if "phash_crops" not in live.column_names:
        return unique, nodes
    crops = live["phash_crops"].take(pa.array(leader))
    valid = np.asarray(pc.is_valid(crops))
    lengths = np.asarray(pc.list_value_length(crops).fill_null(0))
    values = pc.list_flatten(crops).to_numpy().astype(np.uint64)
    owners = np.repeat(nodes, np.where(valid, lengths, 0))
    return np.concatenate([unique, values]), np.concatenate([nodes, owners])


def verify_pairs(
    live: pa.Table, rows_a: np.ndarray, rows_b: np.ndarray, max_mismatch: float, min_cosine: float
) -> np.ndarray:
    """Per pair of rows: do their thumbnails match (mismatch <= max_mismatch), and, where both
    carry an embedding, is its cosine >= min_cosine? A row without a thumbnail never matches."""
    if not len(rows_a) or "thumb" not in live.column_names:
        return np.zeros(len(rows_a), bool)
    needed, index = np.unique(np.concatenate([rows_a, rows_b]), return_inverse=True)
    blobs = live["thumb"].take(pa.array(needed)).to_pylist()
    blobs = [blob if blob is not None and len(blob) == 1024 else None for blob in blobs]
    present = np.array([blob is not None for blob in blobs])
    pixels = thumbnails([blob or bytes(1024) for blob in blobs])
    ia, ib = index[: len(rows_a)], index[len(rows_a) :]
    ok = present[ia] & present[ib]
    ok[ok] = mismatch(pixels[ia[ok]], pixels[ib[ok]]) <= max_mismatch
    if "embedding" in live.column_names:
        ok &= cosine_allows(live["embedding"].take(pa.array(needed)), ia, ib, min_cosine)
    return ok


def cosine_allows(
    column: pa.ChunkedArray, ia: np.ndarray, ib: np.ndarray, min_cosine: float
) -> np.ndarray:
    """True where either row lacks an embedding or the two are at cosine >= min_cosine."""
    vectors = column.to_pylist()
    has = np.array([v is not None and len(v) > 0 for v in vectors])
    allowed = np.ones(len(ia), bool)
    both = has[ia] & has[ib]
    if not both.any():
        return allowed
    dim = len(next(v for v in vectors if v is not None and len(v) > 0))
    matrix = np.zeros((len(vectors), dim), np.float32)
    for i in np.flatnonzero(has):
        matrix[i] = np.asarray(vectors[i], np.float32)
    matrix /= np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)
    cosine = np.einsum("pd,pd->p", matrix[ia[both]], matrix[ib[both]])
    allowed[both] = cosine >= min_cosine
    return allowed

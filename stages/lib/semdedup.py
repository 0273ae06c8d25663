"""SemDeDup on normalized embeddings: k-means clusters, then a greedy keep rule per cluster.

Rule (exact, per cluster): walk the items in keep-priority order; an item is dropped when its
cosine similarity to an item already *kept* is >= 1 - eps, and then records the most similar
kept item. A dropped item never causes another drop.

Memory: a cluster is compared in blocks of `block` items against its kept items, `block` at a
time, so the largest matrix is block x block floats (64 MiB at 4096), never n x n. What a reduce
task holds is its clusters' embeddings (n x dim floats) plus that.
"""

from __future__ import annotations

import numpy as np

BLOCK = 2048


def normalize(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


def greedy_keep(x: np.ndarray, eps: float, block: int = BLOCK) -> np.ndarray:
    """x: normalized rows in priority order. Returns kept_by[i] = -1 when row i is kept, else
    the row (kept, earlier) it duplicates."""
    threshold = np.float32(1.0 - eps)
    n = len(x)
    kept_by = np.full(n, -1, np.int64)
    kept: list[np.ndarray] = []  # kept row indices, one array per finished block
    for start in range(0, n, block):
        stop = min(n, start + block)
        best_sim, best_row = best_kept_match(x, start, stop, kept, block)
        best_row = resolve_block(x[start:stop], start, best_sim, best_row, threshold)
        dup = best_sim >= threshold
        kept_by[start:stop] = np.where(dup, best_row, -1)
        kept.append(np.arange(start, stop)[~dup])
    return kept_by


def best_kept_match(
    x: np.ndarray, start: int, stop: int, kept: list[np.ndarray], block: int
) -> tuple[np.ndarray, np.ndarray]:
    """For rows start..stop: highest similarity to any row kept in earlier blocks, and which."""
    best_sim = np.full(stop - start, -np.inf, np.float32)
    best_row = np.full(stop - start, -1, np.int64)
    rows = x[start:stop]
    for kept_rows in kept:
        for k in range(0, len(kept_rows), block):
            chunk = kept_rows[k : k + block]
            sims = rows @ x[chunk].T
            arg = sims.argmax(axis=1)
            top = sims[np.arange(len(rows)), arg]
            better = top > best_sim
            best_sim[better] = top[better]
            best_row[better] = chunk[arg[better]]
    return best_sim, best_row


def resolve_block(
    rows: np.ndarray, start: int, best_sim: np.ndarray, best_row: np.ndarray, threshold: float
) -> np.ndarray:
    """Within one block, in order: a row not already a duplicate is kept and updates the best
    match of the rows after it. Updates best_sim in place; returns best_row."""
    sims = rows @ rows.T
    for i in range(len(rows)):
        if best_sim[i] >= threshold:
            continue  # dropped: it suppresses nothing
        later = sims[i, i + 1 :]
        better = later > best_sim[i + 1 :]
        best_sim[i + 1 :][better] = later[better]
        best_row[i + 1 :][better] = start + i
    return best_row


def brute_force_keep(x: np.ndarray, eps: float) -> np.ndarray:
    """The rule with the full n x n matrix, one row at a time: the reference for tests."""
    sims = x @ x.T
    kept_by = np.full(len(x), -1, np.int64)
    kept: list[int] = []
    for i in range(len(x)):
        if kept:
            j = int(np.argmax(sims[i, kept]))
            if sims[i, kept[j]] >= 1.0 - eps:
                kept_by[i] = kept[j]
                continue
        kept.append(i)
    return kept_by


# ---- clusters ------------------------------------------------------------------------------


def train_centroids(x: np.ndarray, clusters: int, seed: int, niter: int = 20) -> np.ndarray:
    """Spherical k-means (faiss) on at most 256 rows per centroid, sampled deterministically."""
    import faiss

    clusters = max(1, min(clusters, len(x)))
    if clusters == 1:
        return normalize(x.mean(axis=0, keepdims=True))
    rng = np.random.default_rng(seed)
    sample = x if len(x) <= 256 * clusters else x[rng.choice(len(x), 256 * clusters, False)]
    kmeans = faiss.Kmeans(x.shape[1], clusters, niter=niter, seed=seed, spherical=True)
    kmeans.train(np.ascontiguousarray(sample, np.float32))
    return kmeans.centroids


def assign(x: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """Nearest centroid (highest inner product) per row."""
    if len(centroids) == 1:
        return np.zeros(len(x), np.int64)
    import faiss

    index = faiss.IndexFlatIP(centroids.shape[1])
    index.add(np.ascontiguousarray(centroids, np.float32))
    _, nearest = index.search(np.ascontiguousarray(x, np.float32), 1)
    return nearest[:, 0].astype(np.int64)


def map_block(
    block: tuple[np.ndarray, np.ndarray, int], centroids: np.ndarray, partitions: int
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Assign a block's rows to clusters and route each cluster to one partition.
    Block: (normalized embeddings, priority ranks, offset). Payload: (ids, clusters, ranks, x)."""
    x, ranks, offset = block
    cluster = assign(x, centroids)
    part = cluster % partitions
    ids = np.arange(offset, offset + len(x), dtype=np.int64)
    out = []
    for p in range(partitions):
        sel = np.flatnonzero(part == p)
        out.append((ids[sel], cluster[sel], ranks[sel], x[sel]))
    return out


def reduce_clusters(
    payloads: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]], eps: float
) -> tuple[np.ndarray, np.ndarray]:
    """Every cluster of one partition through `greedy_keep`: (dropped ids, kept ids)."""
    ids = np.concatenate([p[0] for p in payloads])
    cluster = np.concatenate([p[1] for p in payloads])
    ranks = np.concatenate([p[2] for p in payloads])
    x = np.concatenate([p[3] for p in payloads])
    order = np.lexsort((ranks, cluster))  # by cluster, then keep priority
    ids, cluster, x = ids[order], cluster[order], x[order]
    bounds = np.flatnonzero(np.concatenate(([True], cluster[1:] != cluster[:-1], [True])))
    dropped, kept = [], []
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        kept_by = greedy_keep(x[lo:hi], eps)
        dup = np.flatnonzero(kept_by >= 0)
        dropped.append(ids[lo:hi][dup])
        kept.append(ids[lo:hi][kept_by[dup]])
    if not dropped:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    return np.concatenate(dropped), np.concatenate(kept)

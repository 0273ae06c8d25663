"""semantic_dedupe (SemDeDup): drop images whose CLIP embedding nearly repeats a kept one's.

Per sample: an `embedding` column (normalized CLIP image embedding). A stage that already
computed one (clip_score) is reused; otherwise this stage embeds with `model`/`pretrained`.
Globally (phase B, signatures only): spherical k-means (faiss) on a sample, every row to its
nearest centroid, clusters hash-partitioned across reduce tasks, and in each cluster the
greedy rule of `stages.lib.semdedup` in keep-priority order (`stages.lib.dedupe_common`).

Memory: the driver holds the signatures (embeddings included: dim x 4 bytes a row); a reduce
task holds its clusters' embeddings, about 256 MiB, plus a block x block matrix, so one very
large cluster costs its embeddings, never its n x n similarities.
"""

from __future__ import annotations

import logging
import math
from functools import partial
from typing import Literal

import numpy as np
import pyarrow as pa
from mmcurate.core.mapreduce import LocalRunner, Runner, partitions_for, split_range
from mmcurate.stages.base import Columns, Stage, StageOptions, media_column, register
from mmcurate.stages.lib.clip_model import cached_model, check_model
from mmcurate.stages.lib.dedupe_common import Decisions, live_rows, priority_rank
from mmcurate.stages.lib.semdedup import map_block, normalize, reduce_clusters, train_centroids
from pydantic import Field

log = logging.getLogger("mmcurate.semantic_dedupe")


class SemanticDedupeOptions(StageOptions):
    eps: float = Field(0.05, gt=0, lt=1, description="drop when cosine >= 1 - eps to a kept one")
    clusters: int | None = Field(None, ge=1, description="k-means clusters; default n/cluster_size")
    cluster_size: int = Field(10_000, ge=1, description="average cluster size when clusters unset")
    niter: int = Field(20, ge=1, description="k-means iterations")
    # numpy needs it non-negative; faiss k-means takes a C int
    seed: int = Field(0, ge=0, le=2**31 - 1, description="k-means and sampling seed")
    model: str = "ViT-B-32"
    pretrained: str | None = "laion2b_s34b_b79k"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    batch_size: int = Field(64, ge=1)


@register
class SemanticDedupe(Stage):
    name = "semantic_dedupe"
    Options = SemanticDedupeOptions
    is_global = True
    decide_columns = ("__key__", "embedding", "clip_score", "width", "height")
    # Set by the registry when an earlier stage (clip_score) gives every live sample its
    # `embedding`: then this stage's own model is never loaded, nor checked.
    embeddings_given = False

    def process(self, batch: Columns) -> tuple[Columns, list[str | None]]:
        size = len(batch["__key__"])
        existing = batch.get("embedding") or [None] * size
        todo = [i for i in range(size) if existing[i] is None and media_column(batch, i)]
        images = [batch[media_column(batch, i)][i] for i in todo]
        vectors, errors = self.embed(images) if images else ([], [])
        embeddings = list(existing)
        reasons: list[str | None] = [None if e is not None else "no_image" for e in existing]
        for i, vector, error in zip(todo, vectors, errors, strict=True):
            embeddings[i], reasons[i] = vector, error
        batch["embedding"] = embeddings
        return batch, reasons

    def models(self) -> list[dict[str, str]]:
        if self.embeddings_given:  # an earlier stage's embeddings: that stage lists the model
            return []
        opts = self.options
        return [self.model_record(opts.model, "open_clip_torch", str(opts.pretrained))]

    def check(self) -> None:
        if self.embeddings_given:
            return
        check_model(self.options.model, self.options.pretrained, f"stages.{self.index}")

    def embed(self, images: list[bytes]) -> tuple[list[np.ndarray | None], list[str | None]]:
        """Normalized float16 embeddings of the images the model can decode."""
        opts = self.options
        model = cached_model(opts.model, opts.pretrained, opts.device, "auto")
        pixels, reasons = model.prepare(images)
        vectors: list[np.ndarray | None] = [None] * len(images)
        good = [i for i, p in enumerate(pixels) if p is not None]
        for start in range(0, len(good), opts.batch_size):
            rows = good[start : start + opts.batch_size]
            embedded, _ = model.encode(np.stack([pixels[i] for i in rows]))
            for i, vector in zip(rows, embedded, strict=True):
                vectors[i] = vector.astype(np.float16)
        return vectors, reasons

    def decide(self, signatures: pa.Table, runner: Runner | None = None) -> Decisions:
        live = live_rows(signatures, "embedding")
        if live.num_rows < 2:
            return {}
        opts = self.options
        x = normalize(np.stack(live["embedding"].to_numpy(zero_copy_only=False)))
        clusters = opts.clusters or math.ceil(len(x) / opts.cluster_size)
        centroids = train_centroids(x, clusters, opts.seed, opts.niter)
        log.info("semantic_dedupe: %d embeddings in %d clusters", len(x), len(centroids))
        dropped, kept = semantic_pairs(x, priority_rank(live), centroids, opts.eps, runner)
        keys = live["__key__"].to_pylist()
        return {
            keys[d]: ("duplicate_semantic", keys[k]) for d, k in zip(dropped, kept, strict=True)
        }


def semantic_pairs(
    x: np.ndarray,
    ranks: np.ndarray,
    centroids: np.ndarray,
    eps: float,
    runner: Runner | None = None,
) -> tuple[list[int], list[int]]:
    """(dropped row, kept row) pairs: clusters routed to reduces, the rule run in each."""
    runner = runner or LocalRunner()
    blocks = [(x[a:b], ranks[a:b], a) for a, b in split_range(len(x), 1 << 16)]
    partitions = partitions_for(x.nbytes, runner)
    results = runner.map_reduce(
        blocks,
        partial(map_block, centroids=centroids, partitions=partitions),
        partial(reduce_clusters, eps=eps),
        partitions,
    )
    dropped = np.concatenate([d for d, _ in results])
    kept = np.concatenate([k for _, k in results])
    return dropped.tolist(), kept.tolist()

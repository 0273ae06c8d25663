"""Retrieval and zero-shot metrics from similarity scores: pure torch/numpy, no model, no data.

Ranks, one rule for every task (ties count against the model): a query's rank is 1 plus the
number of NEGATIVE candidates scoring at least as high as its best positive. A candidate tied
with the best positive therefore ranks ahead of it, the result does not depend on the order
of the eval set, and a model that scores everything equally gets the worst rank, never a lucky
one. Without ties this is exactly the position clip_benchmark's `topk` finds. NaN scores count
as -inf.

- Retrieval (clip_benchmark names): `image_retrieval_recall@K` (text to image: the query's own
  image in the top K), `text_retrieval_recall@K` (image to text: ANY of the image's captions in
  the top K), and the medians of the ranks: `image_retrieval_median_rank`,
  `text_retrieval_median_rank` (the mean of the two middle ranks for an even count).
- Zero-shot: `acc1`, `acc5` (true class ranked 1st / within the first 5) and
  `mean_per_class_recall` (the top-1 recall of each class with samples, averaged over classes).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

RECALL_AT = (1, 5, 10)
CHUNK = 1024  # query rows scored at once: bounds memory at CHUNK x candidates


def ranks(
    scores: torch.Tensor, query_group: torch.Tensor, candidate_group: torch.Tensor
) -> torch.Tensor:
    """1-based rank of each query's best positive among its candidates (module rule).

    `scores` [Q, C]; a candidate is positive for a query when their groups are equal. Every
    query must have at least one positive candidate."""
    scores = torch.nan_to_num(scores.float(), nan=-torch.inf)
    positive = query_group.view(-1, 1) == candidate_group.view(1, -1)
    if not bool(positive.any(dim=1).all()):
        raise ValueError("every query needs at least one positive candidate")
    best = torch.where(positive, scores, -torch.inf).amax(dim=1, keepdim=True)
    ahead = (scores >= best) & ~positive
    return ahead.sum(dim=1) + 1


def chunked_ranks(
    queries: torch.Tensor,
    candidates: torch.Tensor,
    query_group: torch.Tensor,
    candidate_group: torch.Tensor,
) -> torch.Tensor:
    """`ranks(queries @ candidates.T, ...)` computed CHUNK query rows at a time (on the
    features' device), returned on the CPU as int64."""
    out = []
    candidate_group = candidate_group.to(candidates.device)
    for start in range(0, len(queries), CHUNK):
        rows = queries[start : start + CHUNK]
        scores = rows.float() @ candidates.float().T
        group = query_group[start : start + CHUNK].to(candidates.device)
        out.append(ranks(scores, group, candidate_group).cpu())
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.int64)


def recall_at(rank: torch.Tensor, k: int) -> float:
    """Fraction of queries whose rank is at most k."""
    return int((rank <= k).sum()) / len(rank)


def median_rank(rank: torch.Tensor) -> float:
    return float(np.median(rank.numpy()))


def retrieval_metrics(
    text_to_image: torch.Tensor, image_to_text: torch.Tensor, ks: Sequence[int] = RECALL_AT
) -> dict[str, float]:
    """clip_benchmark's names from the ranks of each caption (text to image) and of each
    image (image to text)."""
    metrics: dict[str, float] = {}
    for k in ks:
        metrics[f"image_retrieval_recall@{k}"] = recall_at(text_to_image, k)
        metrics[f"text_retrieval_recall@{k}"] = recall_at(image_to_text, k)
    metrics["image_retrieval_median_rank"] = median_rank(text_to_image)
    metrics["text_retrieval_median_rank"] = median_rank(image_to_text)
    return metrics


def retrieval_from_features(
    image_features: torch.Tensor,
    text_features: torch.Tensor,
    text_image: torch.Tensor,
    ks: Sequence[int] = RECALL_AT,
) -> dict[str, float]:
    """Metrics for normalized features; `text_image[t]` is the index of caption t's image."""
    images = torch.arange(len(image_features))
    t2i = chunked_ranks(text_features, image_features, text_image, images)
    i2t = chunked_ranks(image_features, text_features, images, text_image)
    return retrieval_metrics(t2i, i2t, ks)


def zeroshot_metrics(rank: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """acc1, acc5 and mean_per_class_recall from each sample's true-class rank."""
    top1 = rank == 1
    recalls = [int(top1[labels == c].sum()) / int((labels == c).sum()) for c in labels.unique()]
    return {
        "acc1": recall_at(rank, 1),
        "acc5": recall_at(rank, 5),
        "mean_per_class_recall": float(np.mean(np.array(recalls, dtype=np.float64))),
    }


def zeroshot_from_features(
    image_features: torch.Tensor, classifier: torch.Tensor, labels: torch.Tensor
) -> dict[str, float]:
    """Metrics for normalized image features against per-class text embeddings [C, D]."""
    classes = torch.arange(len(classifier))
    return zeroshot_metrics(chunked_ranks(image_features, classifier, labels, classes), labels)

"""trainer/eval/metrics.py against brute-force numpy references: exact equality on small random
sets with ties, multi-caption images and degenerate scores."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from mmcurate.trainer.eval import metrics as eval_metrics
from mmcurate.trainer.eval.metrics import (
    ranks,
    retrieval_from_features,
    retrieval_metrics,
    zeroshot_from_features,
    zeroshot_metrics,
)

KS = (1, 2, 5, 10)


def brute_rank(row: np.ndarray, positive: np.ndarray) -> int:
    """Sort every candidate by descending score, a tied negative before a positive; the
    rank is the first positive's place (1-based). NaN sorts as -inf."""
    row = np.where(np.isnan(row), -np.inf, row)
    order = sorted(range(len(row)), key=lambda c: (-row[c], bool(positive[c])))
    return next(i for i, c in enumerate(order) if positive[c]) + 1


def brute_retrieval(scores: np.ndarray, text_image: np.ndarray, ks=KS) -> dict[str, float]:
    """scores [texts, images]; text_image[t] = caption t's image."""
    n_images = scores.shape[1]
    t2i = [brute_rank(scores[t], np.arange(n_images) == text_image[t]) for t in range(len(scores))]
    i2t = [brute_rank(scores[:, i], text_image == i) for i in range(n_images)]
    out = {}
    for k in ks:
        out[f"image_retrieval_recall@{k}"] = float(np.mean([r <= k for r in t2i]))
        out[f"text_retrieval_recall@{k}"] = float(np.mean([r <= k for r in i2t]))
    out["image_retrieval_median_rank"] = float(np.median(t2i))
    out["text_retrieval_median_rank"] = float(np.median(i2t))
    return out


def brute_zeroshot(logits: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    classes = np.arange(logits.shape[1])
    rank = np.array([brute_rank(logits[n], classes == labels[n]) for n in range(len(labels))])
    per_class = [np.mean(rank[labels == c] == 1) for c in sorted(set(labels.tolist()))]
    return {
        "acc1": float(np.mean(rank <= 1)),
        "acc5": float(np.mean(rank <= 5)),
        "mean_per_class_recall": float(np.mean(per_class)),
    }


def multi_caption_set(rng: np.random.Generator, n_images: int) -> np.ndarray:
    """text_image for images with 1 to 5 captions each (every image has at least one)."""
    counts = rng.integers(1, 6, size=n_images)
    text_image = np.repeat(np.arange(n_images), counts)
    return rng.permutation(text_image)


def metrics_of(scores: np.ndarray, text_image: np.ndarray, ks=KS) -> dict[str, float]:
    s = torch.from_numpy(scores)
    groups = torch.from_numpy(text_image)
    images = torch.arange(scores.shape[1])
    t2i = ranks(s, groups, images)
    i2t = ranks(s.T, images, groups)
    return retrieval_metrics(t2i, i2t, ks)


@pytest.mark.parametrize("seed", range(25))
def test_retrieval_equals_brute_force_with_ties(seed):
    rng = np.random.default_rng(seed)
    n_images = int(rng.integers(1, 12))
    text_image = multi_caption_set(rng, n_images)
    # Few distinct values: many exact ties, between positives and negatives alike.
    scores = rng.integers(-2, 3, size=(len(text_image), n_images)).astype(np.float32)
    assert metrics_of(scores, text_image) == brute_retrieval(scores, text_image)


@pytest.mark.parametrize("seed", range(10))
def test_features_path_equals_brute_force_across_chunks(seed, monkeypatch):
    """Small integer features: dot products are exact, so both sides see the same ties; a
    chunk of 3 query rows exercises the chunked scoring."""
    monkeypatch.setattr(eval_metrics, "CHUNK", 3)
    rng = np.random.default_rng(100 + seed)
    n_images = int(rng.integers(2, 9))
    text_image = multi_caption_set(rng, n_images)
    images = rng.integers(-1, 2, size=(n_images, 4)).astype(np.float32)
    texts = rng.integers(-1, 2, size=(len(text_image), 4)).astype(np.float32)
    got = retrieval_from_features(
        torch.from_numpy(images), torch.from_numpy(texts), torch.from_numpy(text_image), KS
    )
    assert got == brute_retrieval(texts @ images.T, text_image)


def test_without_ties_recall_is_clip_benchmarks_topk():
    """clip_benchmark's recall_at_k: a hit when any positive is among torch.topk's k."""
    rng = np.random.default_rng(7)
    text_image = multi_caption_set(rng, 20)
    scores = torch.from_numpy(rng.standard_normal((len(text_image), 20)).astype(np.float32))
    positive = torch.from_numpy(text_image)[:, None] == torch.arange(20)[None, :]
    ours = metrics_of(scores.numpy(), text_image)
    for k in (1, 5, 10):
        t2i = positive.gather(1, scores.topk(k, dim=1).indices).any(dim=1).float().mean().item()
        i2t = positive.T.gather(1, scores.T.topk(k, dim=1).indices).any(dim=1).float().mean()
        assert ours[f"image_retrieval_recall@{k}"] == pytest.approx(t2i)
        assert ours[f"text_retrieval_recall@{k}"] == pytest.approx(i2t.item())


def test_all_equal_scores_give_the_worst_rank():
    text_image = np.array([0, 0, 1, 2, 2, 2])
    scores = np.zeros((6, 3), dtype=np.float32)
    got = metrics_of(scores, text_image, ks=(1, 5, 6))
    assert got["image_retrieval_recall@1"] == 0.0 and got["image_retrieval_median_rank"] == 3.0
    assert got["text_retrieval_recall@1"] == 0.0
    # Every negative caption ties: image 0 (2 captions) ranks 5th, image 1 (1) 6th, image 2 4th.
    assert got["text_retrieval_median_rank"] == 5.0
    assert got["text_retrieval_recall@5"] == pytest.approx(2 / 3)
    assert got["text_retrieval_recall@6"] == 1.0


def test_any_caption_of_an_image_is_a_hit():
    """Image 0's first caption scores lowest, its second highest: a hit at 1."""
    text_image = np.array([0, 0, 1])
    scores = np.array([[0.1, 0.5], [0.8, 0.2], [0.3, 0.7]], dtype=np.float32)
    got = metrics_of(scores, text_image)
    assert got["text_retrieval_recall@1"] == 1.0
    assert got["image_retrieval_recall@1"] == pytest.approx(2 / 3)


def test_nan_scores_count_as_lowest():
    text_image = np.array([0, 1])
    scores = np.array([[np.nan, 0.5], [0.2, np.nan]], dtype=np.float32)
    got = metrics_of(scores, text_image)
    assert got == brute_retrieval(scores, text_image)
    assert got["image_retrieval_median_rank"] == 2.0


def test_k_beyond_the_candidates_is_every_query():
    got = metrics_of(np.eye(3, dtype=np.float32), np.arange(3), ks=(1, 50))
    assert got["image_retrieval_recall@50"] == got["text_retrieval_recall@50"] == 1.0


def test_a_query_without_a_positive_is_refused():
    with pytest.raises(ValueError, match="positive"):
        ranks(torch.zeros(2, 2), torch.tensor([0, 5]), torch.tensor([0, 1]))


@pytest.mark.parametrize("seed", range(25))
def test_zeroshot_equals_brute_force_with_ties(seed):
    rng = np.random.default_rng(200 + seed)
    n_classes = int(rng.integers(2, 9))
    n = int(rng.integers(1, 40))
    labels = rng.integers(0, n_classes, size=n)  # some classes may have no samples
    logits = rng.integers(-2, 3, size=(n, n_classes)).astype(np.float32)
    classes = torch.arange(n_classes)
    rank = ranks(torch.from_numpy(logits), torch.from_numpy(labels), classes)
    assert zeroshot_metrics(rank, torch.from_numpy(labels)) == brute_zeroshot(logits, labels)


def test_zeroshot_from_features_matches_a_confusion_matrix():
    """Without ties: acc1 is argmax accuracy; mean_per_class_recall is the balanced accuracy
    (sklearn's definition: per-class recall over the classes that have samples)."""
    rng = np.random.default_rng(3)
    images = torch.from_numpy(rng.standard_normal((60, 8)).astype(np.float32))
    classifier = torch.from_numpy(rng.standard_normal((6, 8)).astype(np.float32))
    labels = torch.from_numpy(rng.integers(0, 5, size=60))  # class 5 never occurs
    got = zeroshot_from_features(images, classifier, labels)
    logits = images @ classifier.T
    pred = logits.argmax(dim=1)
    assert got["acc1"] == pytest.approx((pred == labels).float().mean().item())
    top5 = logits.topk(5, dim=1).indices
    assert got["acc5"] == pytest.approx((top5 == labels[:, None]).any(dim=1).float().mean().item())
    recalls = [(pred[labels == c] == c).float().mean().item() for c in range(5)]
    assert got["mean_per_class_recall"] == pytest.approx(np.mean(recalls))


def test_zeroshot_fewer_than_five_classes_gives_acc5_one():
    logits = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    rank = ranks(logits, torch.tensor([0, 0]), torch.arange(2))
    assert zeroshot_metrics(rank, torch.tensor([0, 0])) == {
        "acc1": 0.5,
        "acc5": 1.0,
        "mean_per_class_recall": 0.5,
    }

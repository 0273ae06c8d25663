"""clip_score test pieces: the tiny CLIP stage spec and the ROC AUC of its scores."""

import numpy as np

TINY = {"name": "clip_score", "model": "mmcurate-tiny", "pretrained": None, "num_gpus": 0}


def roc_auc(positive: list[float], negative: list[float]) -> float:
    """Probability that a random positive outscores a random negative (ties count half)."""
    pos, neg = np.asarray(positive)[:, None], np.asarray(negative)[None, :]
    return float(((pos > neg).sum() + 0.5 * (pos == neg).sum()) / (pos.size * neg.size))

"""AUC, GAUC and log loss of numpy arrays, for the data side (the synthetic source's ceiling: the scores
of its own true click probabilities, computed while the data are prepared, before any model exists).

GAUC is the one implementation the models are scored with too, ``utils.ranking.group_auroc`` (the DIN
paper's Eq. 1: the impressions-weighted mean of per-user AUC over the users with both labels); AUC
and log loss are scikit-learn's. Each returns NaN where it is undefined (no samples, or no user /
no set with both labels); log loss clips the probabilities to [1e-7, 1 - 1e-7].
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.metrics import log_loss, roc_auc_score

from utils.ranking import group_auroc


def gauc(labels: np.ndarray, scores: np.ndarray, groups: np.ndarray) -> float:
    """Impressions-weighted mean of per-group AUC (tied scores: average rank), skipping one-class groups."""
    labels, scores, groups = (np.asarray(a) for a in (labels, scores, groups))
    return float(group_auroc(torch.from_numpy(scores.astype(np.float64)), torch.from_numpy(labels.astype(np.int64)),
                             torch.from_numpy(groups.astype(np.int64))))  # fmt: skip


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """ROC AUC of ``scores`` for binary ``labels`` (NaN unless both labels occur)."""
    labels = np.asarray(labels)
    return float(roc_auc_score(labels, scores)) if len(np.unique(labels)) == 2 else float("nan")


def logloss(labels: np.ndarray, probs: np.ndarray) -> float:
    """Mean binary cross-entropy of ``probs`` (clipped to [1e-7, 1 - 1e-7]); NaN for no samples."""
    labels = np.asarray(labels)
    if not len(labels):
        return float("nan")
    return float(log_loss(labels, np.clip(np.asarray(probs, dtype=np.float64), 1e-7, 1 - 1e-7), labels=[0, 1]))

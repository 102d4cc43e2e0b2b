"""AUC, GAUC and log loss in numpy, for the data side (the synthetic source's ceiling).

Why a second GAUC beside ``lightning_modules.metrics`` (``GroupAUROC`` / ``group_auroc``, the
torchmetrics one the models are scored with)? The data layer may not import the training layer
(``tests/import_graph.py``: ``datamodules`` and ``lightning_modules`` are peers), and the ceiling
is computed from the true click probabilities in numpy, while the data are prepared, before any
model or tensor exists. The two implement the same definition and are tested to agree
(``tests/test_behavior_metrics.py``, and against ``sklearn.metrics.roc_auc_score`` user by user).

Definitions (DIN paper, Zhou et al. 2018, Eq. 1):

    AUC  = the Mann-Whitney statistic: P(score of a positive > score of a negative), ties 1/2;
    GAUC = sum_u n_u AUC_u / sum_u n_u over the users u whose impressions hold both labels
           (one-class users have no AUC and are skipped, in the numerator and in the weights);
    logloss = mean binary cross-entropy, probabilities clipped to [1e-7, 1 - 1e-7].

AUC is GAUC with a single group: one rank-based implementation serves both (two sorts and a
few bincounts, no Python loop over users). Each returns NaN where undefined (no samples, or no
group with both labels).
"""

from __future__ import annotations

import numpy as np


def gauc(labels: np.ndarray, scores: np.ndarray, groups: np.ndarray) -> float:
    """Impressions-weighted mean of per-group AUC (tied scores: average rank), skipping one-class groups."""
    labels, scores, groups = np.asarray(labels), np.asarray(scores), np.asarray(groups)
    if len(labels) == 0:
        return float("nan")
    order = np.lexsort((scores, groups))
    g, s, y = groups[order], scores[order], labels[order].astype(np.float64)
    n = len(g)
    idx = np.arange(n)
    new_g = np.r_[True, g[1:] != g[:-1]]
    gid = np.cumsum(new_g) - 1
    rank = idx - idx[new_g][gid] + 1.0  # 1-based rank inside the group
    new_r = new_g | np.r_[True, s[1:] != s[:-1]]
    rid = np.cumsum(new_r) - 1
    avg = (np.bincount(rid, rank) / np.bincount(rid))[rid]  # a run of equal scores: its mean rank
    cnt, pos = np.bincount(gid), np.bincount(gid, y)
    rsum = np.bincount(gid, avg * y)
    neg = cnt - pos
    ok = (pos > 0) & (neg > 0)
    if not ok.any():
        return float("nan")
    auc_per_group = (rsum[ok] - pos[ok] * (pos[ok] + 1) / 2) / (pos[ok] * neg[ok])
    return float((auc_per_group * cnt[ok]).sum() / cnt[ok].sum())


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """ROC AUC of ``scores`` for binary ``labels`` (NaN unless both labels occur)."""
    labels = np.asarray(labels)
    return gauc(labels, scores, np.zeros(len(labels), dtype=np.int64))


def logloss(labels: np.ndarray, probs: np.ndarray) -> float:
    """Mean binary cross-entropy of ``probs`` (clipped to [1e-7, 1 - 1e-7]); NaN for no samples."""
    labels = np.asarray(labels)
    p = np.clip(np.asarray(probs).astype(np.float64), 1e-7, 1 - 1e-7)
    return float(-(labels * np.log(p) + (1 - labels) * np.log1p(-p)).mean()) if len(labels) else float("nan")

"""datamodules/behavior/metrics.py: AUC / GAUC / log loss of numpy arrays against sklearn and a brute-force GAUC."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import log_loss, roc_auc_score

from datamodules.behavior.metrics import auc, gauc, logloss
from utils.ranking import group_auroc
from tests.helpers import brute_force_gauc


def sample(seed: int, n: int = 3000, n_users: int = 600, ties: bool = False):
    rng = np.random.default_rng(seed)
    groups = rng.integers(0, n_users, n)
    scores = rng.random(n)
    if ties:
        scores = np.round(scores, 1)  # many tied scores inside a user
    labels = (rng.random(n) < 0.2 + 0.6 * scores).astype(np.float32)
    return labels, scores, groups


@pytest.mark.parametrize(("seed", "ties"), [(0, False), (1, True), (2, True)])
def test_gauc_equals_brute_force_per_user_sklearn(seed, ties):
    labels, scores, groups = sample(seed, ties=ties)
    one_class = [g for g in np.unique(groups) if labels[groups == g].min() == labels[groups == g].max()]
    assert one_class, "the sample must hold users with one class, which are skipped"
    assert gauc(labels, scores, groups) == pytest.approx(brute_force_gauc(labels, scores, groups), abs=1e-12)
    assert auc(labels, scores) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)


def test_gauc_is_impression_weighted():
    # user 0: 4 impressions, AUC 1; user 1: 2 impressions, AUC 0; user 2: one class, skipped
    labels = np.array([0, 0, 1, 1, 1, 0, 1, 1])
    scores = np.array([0.1, 0.2, 0.8, 0.9, 0.1, 0.9, 0.5, 0.6])
    groups = np.array([0, 0, 0, 0, 1, 1, 2, 2])
    assert gauc(labels, scores, groups) == pytest.approx((4 * 1.0 + 2 * 0.0) / 6)


def test_undefined_cases_are_nan():
    assert math.isnan(auc(np.ones(5), np.arange(5.0)))
    assert math.isnan(gauc(np.array([1, 0]), np.array([0.3, 0.4]), np.array([1, 2])))
    assert math.isnan(gauc(np.array([]), np.array([]), np.array([])))
    assert math.isnan(logloss(np.array([]), np.array([])))


def test_logloss_equals_sklearn_and_clips():
    labels, scores, _ = sample(3)
    assert logloss(labels, scores) == pytest.approx(log_loss(labels, scores), abs=1e-12)
    assert math.isfinite(logloss(np.array([1.0, 0.0]), np.array([0.0, 1.0])))  # clipped, not infinite


def test_gauc_takes_any_numpy_dtypes():
    # the data side passes float32 labels, int32 user ids and float32 probabilities; group_auroc sees
    # them as float64 scores and int64 labels and groups, with the same result as float64 inputs
    labels, scores, groups = sample(4, ties=True)
    expected = brute_force_gauc(labels, scores, groups)
    assert gauc(labels, scores.astype(np.float32), groups.astype(np.int32)) == pytest.approx(expected, abs=1e-6)
    assert gauc(labels.astype(np.int8), scores, groups) == pytest.approx(expected, abs=1e-12)
    assert gauc(labels, scores, groups) == pytest.approx(float(group_auroc(
        torch.from_numpy(scores), torch.from_numpy(labels), torch.from_numpy(groups))), abs=1e-12)

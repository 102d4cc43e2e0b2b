"""datamodules/behavior/splits.py: the split rules, the user subset, the split summary."""

from __future__ import annotations

import numpy as np
import pytest

from datamodules.behavior.splits import (
    SPLITS,
    day_split,
    per_user_last_split,
    random_split,
    split_summary,
    subsample_users,
)


def test_last_events_per_user_and_short_users_all_train():
    user = np.array([1, 1, 1, 1, 2, 2, 3, 3, 3])
    assert per_user_last_split(user).tolist() == [0, 0, 1, 2, 0, 0, 0, 1, 2]
    assert per_user_last_split(user, min_events=4).tolist() == [0, 0, 1, 2, 0, 0, 0, 0, 0]


def test_day_split_uses_the_time_zone():
    day = 86400
    t = np.array([0, day - 3600, day, 2 * day + 5, 2 * day + 7])  # in UTC
    assert day_split(t, 0.0).tolist() == [0, 0, 1, 2, 2]
    # in UTC+2 the second event (23:00 UTC) is already the next day
    assert day_split(t, 2.0).tolist() == [0, 1, 1, 2, 2]


def test_random_split_is_seeded_and_has_the_fractions():
    a = random_split(20_000, val_fraction=0.1, test_fraction=0.2, seed=4)
    np.testing.assert_array_equal(a, random_split(20_000, val_fraction=0.1, test_fraction=0.2, seed=4))
    assert not np.array_equal(a, random_split(20_000, val_fraction=0.1, test_fraction=0.2, seed=5))
    assert abs((a == 1).mean() - 0.1) < 0.01 and abs((a == 2).mean() - 0.2) < 0.01


def test_subsample_users_keeps_whole_users():
    user = np.repeat(np.arange(10), 3)
    keep = subsample_users(user, 4, np.random.default_rng(0))
    assert len(np.unique(user[keep])) == 4 and keep.sum() == 12
    assert subsample_users(user, None, np.random.default_rng(0)).all()
    assert subsample_users(user, 50, np.random.default_rng(0)).all()


def test_split_summary():
    label = np.array([1, 0, 1, 1], np.float32)
    summary = split_summary(label, np.array([1, 2, 1, 3]), np.array([0, 0, 0, 2]))
    assert list(summary) == list(SPLITS) == ["train", "val", "test"]
    assert summary["train"] == {"samples": 3, "positive_rate": pytest.approx(2 / 3), "users": 2}
    assert summary["val"] == {"samples": 0, "positive_rate": None, "users": 0}
    assert summary["test"]["samples"] == 1

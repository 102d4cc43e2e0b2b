"""datamodules/behavior/splits.py: the split rules, the user subset, the split summary."""

from __future__ import annotations

import numpy as np
import pytest

from datamodules.behavior.splits import (
    SPLITS,
    day_split,
    per_user_fraction_split,
    per_user_last_split,
    random_split,
    split_summary,
    subsample_users,
)


def test_last_events_per_user_and_short_users_all_train():
    user = np.array([1, 1, 1, 1, 2, 2, 3, 3, 3])
    assert per_user_last_split(user).tolist() == [0, 0, 1, 2, 0, 0, 0, 1, 2]
    assert per_user_last_split(user, min_events=4).tolist() == [0, 0, 1, 2, 0, 0, 0, 0, 0]


def test_user_fraction_split_fractions_on_a_user_with_50_events_and_short_users_all_train():
    # users 1..8 with 50, 1, 2, 3, 4, 5, 25 and 12 events
    counts = [50, 1, 2, 3, 4, 5, 25, 12]
    user = np.repeat(np.arange(1, 9), counts)
    split = per_user_fraction_split(user)
    per_user = {u: split[user == u].tolist() for u in range(1, 9)}
    assert per_user[1] == [0] * 40 + [1] * 5 + [2] * 5  # 10% of 50 test, the 10% before validation
    for u in (2, 3, 4, 5):  # fewer than 2 + 2 + 1 events: no room for both minimums and a train event
        assert per_user[u] == [0] * counts[u - 1]
    assert per_user[6] == [0, 1, 1, 2, 2]  # the smallest user that is split: the minimums
    assert per_user[7] == [0] * 19 + [1] * 3 + [2] * 3  # 2.5 rounds up to 3
    assert per_user[8] == [0] * 8 + [1] * 2 + [2] * 2  # 1.2 is below the minimum of 2
    wide = per_user_fraction_split(user, test_fraction=0.2, val_fraction=0.3, min_split_events=3)
    assert np.bincount(wide[user == 1], minlength=3).tolist() == [25, 15, 10]
    assert (wide[user == 6] == 0).all() and np.bincount(wide[user == 8], minlength=3).tolist() == [5, 4, 3]


def test_user_fraction_split_is_temporal_per_user_with_two_test_events_at_least():
    rng = np.random.default_rng(0)
    user = np.repeat(np.arange(200), rng.integers(1, 60, 200))
    time = rng.integers(0, 10**6, len(user))
    order = np.lexsort((time, user))  # sorted by (user, time), as the readers leave events
    user, time = user[order], time[order]
    split = per_user_fraction_split(user)
    eligible = 0
    for u in np.unique(user):
        codes, t = split[user == u], time[user == u]
        assert (np.diff(codes) >= 0).all(), "train, then validation, then test, in time order"
        if (codes == 2).any():
            eligible += 1
            assert (codes == 2).sum() >= 2 and (codes == 1).sum() >= 2 and (codes == 0).sum() >= 1
            assert t[codes == 2].min() >= t[codes < 2].max()  # no test event before a train or val one
            assert t[codes == 1].min() >= t[codes == 0].max()
            assert (codes == 2).sum() == max(2, int(np.floor(0.1 * len(codes) + 0.5)))
        else:
            assert len(codes) < 5 and (codes == 0).all()
    assert eligible > 150


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

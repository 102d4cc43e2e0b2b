"""datamodules/behavior/samples.py: position buckets, history windows, negatives, samples."""

from __future__ import annotations

import numpy as np
import pytest

from datamodules.behavior.samples import bucketize_time_delta, build_samples, history_index, sample_negatives
from models.ctr import PAD_BUCKET, ZERO_DELTA_BUCKET


def test_log_buckets_are_monotone_start_at_one_and_reserve_zero_for_padding():
    deltas = np.concatenate([[0, 1, 59, 60, 61, 179, 180], np.logspace(0, 10, 500)])
    deltas.sort()
    buckets = bucketize_time_delta(deltas, n_buckets=24)
    assert (np.diff(buckets) >= 0).all()
    assert buckets.min() == ZERO_DELTA_BUCKET and buckets.max() == 23
    assert PAD_BUCKET not in buckets
    # under a minute -> 1, [1, 3) minutes -> 2, [3, 7) -> 3: bucket k ~ 2^(k-1) minutes
    assert bucketize_time_delta([0, 59, 60, 179, 180, 419, 420], n_buckets=24).tolist() == [1, 1, 2, 2, 3, 3, 4]
    assert bucketize_time_delta([10**12], n_buckets=8).tolist() == [7]  # clipped to the last bucket
    assert bucketize_time_delta([0, 1, 2, 99], n_buckets=5, scheme="linear", time_unit=1).tolist() == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="must be >= 0"):
        bucketize_time_delta([5, -1])
    with pytest.raises(ValueError, match="scheme='sqrt' is not one of"):
        bucketize_time_delta([5], scheme="sqrt")


def test_history_index_left_and_right():
    user = np.array([1, 1, 1, 2, 2])
    idx, mask = history_index(user, seq_len=2, pad_side="left")
    assert mask.tolist() == [[False, False], [False, True], [True, True], [False, False], [False, True]]
    assert np.where(mask, idx, -1).tolist() == [[-1, -1], [-1, 0], [0, 1], [-1, -1], [-1, 3]]
    idx, mask = history_index(user, seq_len=2, pad_side="right")
    assert np.where(mask, idx, -1).tolist() == [[-1, -1], [0, -1], [0, 1], [-1, -1], [3, -1]]


def test_negatives_are_never_clicked_and_drawn_from_the_candidates():
    rng = np.random.default_rng(0)
    user = np.repeat(np.arange(1, 6), 4)
    item = rng.integers(1, 30, len(user))
    draws = sample_negatives(np.repeat(user, 3), user, item, np.unique(item), rng)
    clicked = set(zip(user.tolist(), item.tolist()))
    assert not any((u, i) in clicked for u, i in zip(np.repeat(user, 3).tolist(), draws.tolist()))
    assert set(draws.tolist()) <= set(item.tolist())


def test_build_samples_histories_minimum_and_negatives():
    # two users, events sorted by (user, time): user 1 at t = 0, 60, 600; user 2 at t = 10, 20
    user = np.array([1, 1, 1, 2, 2])
    item = np.array([1, 2, 3, 4, 5])
    time = np.array([0, 60, 600, 10, 20])
    item_category = np.array([0, 1, 1, 2, 2, 2])
    kw = dict(user=user, item=item, category=item_category[item], time=time, label=np.ones(5, np.float32),
              split=np.array([0, 1, 2, 0, 2]), seq_len=2, pad_side="left", bucketize=bucketize_time_delta)
    cols, split = build_samples(min_history=1, **kw)
    assert cols["target_item"].tolist() == [2, 3, 5]  # the first event of each user has no history
    assert split.tolist() == [1, 2, 2]
    assert cols["hist_items"].tolist() == [[0, 1], [1, 2], [0, 4]]
    assert cols["hist_positions"].tolist() == [[PAD_BUCKET, 2], bucketize_time_delta([600, 540]).tolist(), [0, 1]]
    assert (cols["hist_times"] <= cols["target_time"][:, None]).all()
    assert len(build_samples(min_history=0, **kw)[0]["label"]) == 5
    cols, split = build_samples(min_history=1, negatives=2, item_category=item_category,
                                rng=np.random.default_rng(0), **kw)
    assert cols["label"].tolist() == [1, 1, 1] + [0] * 6 and split.tolist() == [1, 2, 2] + [1, 1, 2, 2, 2, 2]
    np.testing.assert_array_equal(cols["hist_items"][3:], np.repeat(cols["hist_items"][:3], 2, axis=0))
    np.testing.assert_array_equal(cols["target_category"], item_category[cols["target_item"]])

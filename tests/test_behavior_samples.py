"""datamodules/behavior/samples.py: position buckets, history windows, negatives, samples."""

from __future__ import annotations

import numpy as np
import pytest

from datamodules.behavior.samples import bucketize_time_delta, build_samples, history_index, sample_negatives
from models.ctr_batch import PAD_BUCKET, ZERO_DELTA_BUCKET


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


def test_history_index_among_the_marked_events_only():
    user = np.array([1, 1, 1, 1, 1, 2, 2, 2])
    marked = np.array([1, 0, 1, 0, 1, 0, 1, 1], dtype=bool)
    idx, mask = history_index(user, seq_len=2, pad_side="left", among=marked)
    # user 1: events 0, 2, 4 are marked; event 3 sees 0 and 2, event 4 sees 0 and 2 (not itself)
    assert np.where(mask, idx, -1).tolist() == [[-1, -1], [-1, 0], [-1, 0], [0, 2], [0, 2],
                                                [-1, -1], [-1, -1], [-1, 6]]  # user 2 never sees user 1's
    idx, mask = history_index(user, seq_len=3, pad_side="right", among=marked)
    assert np.where(mask, idx, -1)[4].tolist() == [0, 2, -1] and np.where(mask, idx, -1)[7].tolist() == [6, -1, -1]
    everything = history_index(user, 3, "left", among=np.ones(len(user), bool))
    for got, expected in zip(everything, history_index(user, 3, "left")):
        np.testing.assert_array_equal(got, expected)
    none = history_index(user, 3, "left", among=np.zeros(len(user), bool))
    assert not none[1].any()


def _mixed_events(seed: int, n_users: int = 12):
    """Events sorted by (user, time) with labels 0 and 1 and one distinct item per event."""
    rng = np.random.default_rng(seed)
    user = np.repeat(np.arange(1, n_users + 1), rng.integers(3, 25, n_users))
    time = np.concatenate([np.sort(rng.integers(0, 10**5, (user == u).sum())) for u in range(1, n_users + 1)])
    item = np.arange(1, len(user) + 1)
    label = (rng.random(len(user)) < 0.5).astype(np.float32)
    return user, item, time, label


def test_positive_history_windows_hold_only_earlier_positives_of_the_same_user():
    user, item, time, label = _mixed_events(1)
    kw = dict(user=user, item=item, category=np.ones_like(item), time=time, label=label,
              split=np.zeros(len(user), int), seq_len=4, pad_side="left", bucketize=bucketize_time_delta, min_history=0)
    windows = {kind: build_samples(history=kind, **kw)[0] for kind in ("all", "positive")}
    assert all(len(cols["label"]) == len(user) for cols in windows.values())  # min_history 0: one sample per event
    for e in range(len(user)):
        earlier = [j for j in range(e) if user[j] == user[e]]
        expected = {"all": [int(item[j]) for j in earlier][-4:],
                    "positive": [int(item[j]) for j in earlier if label[j] == 1][-4:]}
        for kind, cols in windows.items():
            window = cols["hist_items"][e]
            assert window[window != 0].tolist() == expected[kind], (kind, e)
    cols = windows["positive"]
    real = cols["hist_items"] != 0
    assert (np.where(real, cols["hist_times"], 0) <= cols["target_time"][:, None]).all()
    assert real.sum() < (windows["all"]["hist_items"] != 0).sum()
    with pytest.raises(ValueError, match=r"history='liked' is not one of \['all', 'positive'\]"):
        build_samples(history="liked", **kw)


def test_negatives_only_for_positives_never_a_rated_item_and_in_the_positives_split():
    user, _, time, label = _mixed_events(2, n_users=20)
    rng = np.random.default_rng(0)
    item = rng.integers(1, 300, len(user))  # items repeat across users, as ratings do
    item_category = np.arange(300) % 7
    split = rng.integers(0, 3, len(user))
    cols, out_split = build_samples(user=user, item=item, category=item_category[item], time=time, label=label,
                                    split=split, seq_len=5, pad_side="left", bucketize=bucketize_time_delta,
                                    min_history=1, negatives=3, item_category=item_category,
                                    rng=np.random.default_rng(1))
    kept = np.ones(len(user), bool)
    kept[np.r_[0, np.flatnonzero(np.diff(user)) + 1]] = False  # each user's first event has no history
    n_kept, n_pos = int(kept.sum()), int(label[kept].sum())
    assert len(cols["label"]) == n_kept + 3 * n_pos and cols["label"][n_kept:].sum() == 0
    rated = set(zip(user.tolist(), item.tolist()))
    positives = np.flatnonzero(cols["label"][:n_kept] == 1)
    twin = np.repeat(positives, 3)  # the positive each negative was drawn for
    for row, pos in zip(range(n_kept, len(cols["label"])), twin):
        assert (int(cols["user"][row]), int(cols["target_item"][row])) not in rated
        assert cols["user"][row] == cols["user"][pos] and cols["target_time"][row] == cols["target_time"][pos]
        assert cols["hist_items"][row].tolist() == cols["hist_items"][pos].tolist()
        assert out_split[row] == out_split[pos]
    np.testing.assert_array_equal(cols["target_category"], item_category[cols["target_item"]])

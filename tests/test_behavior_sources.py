"""datamodules/behavior/sources.py: the registry, and each real source's samples end to end
(labels, splits without leakage, sequences, positions, negatives) on small files."""

from __future__ import annotations

import typing

import numpy as np
import pytest

from datamodules.behavior import BehaviorDataModule, bucketize_time_delta
from datamodules.behavior.readers import read_movielens_1m
from datamodules.behavior.sources import DOWNLOAD, REQUIRED_FILES, SOURCES, SourceName, get_source
from datamodules.behavior.splits import per_user_last_split
from models.ctr import PAD_BUCKET
from tests.behavior_files import DAY, T0, frame, write_amazon, write_movielens, write_user_behavior


# ------------------------------------------------------------------------------ the registry
def test_registry_is_the_source_choices():
    assert tuple(SOURCES) == typing.get_args(SourceName)
    assert typing.get_type_hints(BehaviorDataModule.__init__)["source"] == SourceName
    assert SOURCES["movielens_1m"].reader is read_movielens_1m
    assert SOURCES["amazon_electronics"].split_rule(np.array([1, 1, 1]), np.zeros(3), {}).tolist() == \
        per_user_last_split(np.array([1, 1, 1])).tolist()
    assert SOURCES["synthetic"].files is None and "synthetic" not in REQUIRED_FILES
    for name in ("movielens_1m", "taobao_user_behavior", "amazon_electronics"):
        assert REQUIRED_FILES[name] == SOURCES[name].files.names and DOWNLOAD[name].count("https://") == 1
    assert [n for n, s in SOURCES.items() if s.negatives] == ["taobao_user_behavior", "amazon_electronics"]


def test_unknown_source_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"source='criteo' is not one of \['synthetic', 'movielens_1m', "
                                         r"'taobao_user_behavior', 'amazon_electronics'\]"):
        get_source("criteo")
    assert get_source("synthetic") is SOURCES["synthetic"]


# ------------------------------------------------------------------------------ MovieLens
def test_movielens_labels_split_sequences_and_positions(tmp_path):
    folder = write_movielens(tmp_path / "ml-1m")
    dm = BehaviorDataModule(source="movielens_1m", data_dir=str(folder), cache_dir=str(tmp_path / "cache"), seq_len=3)
    dm.setup("fit")
    f = frame(dm)
    sizes = dm.feature_sizes
    # 6 movies, 3 users, genres by first listed: Animation, Adventure, Comedy, Action, Drama
    assert sizes["n_items"] == 7 and sizes["n_users"] == 4 and sizes["n_categories"] == 6
    assert sizes["profile_sizes"] == [3, 4, 4, 4]  # gender, age, occupation, zip's first digit (+1 each)
    # user 1 (id 1): movies 1@100, 2@200, 3@200, 4@300, 5@400 -> first dropped (no history)
    u1 = f["user"] == 1
    order = np.argsort(f["target_time"][u1], kind="stable")
    assert f["target_item"][u1][order].tolist() == [2, 3, 4, 5]
    assert f["label"][u1][order].tolist() == [0, 1, 0, 1]  # ratings 3, 4, 2, 4: label = rating >= 4
    assert f["split"][u1][order].tolist() == [0, 0, 1, 2]  # last test, second to last validation
    assert f["hist_items"][u1][order].tolist() == [[0, 0, 1], [0, 1, 2], [1, 2, 3], [2, 3, 4]]
    test_row = np.flatnonzero(u1)[order[-1]]
    # deltas 400-200, 400-200, 400-300 seconds -> log2(1 + d/60) buckets
    assert f["hist_positions"][test_row].tolist() == [3, 3, 2]
    assert f["hist_positions"][test_row].tolist() == bucketize_time_delta([200, 200, 100]).tolist()
    # category = the first genre: Toy Story -> Animation, Jumanji -> Adventure, Café -> Comedy
    cat = {int(i): int(c) for i, c in zip(f["target_item"], f["target_category"])}
    assert len({cat[2], cat[3], cat[4], cat[5]}) == 3 and cat[3] == cat[5]
    assert f["user_features"][u1][0].tolist() != f["user_features"][f["user"] == 2][0].tolist()
    # user 3 has only two ratings: everything train
    assert (f["split"][f["user"] == 3] == 0).all()
    # right padding puts the same items first
    dm_r = BehaviorDataModule(source="movielens_1m", data_dir=str(folder), cache_dir=str(tmp_path / "cache"),
                              seq_len=3, pad_side="right")
    f_r = frame(dm_r)
    u1r = f_r["user"] == 1
    order_r = np.argsort(f_r["target_time"][u1r], kind="stable")
    assert f_r["hist_items"][u1r][order_r].tolist() == [[1, 0, 0], [1, 2, 0], [1, 2, 3], [2, 3, 4]]


def test_movielens_temporal_split_has_no_future_leakage(tmp_path):
    rng = np.random.default_rng(0)
    lines = []
    for user in range(1, 31):
        for _ in range(rng.integers(2, 15)):
            lines.append(f"{user}::{rng.integers(1, 7)}::{rng.integers(1, 6)}::{rng.integers(0, 50) * 100}")
    rng.shuffle(lines)
    folder = write_movielens(tmp_path / "ml-1m", ratings=lines)
    dm = BehaviorDataModule(source="movielens_1m", data_dir=str(folder), cache_dir=str(tmp_path / "cache"), seq_len=4)
    f = frame(dm)
    real = f["hist_items"] != 0
    assert (np.where(real, f["hist_times"], 0) <= f["target_time"][:, None]).all()
    assert ((f["hist_positions"] == PAD_BUCKET) == ~real).all()
    delta = np.where(real, f["target_time"][:, None] - f["hist_times"], 0)
    # buckets are monotone in the delta
    flat_d, flat_b = delta[real], f["hist_positions"][real]
    by_delta = np.argsort(flat_d, kind="stable")
    assert (np.diff(flat_b[by_delta]) >= 0).all()
    for user in np.unique(f["user"]):
        u = f["user"] == user
        times = {code: f["target_time"][u & (f["split"] == code)] for code in (0, 1, 2)}
        if len(times[2]):
            assert len(times[2]) == 1 and len(times[1]) == 1
            assert times[2][0] >= times[1][0]
            assert (times[0] <= times[1][0]).all()
        # every sequence is the user's own past: its items are earlier targets or the first event
        assert set(f["hist_items"][u][real[u]].tolist()) <= set(range(1, 7))
    assert set(dm.describe()["splits"]) == {"train", "val", "test"}


def test_movielens_temporal_split_has_no_future_leakage(tmp_path):
    rng = np.random.default_rng(0)
    lines = []
    for user in range(1, 31):
        for _ in range(rng.integers(2, 15)):
            lines.append(f"{user}::{rng.integers(1, 7)}::{rng.integers(1, 6)}::{rng.integers(0, 50) * 100}")
    rng.shuffle(lines)
    folder = write_movielens(tmp_path / "ml-1m", ratings=lines)
    dm = BehaviorDataModule(source="movielens_1m", data_dir=str(folder), cache_dir=str(tmp_path / "cache"), seq_len=4)
    f = frame(dm)
    real = f["hist_items"] != 0
    assert (np.where(real, f["hist_times"], 0) <= f["target_time"][:, None]).all()
    assert ((f["hist_positions"] == PAD_BUCKET) == ~real).all()
    delta = np.where(real, f["target_time"][:, None] - f["hist_times"], 0)
    # buckets are monotone in the delta
    flat_d, flat_b = delta[real], f["hist_positions"][real]
    by_delta = np.argsort(flat_d, kind="stable")
    assert (np.diff(flat_b[by_delta]) >= 0).all()
    for user in np.unique(f["user"]):
        u = f["user"] == user
        times = {code: f["target_time"][u & (f["split"] == code)] for code in (0, 1, 2)}
        if len(times[2]):
            assert len(times[2]) == 1 and len(times[1]) == 1
            assert times[2][0] >= times[1][0]
            assert (times[0] <= times[1][0]).all()
        # every sequence is the user's own past: its items are earlier targets or the first event
        assert set(f["hist_items"][u][real[u]].tolist()) <= set(range(1, 7))
    assert set(dm.describe()["splits"]) == {"train", "val", "test"}


# ------------------------------------------------------------------------------ Taobao
def test_user_behavior_clicks_negatives_day_split_and_no_leakage(tmp_path):
    folder = write_user_behavior(tmp_path / "taobao")
    dm = BehaviorDataModule(source="taobao_user_behavior", data_dir=str(folder), cache_dir=str(tmp_path / "c"),
                            seq_len=3, seed=0)
    dm.setup("fit")
    f = frame(dm)
    sizes = dm.feature_sizes
    assert sizes["n_users"] == 4 and sizes["n_categories"] == 4  # cats 7, 8, 9 (+ padding)
    assert "profile_sizes" not in sizes and dm.n_profile_fields == 0
    # clicks with at least one earlier click: user 10: 3, user 20: 2, user 30: 1 -> 6 positives + 6 negatives
    assert len(f["label"]) == 12 and f["label"].sum() == 6
    pos, neg = f["label"] == 1, f["label"] == 0
    # item ids are remapped 1..n in raw-id order: raw 100..108 clicked or seen as pv -> 1..
    pv_items = {1, 2, 3, 4, 5, 7, 8, 9}  # raw 105 (fav) and 109 (cart) never clicked, not even stored
    assert set(f["hist_items"][f["hist_items"] != 0].tolist()) <= pv_items
    assert sizes["n_items"] == 9  # 8 clicked items + padding: only pv events define the catalogue
    # negatives share their positive's history and time, and the user never clicked them
    clicked = {u: set(f["target_item"][pos & (f["user"] == u)]) | set(f["hist_items"][f["user"] == u].ravel()) - {0}
               for u in np.unique(f["user"])}
    for row in np.flatnonzero(neg):
        assert f["target_item"][row] not in clicked[f["user"][row]]
        twin = np.flatnonzero(pos & (f["user"] == f["user"][row]) & (f["target_time"] == f["target_time"][row]))
        assert len(twin) == 1
        assert f["hist_items"][twin[0]].tolist() == f["hist_items"][row].tolist()
    # split by day in UTC+8: the last day (12-03) test, 12-02 validation
    day = (f["target_time"] - T0) // DAY
    assert (f["split"] == np.where(day == 8, 2, np.where(day == 7, 1, 0))).all()
    assert set(day[f["split"] == 2]) == {8}
    # no leakage, and positions are the buckets of the deltas
    real = f["hist_items"] != 0
    assert (np.where(real, f["hist_times"], 0) <= f["target_time"][:, None]).all()
    delta = np.where(real, f["target_time"][:, None] - f["hist_times"], 0)
    assert (f["hist_positions"] == np.where(real, bucketize_time_delta(delta), 0)).all()
    u10_test = np.flatnonzero(pos & (f["user"] == 1) & (f["split"] == 2))
    assert f["hist_items"][u10_test[0]].tolist() == [1, 2, 3]  # raw 100, 101, 102: the previous clicks


# ------------------------------------------------------------------------------ Amazon
def test_amazon_din_layout_negatives_and_last_item_test(tmp_path):
    folder = write_amazon(tmp_path / "amazon")
    dm = BehaviorDataModule(source="amazon_electronics", data_dir=str(folder), cache_dir=str(tmp_path / "c"), seq_len=4)
    dm.setup("fit")
    f = frame(dm)
    sizes = dm.feature_sizes
    assert sizes["n_items"] == 7 and sizes["n_users"] == 4
    assert sizes["n_categories"] == 4  # Laptops, Headphones, Cables (+ padding); the unreviewed ZZZ is skipped
    pos, neg = f["label"] == 1, f["label"] == 0
    assert pos.sum() == neg.sum() == 3 + 2 + 1  # each review after the first, one negative each
    # U1 (user 1): A2@20 train, A3@30 val, A4@40 test, with the previous reviews as history
    u1 = pos & (f["user"] == 1)
    order = np.argsort(f["target_time"][u1])
    assert f["target_item"][u1][order].tolist() == [2, 3, 4]
    assert f["split"][u1][order].tolist() == [0, 1, 2]
    assert f["hist_items"][u1][order][-1].tolist() == [0, 1, 2, 3]
    cat = dict(zip(f["target_item"][pos].tolist(), f["target_category"][pos].tolist()))
    real = f["hist_items"] != 0
    cat.update(zip(f["hist_items"][real].tolist(), f["hist_categories"][real].tolist()))
    assert cat[1] == cat[3] != 0 and cat[2] != cat[1]  # A1 and A3 both Laptops; A2 Headphones
    assert cat[5] == 0  # no meta: unknown category
    assert cat[6] == cat[2]  # A6: the last category path wins (Headphones)
    reviewed = {u: set(f["target_item"][pos & (f["user"] == u)]) | set(f["hist_items"][f["user"] == u].ravel()) - {0}
                for u in np.unique(f["user"])}
    for row in np.flatnonzero(neg):
        assert f["target_item"][row] not in reviewed[f["user"][row]]
    assert (np.where(f["hist_items"] != 0, f["hist_times"], 0) <= f["target_time"][:, None]).all()

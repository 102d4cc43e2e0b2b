"""datamodules/behavior/sources.py: the registry, and each real source's samples end to end
(labels, splits without leakage, sequences, positions, negatives) on small files."""

from __future__ import annotations

import typing
from pathlib import Path

import numpy as np
import pytest
import yaml

from datamodules.behavior import BehaviorDataModule, bucketize_time_delta
from datamodules.behavior.readers import read_movielens_1m, read_movielens_csv
from datamodules.behavior.sources import DOWNLOAD, REQUIRED_FILES, SOURCES, SPLIT_RULES, SourceName, get_source
from datamodules.behavior.splits import SPLIT_RULE_NAMES, day_split, per_user_fraction_split, per_user_last_split
from models.ctr_batch import PAD_BUCKET
from tests.behavior_files import (
    DAY,
    T0,
    frame,
    ml_latest_small,
    write_amazon,
    write_movielens,
    write_movielens_csv,
    write_user_behavior,
)

REPO = Path(__file__).resolve().parents[1]
REAL = ("movielens_1m", "movielens_csv", "taobao_user_behavior", "amazon_electronics")


# ------------------------------------------------------------------------------ the registry
def test_registry_is_the_source_choices():
    assert tuple(SOURCES) == typing.get_args(SourceName)
    assert typing.get_type_hints(BehaviorDataModule.__init__)["source"] == SourceName
    assert SOURCES["movielens_1m"].reader is read_movielens_1m
    assert SOURCES["movielens_csv"].reader is read_movielens_csv
    assert SOURCES["synthetic"].files is None and "synthetic" not in REQUIRED_FILES
    for name in REAL:  # one address each; the CSV family's page, and one of its zips as an example
        assert REQUIRED_FILES[name] == SOURCES[name].files.names
        assert DOWNLOAD[name].count("https://") == (2 if name == "movielens_csv" else 1)
    assert "https://grouplens.org/datasets/movielens/" in DOWNLOAD["movielens_csv"]
    assert REQUIRED_FILES["movielens_csv"] == ("ratings.csv", "movies.csv")
    assert SOURCES["movielens_csv"].files.optional == ("tags.csv",)
    # None: the source's default number of sampled negatives; a number overrides it
    assert {n: s.negatives_per_positive({"negatives_per_positive": None}) for n, s in SOURCES.items()} == \
        {"synthetic": 0, "movielens_1m": 0, "movielens_csv": 0, "taobao_user_behavior": 1, "amazon_electronics": 1}
    assert SOURCES["movielens_csv"].negatives_per_positive({"negatives_per_positive": 3}) == 3


def test_every_real_source_splits_by_the_split_argument_and_synthetic_by_its_own():
    rng = np.random.default_rng(0)
    user = np.repeat(np.arange(1, 30), rng.integers(1, 30, 29))
    time = np.sort(rng.integers(0, 20 * DAY, len(user)))  # sorted per user as well: one global order
    params = {"test_fraction": 0.2, "val_fraction": 0.1, "min_split_events": 2, "utc_offset_hours": 3.0,
              "synthetic_val_fraction": 0.1, "synthetic_test_fraction": 0.2, "seed": 0}
    expected = {"user_fraction": per_user_fraction_split(user, test_fraction=0.2, val_fraction=0.1),
                "leave_one_out": per_user_last_split(user), "last_days": day_split(time, 3.0)}
    assert set(SPLIT_RULES) == {*SPLIT_RULE_NAMES, "random"} and set(expected) == set(SPLIT_RULE_NAMES)
    for name in REAL:
        for rule, codes in expected.items():
            np.testing.assert_array_equal(SOURCES[name].cut(user, time, {**params, "split": rule}), codes)
    synthetic = SOURCES["synthetic"]
    for rule in SPLIT_RULE_NAMES:  # ignored: the random cut whatever ``split`` says
        assert synthetic.describe_split({**params, "split": rule}) == {
            "rule": "random", "synthetic_val_fraction": 0.1, "synthetic_test_fraction": 0.2, "seed": 0}
        np.testing.assert_array_equal(synthetic.cut(user, time, {**params, "split": rule}),
                                      synthetic.cut(user, time, params))
    assert SOURCES["taobao_user_behavior"].describe_split({**params, "split": "last_days"}) == \
        {"rule": "last_days", "utc_offset_hours": 3.0}


def test_unknown_source_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"source='criteo' is not one of \['synthetic', 'movielens_1m', "
                                         r"'movielens_csv', 'taobao_user_behavior', 'amazon_electronics'\]"):
        get_source("criteo")
    assert get_source("synthetic") is SOURCES["synthetic"]


# ------------------------------------------------------------------------------ MovieLens
def test_movielens_labels_split_sequences_and_positions(tmp_path):
    folder = write_movielens(tmp_path / "ml-1m")
    dm = BehaviorDataModule(source="movielens_1m", data_dir=str(folder), cache_dir=str(tmp_path / "cache"), seq_len=3,
                            split="leave_one_out")
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
                              seq_len=3, pad_side="right", split="leave_one_out")
    f_r = frame(dm_r)
    u1r = f_r["user"] == 1
    order_r = np.argsort(f_r["target_time"][u1r], kind="stable")
    assert f_r["hist_items"][u1r][order_r].tolist() == [[1, 0, 0], [1, 2, 0], [1, 2, 3], [2, 3, 4]]


def test_movielens_leave_one_out_split_has_no_future_leakage(tmp_path):
    rng = np.random.default_rng(0)
    lines = []
    for user in range(1, 31):
        for _ in range(rng.integers(2, 15)):
            lines.append(f"{user}::{rng.integers(1, 7)}::{rng.integers(1, 6)}::{rng.integers(0, 50) * 100}")
    rng.shuffle(lines)
    folder = write_movielens(tmp_path / "ml-1m", ratings=lines)
    dm = BehaviorDataModule(source="movielens_1m", data_dir=str(folder), cache_dir=str(tmp_path / "cache"), seq_len=4,
                            split="leave_one_out")
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


def test_movielens_user_fraction_split_has_no_future_leakage_and_two_test_events_per_user(tmp_path):
    rng = np.random.default_rng(0)
    lines = []
    for user in range(1, 31):
        for t in rng.choice(np.arange(200), size=rng.integers(2, 40), replace=False):
            lines.append(f"{user}::{rng.integers(1, 7)}::{rng.integers(1, 6)}::{t * 100}")
    rng.shuffle(lines)
    folder = write_movielens(tmp_path / "ml-1m", ratings=lines)
    dm = BehaviorDataModule(source="movielens_1m", data_dir=str(folder), cache_dir=str(tmp_path / "cache"), seq_len=4)
    f = frame(dm)
    real = f["hist_items"] != 0
    assert (np.where(real, f["hist_times"], 0) <= f["target_time"][:, None]).all()
    n_ratings = {u: sum(line.startswith(f"{u}::") for line in lines) for u in range(1, 31)}
    split_users = 0
    for user in np.unique(f["user"]):
        u = f["user"] == user
        times = {code: f["target_time"][u & (f["split"] == code)] for code in (0, 1, 2)}
        n = n_ratings[int(user)]  # raw ids 1..30 map to 1..30
        if n < 5:
            assert len(times[1]) == len(times[2]) == 0
            continue
        split_users += 1
        assert len(times[2]) == max(2, int(np.floor(0.1 * n + 0.5))) and len(times[1]) >= 2
        assert times[2].min() >= times[1].max() and times[1].min() >= times[0].max()
    assert split_users > 20
    assert dm.describe()["split"] == {"rule": "user_fraction", "test_fraction": 0.1, "val_fraction": 0.1,
                                      "min_split_events": 2}


# ------------------------------------------------------------------------------ Taobao
def test_user_behavior_clicks_negatives_day_split_and_no_leakage(tmp_path):
    folder = write_user_behavior(tmp_path / "taobao")
    dm = BehaviorDataModule(source="taobao_user_behavior", data_dir=str(folder), cache_dir=str(tmp_path / "c"),
                            seq_len=3, seed=0, split="last_days")
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
    dm = BehaviorDataModule(source="amazon_electronics", data_dir=str(folder), cache_dir=str(tmp_path / "c"), seq_len=4,
                            split="leave_one_out")
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


# ------------------------------------------------------------------------------ the MovieLens CSV family
def test_movielens_csv_labels_from_half_star_ratings_no_profile_and_raw_counts(tmp_path):
    folder = write_movielens_csv(tmp_path / "ml")
    dm = BehaviorDataModule(source="movielens_csv", data_dir=str(folder), cache_dir=str(tmp_path / "c"), seq_len=3)
    f = frame(dm)
    sizes = dm.feature_sizes
    assert (sizes["n_users"], sizes["n_items"], sizes["n_categories"], sizes["profile_sizes"]) == (4, 7, 5, [])
    assert dm.n_profile_fields == 0 and "user_features" not in f
    assert dm.example_batch(2)["user_features"].shape == (2, 0)
    # user 1, six ratings in time order: 3.5, 4.0, 5.0, 0.5, 4.5, 2.0 -> labels 0 1 1 0 1 0; the first has no history
    u1 = f["user"] == 1
    order = np.argsort(f["target_time"][u1], kind="stable")
    assert f["label"][u1][order].tolist() == [1, 1, 0, 1, 0]
    assert f["split"][u1][order].tolist() == [0, 1, 1, 2, 2]  # 6 ratings: 2 test, 2 validation, 2 train
    assert f["hist_items"][u1][order][-1].tolist() == [6, 3, 4]  # every rated movie, whatever the rating
    assert dm.describe()["raw"] == {"ratings": 9, "movies": 6, "tags": 3}
    assert dm.describe()["negatives_per_positive"] == 0 and len(f["label"]) == 9 - 3  # no sampled negatives
    positive = BehaviorDataModule(source="movielens_csv", data_dir=str(folder), cache_dir=str(tmp_path / "c"),
                                  seq_len=3, history="positive")
    fp = frame(positive)
    u1 = fp["user"] == 1
    order = np.argsort(fp["target_time"][u1], kind="stable")
    # only the liked movies (items 2, 6, 4 at t = 200, 300, 500): the ratings before the first like have none;
    # so few samples are left that train is empty (and the cache keeps the empty split)
    assert fp["target_time"][u1][order].tolist() == [300, 400, 500, 600]
    assert positive.split_dataset("train").num_rows == 0
    assert fp["hist_items"][u1][order].tolist() == [[0, 0, 2], [0, 2, 6], [0, 2, 6], [2, 6, 4]]
    assert positive.describe()["history"] == "positive" and positive.cache_key() != dm.cache_key()


def test_movielens_sampled_negatives_only_for_positives_never_rated_and_in_their_split(tmp_path):
    rng = np.random.default_rng(1)
    lines = []
    for user in range(1, 41):
        for movie in rng.choice(np.arange(1, 41), size=rng.integers(3, 12), replace=False):
            lines.append(f"{user}::{movie}::{rng.integers(1, 6)}::{rng.integers(0, 10**6)}")
    movies = [f"{m}::Movie {m} (1999)::{'Drama' if m % 2 else 'Comedy|Drama'}" for m in range(1, 41)]
    folder = write_movielens(tmp_path / "ml-1m", ratings=lines)
    (folder / "movies.dat").write_text("\n".join(movies) + "\n", encoding="latin-1")
    common = dict(source="movielens_1m", data_dir=str(folder), cache_dir=str(tmp_path / "c"), seq_len=4)
    plain = frame(BehaviorDataModule(**common))
    dm = BehaviorDataModule(negatives_per_positive=2, **common)
    f = frame(dm)
    assert dm.describe()["negatives_per_positive"] == 2
    n_pos = int(plain["label"].sum())
    assert len(f["label"]) == len(plain["label"]) + 2 * n_pos  # only the positives got negatives
    assert f["label"].sum() == n_pos
    rated = {}
    for line in lines:
        u, m = (int(x) for x in line.split("::")[:2])
        rated.setdefault(u, set()).add(m)  # raw ids 1..40 map to 1..40 for users and movies
    positives = {(int(u), int(t)): (sp, h.tolist()) for u, t, sp, h, y in
                 zip(f["user"], f["target_time"], f["split"], f["hist_items"], f["label"]) if y == 1}
    sampled = 0
    for row in range(len(f["label"])):
        key = (int(f["user"][row]), int(f["target_time"][row]))
        if int(f["target_item"][row]) in rated[key[0]]:
            continue  # a rated movie: a real sample (its label is its rating's)
        sampled += 1
        assert f["label"][row] == 0 and key in positives, "a sampled negative belongs to a positive"
        assert (f["split"][row], f["hist_items"][row].tolist()) == positives[key]
    assert sampled == 2 * n_pos
    # the real samples are the ones without negatives, unchanged
    assert sorted(zip(plain["user"].tolist(), plain["target_item"].tolist(), plain["label"].tolist())) == sorted(
        (u, i, y) for u, i, y in zip(f["user"].tolist(), f["target_item"].tolist(), f["label"].tolist())
        if i in rated[u])


def test_the_latest_small_overlay_holds_the_real_data(tmp_path):
    """The overlay's vocabulary sizes are the reader's on the real ml-latest-small."""
    ev = read_movielens_csv(ml_latest_small(tmp_path / "ml-latest-small"))
    overlay = yaml.safe_load((REPO / "reproductions/bst/sources/movielens_latest_small.yaml").read_text())
    net = overlay["model"]["init_args"]["net"]["init_args"]
    assert {k: net[k] for k in ("n_users", "n_items", "n_categories", "profile_sizes")} == {
        "n_users": ev["n_users"], "n_items": ev["n_items"], "n_categories": ev["n_categories"], "profile_sizes": []}
    assert (ev["n_users"], ev["n_items"], ev["counts"]["movies"], ev["counts"]["tags"]) == (611, 9743, 9742, 3683)
    assert overlay["data"]["init_args"] == {"source": "movielens_csv", "data_dir": None}
    assert len(ev["user"]) == 100_836 and set(np.unique(ev["rating"])) == set(np.arange(1, 11) / 2)

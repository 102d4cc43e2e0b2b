"""datamodules/behavior.py: buckets, the synthetic world, the three raw readers (on small files
written here in the documented formats), splits without leakage, caching, batches."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.preprocessing import OneHotEncoder

from datamodules.behavior import (
    DOWNLOAD,
    TAOBAO_TIME_WINDOW,
    BehaviorDataModule,
    DatasetMissingError,
    MalformedLineError,
    bucketize_time_delta,
    history_index,
)
from lightning_modules.metrics import group_auroc
from models.ctr import PAD_BUCKET, ZERO_DELTA_BUCKET

SPLIT_CODE = {"train": 0, "val": 1, "test": 2}


def frame(dm: BehaviorDataModule) -> dict[str, np.ndarray]:
    """All splits' columns concatenated, with a ``split`` code column."""
    parts = {}
    for name, code in SPLIT_CODE.items():
        cols = dm.split_dataset(name).with_format("numpy")[:]
        cols["split"] = np.full(len(cols["label"]), code)
        for key, value in cols.items():
            parts.setdefault(key, []).append(np.asarray(value))
    return {k: np.concatenate(v) for k, v in parts.items()}


# ------------------------------------------------------------------------------ buckets
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


# ------------------------------------------------------------------------------ config errors
def test_invalid_configs_and_missing_data_fail_early(tmp_path):
    with pytest.raises(ValueError, match=r"source='criteo' is not one of \['synthetic', 'movielens_1m'"):
        BehaviorDataModule(source="criteo")
    with pytest.raises(ValueError, match=r"pad_side='middle' is not one of \['left', 'right'\]"):
        BehaviorDataModule(pad_side="middle")
    with pytest.raises(ValueError, match=r"position_scheme='sqrt' is not one of"):
        BehaviorDataModule(position_scheme="sqrt")
    with pytest.raises(DatasetMissingError, match="ml-1m.zip"):
        BehaviorDataModule(source="movielens_1m")
    dm = BehaviorDataModule(source="movielens_1m", data_dir=str(tmp_path / "nowhere"), cache_dir=str(tmp_path))
    with pytest.raises(DatasetMissingError, match=r"does not exist.*files.grouplens.org/datasets/movielens/ml-1m.zip"):
        dm.setup("fit")
    (tmp_path / "ml").mkdir()
    (tmp_path / "ml" / "ratings.dat").write_text("1::1::5::10\n")
    dm = BehaviorDataModule(source="movielens_1m", data_dir=str(tmp_path / "ml"), cache_dir=str(tmp_path))
    with pytest.raises(DatasetMissingError, match=r"missing users.dat, movies.dat in .*ml-1m.zip"):
        dm.setup("fit")
    dm = BehaviorDataModule(source="taobao_user_behavior", data_dir=str(tmp_path / "ml"), cache_dir=str(tmp_path))
    with pytest.raises(DatasetMissingError, match=r"missing UserBehavior.csv.*Tianchi dataset 649"):
        dm.prepare_data()
    dm = BehaviorDataModule(source="amazon_electronics", data_dir=str(tmp_path / "ml"), cache_dir=str(tmp_path))
    with pytest.raises(DatasetMissingError, match=r"missing reviews_Electronics_5.json, meta_Electronics.json.*jmcauley"):
        dm.prepare_data()
    assert "jmcauley.ucsd.edu" in DOWNLOAD["amazon_electronics"]


# ------------------------------------------------------------------------------ synthetic
@pytest.fixture(scope="module")
def synthetic_dm(tmp_path_factory):
    dm = BehaviorDataModule(cache_dir=str(tmp_path_factory.mktemp("syn")), synthetic_samples=40_000,
                            synthetic_users=1000, synthetic_items=600, seed=3)
    dm.setup("fit")
    return dm


def test_synthetic_ceiling_is_high_and_profile_features_alone_fall_clearly_short(synthetic_dm):
    dm = synthetic_dm
    ceiling = dm.ceiling
    assert dm.ceiling_auc == ceiling["test_auc"]
    assert ceiling["test_auc"] > 0.74 and ceiling["test_gauc"] > 0.7
    assert dm.describe()["ceiling"] == ceiling
    # A logistic regression on the profile, the target and their crosses (what a model without
    # the sequence can see) stays far below the true probabilities: the sequence matters.
    train, test = (dm.split_dataset(s).with_format("numpy")[:] for s in ("train", "test"))

    def features(cols):
        prof, cat = cols["user_features"], cols["target_category"][:, None]
        return np.concatenate([prof, cat, prof * 1000 + cat, cols["target_item"][:, None]], axis=1)

    enc = OneHotEncoder(handle_unknown="ignore").fit(features(train))
    lr = LogisticRegression(max_iter=1000).fit(enc.transform(features(train)), train["label"])
    profile_auc = roc_auc_score(test["label"], lr.predict_proba(enc.transform(features(test)))[:, 1])
    assert 0.55 < profile_auc < ceiling["test_auc"] - 0.08
    # the ceiling is the AUC (and GAUC) of the stored true probabilities
    assert abs(roc_auc_score(test["label"], test["click_prob"]) - ceiling["test_auc"]) < 1e-9
    gauc = group_auroc(torch.from_numpy(test["click_prob"]), torch.from_numpy(test["label"]), torch.from_numpy(test["user"]))
    assert abs(float(gauc) - ceiling["test_gauc"]) < 1e-9


def test_synthetic_batches_have_the_documented_keys_shapes_and_padding(synthetic_dm):
    dm = synthetic_dm
    sizes = dm.feature_sizes
    assert sizes == {"n_users": 1001, "n_items": 601, "n_categories": 21, "profile_sizes": [3, 7, 9],
                     "n_position_buckets": 24, "seq_len": 20}
    batch = next(iter(dm.train_dataloader()))
    B, L = dm.per_device_batch_size, 20
    shapes = {"user": (B,), "user_features": (B, 3), "target_item": (B,), "target_category": (B,),
              "hist_items": (B, L), "hist_categories": (B, L), "hist_positions": (B, L), "hist_mask": (B, L),
              "label": (B,)}
    assert {k: tuple(v.shape) for k, v in batch.items()} == shapes
    assert batch["label"].dtype == torch.float32 and batch["hist_mask"].dtype == torch.bool
    assert all(batch[k].dtype == torch.long for k in shapes if k not in ("label", "hist_mask"))
    mask = batch["hist_mask"]
    assert mask.eq(batch["hist_items"] != 0).all() and mask.eq(batch["hist_positions"] != PAD_BUCKET).all()
    assert mask.eq(batch["hist_categories"] != 0).all()
    assert mask[:, -1].all(), "left padding: the newest item is last"  # min_history = 1
    for key, size in (("user", 1001), ("target_item", 601), ("hist_items", 601), ("hist_positions", 24)):
        assert batch[key].min() >= 0 and batch[key].max() < size
    frames = frame(dm)
    assert (frames["hist_times"] <= frames["target_time"][:, None]).all()
    # positions are the buckets of the true deltas
    delta = np.where(frames["hist_positions"] > 0, frames["target_time"][:, None] - frames["hist_times"], 0)
    np.testing.assert_array_equal(
        frames["hist_positions"], np.where(frames["hist_positions"] > 0, dm.bucketize(delta), 0))
    splits = dm.describe()["splits"]
    assert sum(s["samples"] for s in splits.values()) == 40_000
    assert splits["test"]["samples"] == pytest.approx(4000, rel=0.1)
    json.dumps(dm.describe())


def test_synthetic_is_seeded_and_padding_side_only_moves_the_padding(tmp_path):
    kw = dict(synthetic_samples=3000, synthetic_users=100, synthetic_items=50, synthetic_categories=5, seq_len=6,
              use_cache=False)
    a, b = BehaviorDataModule(seed=1, **kw), BehaviorDataModule(seed=1, **kw)
    c, right = BehaviorDataModule(seed=2, **kw), BehaviorDataModule(seed=1, pad_side="right", **kw)
    fa, fb, fc, fr = (frame(dm) for dm in (a, b, c, right))
    np.testing.assert_array_equal(fa["hist_items"], fb["hist_items"])
    assert not np.array_equal(fa["label"], fc["label"])
    for key in ("hist_items", "hist_categories", "hist_positions", "hist_times"):
        left_rows = [row[row != 0].tolist() if key != "hist_times" else row[fa["hist_items"][i] != 0].tolist()
                     for i, row in enumerate(fa[key])]
        right_rows = [row[row != 0].tolist() if key != "hist_times" else row[fr["hist_items"][i] != 0].tolist()
                      for i, row in enumerate(fr[key])]
        assert left_rows == right_rows, key
    n = (fr["hist_items"] != 0).sum(1)
    assert ((fr["hist_items"] != 0) == (np.arange(6)[None, :] < n[:, None])).all(), "right padding: real items first"


def test_global_batch_is_split_over_processes(synthetic_dm, tmp_path):
    dm = BehaviorDataModule(synthetic_samples=2000, synthetic_users=50, synthetic_items=40, synthetic_categories=5,
                            batch_size=256, eval_batch_size=512, use_cache=False)
    dm.trainer = SimpleNamespace(world_size=4)
    dm.setup("fit")
    assert (dm.per_device_batch_size, dm.per_device_eval_batch_size) == (64, 128)
    assert len(next(iter(dm.train_dataloader()))["label"]) == 64
    dm = BehaviorDataModule(batch_size=100, use_cache=False, synthetic_samples=2000)
    dm.trainer = SimpleNamespace(world_size=3)
    with pytest.raises(ValueError, match="batch_size=100 is the global batch and must be divisible by the 3 processes"):
        dm.setup("fit")


# ------------------------------------------------------------------------------ MovieLens
def write_movielens(folder: Path, ratings: list[str] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    movies = ["1::Toy Story (1995)::Animation|Children's|Comedy", "2::Jumanji (1995)::Adventure|Children's|Fantasy",
              "3::Caf\u00e9 Society (1995)::Comedy|Romance", "4::Heat (1995)::Action|Crime|Thriller",
              "5::Sabrina (1995)::Comedy|Romance", "6::Nixon (1995)::Drama"]
    users = ["1::F::1::10::48067", "2::M::56::16::70072", "3::M::25::15::55117"]
    if ratings is None:
        ratings = [
            "1::3::4::200",  # same second as movie 2, but later in the file
            "1::1::5::100",
            "2::6::5::50",
            "1::4::2::300",
            "1::5::4::400",
            "2::1::1::60",
            "2::2::4::70",
            "3::2::5::10",
            "3::6::3::20",
        ]
        ratings.insert(0, "1::2::3::200")
    (folder / "movies.dat").write_bytes(("\n".join(movies) + "\n").encode("latin-1"))
    (folder / "users.dat").write_bytes(("\n".join(users) + "\n").encode("latin-1"))
    (folder / "ratings.dat").write_bytes(("\n".join(ratings) + "\n").encode("latin-1"))
    return folder


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


@pytest.mark.parametrize(
    ("name", "bad", "line", "why"),
    [
        ("ratings.dat", "2::3::four::100", 3, "not all integers"),
        ("ratings.dat", "2::3::4", 3, "3 fields, not 4"),
        ("users.dat", "9::M::x::1::123", 3, "UserID, Age and Occupation must be integers"),
        ("movies.dat", "7::Only a title", 3, "2 fields, not 3"),
    ],
)
def test_movielens_malformed_line_names_file_line_and_format(tmp_path, name, bad, line, why):
    folder = write_movielens(tmp_path / "ml-1m")
    lines = (folder / name).read_bytes().decode("latin-1").splitlines()
    lines.insert(line - 1, bad)
    (folder / name).write_bytes(("\n".join(lines) + "\n").encode("latin-1"))
    dm = BehaviorDataModule(source="movielens_1m", data_dir=str(folder), use_cache=False)
    with pytest.raises(MalformedLineError, match=rf"{name}, line {line}: malformed line \({why}.*expected"):
        dm.setup("fit")


# ------------------------------------------------------------------------------ Taobao
DAY = 86400
T0 = TAOBAO_TIME_WINDOW[0]  # 2017-11-25 00:00 in UTC+8


def write_user_behavior(folder: Path, extra: list[str] = ()) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rows = [
        f"10,100,7,pv,{T0 + 3600}",
        f"10,101,7,pv,{T0 + DAY + 100}",
        f"10,101,7,buy,{T0 + DAY + 200}",
        f"10,102,8,pv,{T0 + 7 * DAY + 50}",
        f"10,103,8,pv,{T0 + 8 * DAY + 50}",
        f"10,109,9,cart,{T0 + 8 * DAY + 60}",
        f"20,100,7,pv,{T0 + 10}",
        f"20,104,9,pv,{T0 + 2 * DAY}",
        f"20,105,9,fav,{T0 + 2 * DAY + 5}",
        f"20,106,9,pv,{T0 + 8 * DAY + 7}",
        f"30,107,7,pv,{T0 + 5 * DAY}",
        f"30,108,8,pv,{T0 + 7 * DAY + 1}",
        f"30,100,7,pv,{T0 - 10 * DAY}",  # outside the window: dropped
        *extra,
    ]
    (folder / "UserBehavior.csv").write_text("\n".join(rows) + "\n")
    return folder


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


@pytest.mark.parametrize(
    ("bad", "why"),
    [("10,100,7,click,1511600000", "behavior_type 'click'"), ("10,100,7,pv", "4 fields, not 5"),
     ("10,abc,7,pv,1511600000", "a non-integer id")],
)
def test_user_behavior_malformed_line(tmp_path, bad, why):
    folder = write_user_behavior(tmp_path / "taobao")
    lines = (folder / "UserBehavior.csv").read_text().splitlines()
    lines.insert(4, bad)
    (folder / "UserBehavior.csv").write_text("\n".join(lines) + "\n")
    dm = BehaviorDataModule(source="taobao_user_behavior", data_dir=str(folder), use_cache=False)
    with pytest.raises(MalformedLineError, match=rf"UserBehavior.csv, line 5: malformed line \({why}"):
        dm.setup("fit")


# ------------------------------------------------------------------------------ Amazon
def write_amazon(folder: Path, bad_review_line: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    reviews = []
    plan = {"U1": [("A1", 10), ("A2", 20), ("A3", 30), ("A4", 40)], "U2": [("A2", 5), ("A5", 15), ("A1", 25)],
            "U3": [("A6", 7), ("A3", 8)]}
    for user, items in plan.items():
        for asin, t in items:
            reviews.append(json.dumps({"reviewerID": user, "asin": asin, "reviewerName": "x", "helpful": [0, 0],
                                       "reviewText": "ok", "overall": 5.0, "summary": "s", "unixReviewTime": t,
                                       "reviewTime": "01 1, 2014"}))
    if bad_review_line is not None:
        reviews.insert(2, bad_review_line)
    (folder / "reviews_Electronics_5.json").write_text("\n".join(reviews) + "\n")
    meta = [
        "{'asin': 'A1', 'categories': [['Electronics', 'Computers & Accessories', 'Laptops']], 'title': \"Bob's laptop\"}",
        "{'asin': 'A2', 'categories': [['Electronics', 'Headphones']]}",
        '{"asin": "A3", "categories": [["Electronics", "Computers & Accessories", "Laptops"]]}',
        "{'asin': 'A4', 'salesRank': {'Electronics': 5}, 'categories': [['Electronics', 'Cables']]}",
        "{'asin': 'ZZZ', 'categories': [['Electronics', 'Unreviewed']]}",
        "{'asin': 'A6', 'categories': [['Electronics', 'Audio'], ['Electronics', 'Headphones']]}",
    ]  # A5 has no meta line: category unknown (0)
    (folder / "meta_Electronics.json").write_text("\n".join(meta) + "\n")
    return folder


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


def test_amazon_malformed_review_line(tmp_path):
    folder = write_amazon(tmp_path / "amazon", bad_review_line='{"reviewerID": "U9", "asin": "A1"}')
    dm = BehaviorDataModule(source="amazon_electronics", data_dir=str(folder), use_cache=False)
    with pytest.raises(MalformedLineError, match=r"reviews_Electronics_5.json, line 3: malformed line \(KeyError"):
        dm.setup("fit")
    folder = write_amazon(tmp_path / "amazon2")
    with open(folder / "meta_Electronics.json", "a") as fh:
        fh.write("{'asin': 'A5', 'categories': [['Electronics', 'Cables']\n")  # truncated literal
    dm = BehaviorDataModule(source="amazon_electronics", data_dir=str(folder), use_cache=False)
    with pytest.raises(MalformedLineError, match=r"meta_Electronics.json, line 7: malformed line"):
        dm.setup("fit")


# ------------------------------------------------------------------------------ cache
def test_cache_second_setup_skips_preprocessing_and_tracks_files_and_params(tmp_path, monkeypatch):
    folder = write_movielens(tmp_path / "ml-1m")
    cache = tmp_path / "cache"
    kw = dict(source="movielens_1m", data_dir=str(folder), cache_dir=str(cache), seq_len=3)
    first = BehaviorDataModule(**kw)
    first.prepare_data()
    first.setup("fit")
    assert first.cache_status == "built"
    assert first.cache_path.parent == cache and (first.cache_path / "meta.json").is_file()
    assert [p.name for p in cache.iterdir()] == [first.cache_path.name], "no temporary folders left behind"

    def boom(self):
        raise AssertionError("preprocessed again")

    monkeypatch.setattr(BehaviorDataModule, "preprocess", boom)
    second = BehaviorDataModule(**kw)
    second.setup("fit")
    assert second.cache_status == "loaded" and second.cache_path == first.cache_path
    assert second.feature_sizes == first.feature_sizes
    np.testing.assert_array_equal(frame(second)["hist_items"], frame(first)["hist_items"])
    # another preprocessing parameter, or a changed file, is another cache entry
    assert BehaviorDataModule(**{**kw, "seq_len": 4}).cache_key() != first.cache_key()
    assert BehaviorDataModule(**{**kw, "pad_side": "right"}).cache_key() != first.cache_key()
    assert BehaviorDataModule(**{**kw, "batch_size": 64}).cache_key() == first.cache_key()
    key = first.cache_key()
    assert first.cache_path.name.endswith(key)
    stat = (folder / "ratings.dat").stat()
    os.utime(folder / "ratings.dat", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert BehaviorDataModule(**kw).cache_key() != key
    monkeypatch.undo()
    third = BehaviorDataModule(**kw)
    third.setup("fit")
    assert third.cache_status == "built"


def test_describe_is_json_and_example_batch_fits(tmp_path):
    folder = write_movielens(tmp_path / "ml-1m")
    dm = BehaviorDataModule(source="movielens_1m", data_dir=str(folder), cache_dir=str(tmp_path / "c"), seq_len=3)
    desc = dm.describe()
    json.dumps(desc)
    assert desc["source"] == "movielens_1m" and desc["position"]["scheme"] == "log"
    assert desc["ceiling"] is None and dm.ceiling_auc is None
    batch = dm.example_batch(2)
    assert batch["hist_items"].shape == (2, 3) and batch["user_features"].shape == (2, 4)


def test_loaders_survive_lightnings_distributed_sampler_swap():
    """Under DDP Lightning rebuilds each DataLoader with a DistributedSampler; batches stay dicts."""
    from lightning.pytorch.utilities.data import _update_dataloader
    from torch.utils.data import DistributedSampler

    dm = BehaviorDataModule(synthetic_samples=2000, synthetic_users=50, synthetic_items=40, synthetic_categories=5,
                            seq_len=5, batch_size=64, use_cache=False)
    dm.trainer = SimpleNamespace(world_size=2)
    dm.setup("fit")
    counts = []
    for rank in (0, 1):
        loader = dm.val_dataloader()
        loader = _update_dataloader(loader, DistributedSampler(loader.dataset, num_replicas=2, rank=rank, shuffle=False))
        batches = list(loader)
        assert all(isinstance(b, dict) and b["hist_items"].shape[1] == 5 for b in batches)
        assert max(len(b["label"]) for b in batches) == 32
        counts.append(sum(len(b["label"]) for b in batches))
    n_val = dm.describe()["splits"]["val"]["samples"]
    assert counts[0] == counts[1] and sum(counts) in (n_val, n_val + 1)  # padded to equal shares

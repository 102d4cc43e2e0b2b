"""datamodules/behavior/synthetic.py: the seeded world, its click rule's reach, its ceiling."""

from __future__ import annotations

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.preprocessing import OneHotEncoder

from datamodules.behavior import BehaviorDataModule
from datamodules.behavior.metrics import auc, gauc
from datamodules.behavior.synthetic import SYNTHETIC_PROFILE_CARDINALITIES, generate_synthetic, synthetic_ceiling
from utils.ranking import group_auroc
from models.ctr_batch import PAD, PAD_BUCKET
from tests.behavior_files import frame, synthetic_dm  # noqa: F401 (a fixture)


def test_generated_columns_ids_histories_and_probabilities():
    kw = dict(n_users=40, n_items=30, n_categories=6, n_samples=500, seq_len=5, min_history=1, seed=2)
    cols = generate_synthetic(**kw)
    again = generate_synthetic(**kw)
    assert all(np.array_equal(cols[k], again[k]) for k in cols)
    valid = cols["hist_items"] != PAD
    assert valid[:, -1].all() and (valid.sum(1) >= 1).all()  # left-aligned, min_history items
    assert ((cols["hist_positions"] == PAD_BUCKET) == ~valid).all() and ((cols["hist_categories"] == PAD) == ~valid).all()
    assert cols["user"].min() >= 1 and cols["user"].max() <= 40 and cols["target_item"].max() <= 30
    assert cols["user_features"].shape == (500, len(SYNTHETIC_PROFILE_CARDINALITIES))
    assert (cols["user_features"] <= np.array(SYNTHETIC_PROFILE_CARDINALITIES)).all() and cols["user_features"].min() >= 1
    assert (np.where(valid, cols["hist_times"], 0) <= cols["target_time"][:, None]).all()
    assert ((cols["click_prob"] > 0) & (cols["click_prob"] < 1)).all()


def test_ceiling_scores_the_true_probabilities_per_split():
    cols = generate_synthetic(n_users=50, n_items=40, n_categories=5, n_samples=3000, seq_len=4, min_history=1, seed=0)
    split = np.arange(3000) % 3
    ceiling = synthetic_ceiling(cols, split)
    assert set(ceiling) == {f"{s}_{m}" for s in ("train", "val", "test") for m in ("auc", "gauc", "logloss")}
    m = split == 1
    assert ceiling["val_auc"] == auc(cols["label"][m], cols["click_prob"][m])
    assert ceiling["val_gauc"] == gauc(cols["label"][m], cols["click_prob"][m], cols["user"][m])


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

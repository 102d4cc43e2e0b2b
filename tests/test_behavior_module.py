"""datamodules/behavior/module.py: BehaviorDataModule's arguments (Literal choices, checks),
batches, the global batch over processes, describe."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from jsonargparse import ArgumentParser

from datamodules.behavior import DOWNLOAD, BehaviorDataModule, DatasetMissingError
from models.ctr_batch import PAD_BUCKET
from tests.behavior_files import frame, synthetic_dm, write_movielens  # noqa: F401 (a fixture)


# ------------------------------------------------------------------------------ arguments
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


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"seq_len": 0}, r"seq_len=0 must be positive"),
        ({"batch_size": -2}, r"batch_size=-2 must be positive"),
        ({"max_users": 0}, r"max_users=0 must be positive"),
        ({"n_position_buckets": 2}, r"n_position_buckets=2 must be an int >= 3"),
        ({"position_log_base": 1.0}, r"position_log_base=1.0 must be > 1"),
        ({"min_history": 5, "seq_len": 4}, r"min_history=5 must be in \[0, seq_len=4\]"),
        ({"synthetic_items": 3, "synthetic_categories": 5}, r"every category needs an item"),
        ({"synthetic_val_fraction": 0.6, "synthetic_test_fraction": 0.5}, r"must be < 1"),
        ({"taobao_time_window": (5, 5)}, r"start < end"),
        ({"test_fraction": 0.0}, r"test_fraction=0.0 must be in \(0, 1\)"),
        ({"val_fraction": 1.0}, r"val_fraction=1.0 must be in \(0, 1\)"),
        ({"test_fraction": 0.5, "val_fraction": 0.5}, r"test_fraction \+ val_fraction = 1.0 must be < 1"),
        ({"min_split_events": 0}, r"min_split_events=0 must be an int >= 1"),
        ({"negatives_per_positive": -1},
         r"negatives_per_positive=-1 must be None \(the source's default\) or an int >= 0"),
        ({"split": "random"}, r"split='random' is not one of \['user_fraction', 'leave_one_out', 'last_days'\]"),
        ({"history": "liked"}, r"history='liked' is not one of \['all', 'positive'\]"),
        ({"source": "taobao_user_behavior", "negatives_per_positive": 0},
         r"negatives_per_positive=0 leaves source='taobao_user_behavior' with positives only.*its default, 1"),
        ({"source": "amazon_electronics", "negatives_per_positive": 0}, r"AUC is undefined"),
    ],
)
def test_checks_a_type_cannot_express(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BehaviorDataModule(**kwargs)


def test_command_line_rejects_a_closed_choice_while_parsing_and_lists_the_choices(capsys):
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(BehaviorDataModule, "data")
    assert parser.parse_args(["--data.pad_side", "right"]).data.pad_side == "right"
    assert parser.parse_args(["--data.split", "leave_one_out"]).data.split == "leave_one_out"
    assert parser.parse_args([]).data.negatives_per_positive is None
    for flag, bad in (("source", "criteo"), ("pad_side", "middle"), ("position_scheme", "sqrt"), ("split", "random"),
                      ("history", "liked")):
        with pytest.raises(Exception, match=bad):
            parser.parse_args([f"--data.{flag}", bad])
    parser.print_help()
    shown = capsys.readouterr().out
    assert "{synthetic,movielens_1m,movielens_csv,taobao_user_behavior,amazon_electronics}" in shown
    assert "{left,right}" in shown and "{log,linear}" in shown
    assert "{user_fraction,leave_one_out,last_days}" in shown and "{all,positive}" in shown


def test_synthetic_ignores_the_real_sources_split_history_and_negatives(synthetic_dm):
    """Its random split and generated histories: these arguments change neither its samples nor its cache key."""
    base = BehaviorDataModule(synthetic_samples=2000, use_cache=False)
    other = BehaviorDataModule(synthetic_samples=2000, use_cache=False, split="leave_one_out", test_fraction=0.3,
                               val_fraction=0.2, min_split_events=4, history="positive", negatives_per_positive=3)
    assert base.preprocessing_params() == other.preprocessing_params()
    assert not {"split", "test_fraction", "val_fraction", "min_split_events", "history",
                "negatives_per_positive"} & set(base.preprocessing_params())
    assert base.describe()["splits"] == other.describe()["splits"]
    assert synthetic_dm.describe()["split"] == {"rule": "random", "synthetic_val_fraction": 0.1,
                                                "synthetic_test_fraction": 0.1, "seed": 3}


def test_a_real_sources_cache_key_follows_its_split_and_none_is_its_default_negatives(tmp_path):
    folder = write_movielens(tmp_path / "ml-1m")
    keys = {}
    for name, kw in {"default": {}, "none": {"negatives_per_positive": None}, "zero": {"negatives_per_positive": 0},
                     "one": {"negatives_per_positive": 1}, "loo": {"split": "leave_one_out"},
                     "test": {"test_fraction": 0.2}, "history": {"history": "positive"}}.items():
        keys[name] = BehaviorDataModule(source="movielens_1m", data_dir=str(folder), **kw).cache_key()
    assert keys["default"] == keys["none"] == keys["zero"]  # None stands for the source's default, 0
    assert len({keys[k] for k in ("default", "one", "loo", "test", "history")}) == 5


def test_split_dataset_names_the_splits(synthetic_dm):
    with pytest.raises(ValueError, match=r"split='dev' is not one of \['train', 'val', 'test'\]"):
        synthetic_dm.split_dataset("dev")


# ------------------------------------------------------------------------------ batches
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


def test_describe_is_json_and_example_batch_fits(tmp_path):
    folder = write_movielens(tmp_path / "ml-1m")
    dm = BehaviorDataModule(source="movielens_1m", data_dir=str(folder), cache_dir=str(tmp_path / "c"), seq_len=3)
    desc = dm.describe()
    json.dumps(desc)
    assert desc["source"] == "movielens_1m" and desc["position"]["scheme"] == "log"
    assert desc["ceiling"] is None and dm.ceiling_auc is None
    assert desc["split"] == {"rule": "user_fraction", "test_fraction": 0.1, "val_fraction": 0.1, "min_split_events": 2}
    assert desc["history"] == "all" and desc["negatives_per_positive"] == 0
    assert desc["raw"] == {"ratings": 10, "movies": 6, "users_with_profile": 3}
    loo = BehaviorDataModule(source="movielens_1m", data_dir=str(folder), cache_dir=str(tmp_path / "c"), seq_len=3,
                             split="leave_one_out", test_fraction=0.3).describe()
    assert loo["split"] == {"rule": "leave_one_out"}  # the fractions are not its parameters
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

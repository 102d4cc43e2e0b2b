"""Splits (``datamodules/images/splits.py``): stratified, nested, every class trained on."""

from __future__ import annotations

import numpy as np
import pytest

from datamodules.images import balanced_subset, stratified_split
from datamodules.images.splits import check_every_class_trains, split_rows


def test_balanced_subset_nested_for_every_size():
    labels = np.random.default_rng(0).integers(0, 4, size=60)
    previous: set[int] = set()
    for n in range(1, 41):
        chosen = balanced_subset(labels, n, 4, np.random.default_rng(7))
        counts = np.bincount(labels[chosen], minlength=4)
        assert len(chosen) == n and counts.max() - counts.min() <= 1
        assert previous <= set(chosen.tolist())
        previous = set(chosen.tolist())



def test_balanced_subset_names_a_class_that_is_too_small():
    labels = np.array([0] * 10 + [1] * 10 + [2] * 2)
    with pytest.raises(ValueError, match=r"class 2 \('c'\).*only 2"):
        balanced_subset(labels, 12, 3, np.random.default_rng(0), class_names=["a", "b", "c"])


def test_stratified_split_holds_out_each_class_share():
    labels = np.repeat(np.arange(3), [10, 20, 7])
    held, rest = stratified_split(labels, 0.3, np.random.default_rng(0))
    assert len(held) == round(0.3 * len(labels)) and sorted(np.concatenate([held, rest]).tolist()) == list(range(37))
    counts = np.bincount(labels[held], minlength=3)
    assert np.all(np.abs(counts - 0.3 * np.array([10, 20, 7])) < 1)


def test_check_every_class_trains_names_the_value_and_the_minimum():
    labels = np.arange(10).repeat(3)
    check_every_class_trains(labels, 10, train_samples=10, held_out="val_fraction=0.1")  # one per class: fine
    with pytest.raises(ValueError) as error:
        check_every_class_trains(labels, 10, train_samples=5, held_out="val_fraction=0.1")
    assert str(error.value) == (
        "train_samples=5 leaves classes [5..9] with no training image; use at least 10 (one per class)"
    )
    with pytest.raises(ValueError, match=r"no training image of classes \[0, 3\.\.4\] \(of 5\): holding out val"):
        check_every_class_trains(np.array([1, 2, 2]), 5, train_samples=None, held_out="val_fraction=0.5")
    with pytest.raises(ValueError, match=r"classes \[4\] \('e'\) \(of 5\): the source's train split has none"):
        check_every_class_trains(np.arange(4), 5, None, "val_fraction=0.1", np.arange(4), class_names=list("abcde"))


def test_split_rows_depend_on_split_seed_only_and_partition_the_pool():
    labels = np.arange(4).repeat(25)
    kwargs = dict(val_fraction=0.1, test_fraction=0.2, train_samples=8, num_classes=4, class_names=list("abcd"))
    a, b = split_rows(labels, None, split_seed=3, **kwargs), split_rows(labels, None, split_seed=3, **kwargs)
    assert all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("train", "subset", "val", "test"))
    assert a.test_from_train and len(a.test) == 20 and len(a.val) == 8 and len(a.subset) == 8
    assert sorted(np.concatenate([a.train, a.val, a.test]).tolist()) == list(range(100))
    assert set(a.subset.tolist()) <= set(a.train.tolist())
    official = split_rows(labels, np.arange(4), split_seed=3, **kwargs)
    assert not official.test_from_train and official.test.tolist() == [0, 1, 2, 3]

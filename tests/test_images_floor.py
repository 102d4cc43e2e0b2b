"""The pixel floor (``datamodules/images/floor.py``): C chosen on validation, never on test; cached once."""

from __future__ import annotations

import numpy as np
import pytest

from datamodules.images import ImageDataModule
from datamodules.images import floor as floor_module
from datamodules.images.floor import datamodule_floor, fit_floor, pixels, split_arrays


def _blobs(rng: np.random.Generator, n0: int, n1: int) -> tuple[np.ndarray, np.ndarray]:
    """Class 0 around -1, class 1 around +1 (two features)."""
    x = np.concatenate([rng.normal(-1.0, 1.0, (n0, 2)), rng.normal(1.0, 1.0, (n1, 2))])
    return x, np.array([0] * n0 + [1] * n1)


def _data():
    """Train and validation from one distribution (70% class 0): using the features wins there. The test split
    is all class 0 placed where class 1 lives: only a model that ignores the features (tiny C predicts the
    majority) gets it right, so the test split would choose the smallest C."""
    rng = np.random.default_rng(0)
    train, val = _blobs(rng, 700, 300), _blobs(rng, 700, 300)
    test = (rng.normal(2.0, 0.3, (200, 2)), np.zeros(200, dtype=np.int64))
    return train, val, test


def test_c_is_chosen_on_validation_even_where_test_prefers_another(monkeypatch):
    from sklearn.linear_model import LogisticRegression

    train, val, test = _data()
    grid = (1e-6, 1.0)
    fits = []
    original = LogisticRegression.fit
    monkeypatch.setattr(LogisticRegression, "fit", lambda self, x, y: (fits.append(self.C), original(self, x, y))[1])
    calls = []

    def spy():
        calls.append(list(fits))  # every fit of the grid is done when the test split is first asked for
        return test

    result = fit_floor(train, val, spy, grid=grid)
    assert calls == [[1e-6, 1.0]]
    assert result["C"] == 1.0 and result["val_by_C"]["1"] > result["val_by_C"]["1e-06"] + 0.1
    assert result["val_acc"] == result["val_by_C"]["1"]
    assert result["test_acc"] < 0.05  # validation's choice, whatever the test split would have preferred
    only_tiny = fit_floor(train, val, lambda: test, grid=(1e-6,))
    assert only_tiny["test_acc"] > 0.95  # the test split did prefer the smallest C
    assert (result["n_train"], result["n_val"], result["n_test"]) == (1000, 1000, 200)


def test_ties_keep_the_stronger_regularisation_and_bad_grids_are_refused():
    x = np.array([[0.0], [1.0]] * 20)
    y = np.array([0, 1] * 20)
    result = fit_floor((x, y), (x, y), lambda: (x, y), grid=(10.0, 1.0, 100.0))
    assert result["val_acc"] == 1.0 and result["C"] == 1.0
    with pytest.raises(ValueError, match="positive"):
        fit_floor((x, y), (x, y), lambda: (x, y), grid=(0.0, 1.0))


def test_pixels_are_flattened_in_zero_one():
    images = np.array([[[[0, 255], [51, 102]]]], dtype=np.uint8)
    np.testing.assert_allclose(pixels(images), [[0.0, 1.0, 0.2, 0.4]], rtol=1e-6)
    assert pixels(images).dtype == np.float32


@pytest.fixture
def digits(tmp_path):
    dm = ImageDataModule(source="digits", train_samples=300, cache_dir=str(tmp_path))
    dm.prepare_data()
    dm.setup("fit")
    return dm


def test_the_arrays_are_the_datamodules_own_splits(digits):
    (x_train, y_train), (x_val, y_val), test = split_arrays(digits)
    assert len(y_train) == 300 and np.bincount(y_train).tolist() == [30] * 10  # the balanced subset
    assert len(y_val) == len(digits.val_dataset) and x_val.shape[1] == 64
    expected = digits.train_dataset.images[digits.train_dataset.indices].reshape(300, -1).numpy() / 255.0
    np.testing.assert_allclose(x_train, expected, rtol=1e-6)
    x_test, y_test = test()
    assert len(y_test) == len(digits.test_dataset) and 0.0 <= x_test.min() and x_test.max() <= 1.0


def test_a_second_call_reads_the_cache(digits, monkeypatch, tmp_path):
    first = datamodule_floor(digits, grid=(0.1, 1.0))
    assert not first["cached"] and first["C"] in (0.1, 1.0) and 0.8 < first["test_acc"] <= 1.0
    assert list((tmp_path / "attention-repro" / "floors").glob("digits-300-*.json"))
    def computed(*args, **kwargs):
        raise RuntimeError("computed again")

    monkeypatch.setattr(floor_module, "fit_floor", computed)
    second = datamodule_floor(digits, grid=(0.1, 1.0))
    assert second["cached"] and {k: second[k] for k in ("C", "val_acc", "test_acc")} == \
        {k: first[k] for k in ("C", "val_acc", "test_acc")}  # fmt: skip
    with pytest.raises(RuntimeError, match="computed again"):  # another grid is another floor
        datamodule_floor(digits, grid=(0.1, 1.0, 10.0))

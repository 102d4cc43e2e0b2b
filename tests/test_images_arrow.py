"""uint8 arrays to and from ``datasets`` (``datamodules/images/arrow.py``): exact, any view."""

from __future__ import annotations

import datasets
import numpy as np
import pytest

from datamodules.images.arrow import array_column, array_dataset, label_column


@pytest.fixture
def arrays():
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (50, 2, 5, 3), dtype=np.uint8), rng.integers(0, 4, 50)


def test_array_dataset_round_trips_through_the_features(arrays, tmp_path):
    images, labels = arrays
    ds = array_dataset(images, labels, ["a", "b", "c", "d"])
    assert ds.features["image"] == datasets.Array3D(shape=(2, 5, 3), dtype="uint8")
    assert ds.features["label"] == datasets.ClassLabel(names=["a", "b", "c", "d"])
    assert np.array_equal(ds[7]["image"], images[7]) and ds[7]["label"] == labels[7]  # the row API agrees
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "saved"))
    loaded = datasets.load_from_disk(str(tmp_path / "saved"))["train"]  # memory-mapped, as the caches are
    assert np.array_equal(array_column(loaded, "image"), images)
    got = label_column(loaded, "label")
    assert got.dtype == np.int64 and got.flags.writeable and np.array_equal(got, labels)


def test_columns_of_a_view_follow_its_rows(arrays):
    images, labels = arrays
    ds = array_dataset(images, labels, ["a", "b", "c", "d"])
    order = np.random.default_rng(1).permutation(50)[:20]
    view = ds.select(order)
    assert np.array_equal(array_column(view, "image"), images[order])
    assert np.array_equal(label_column(view, "label"), labels[order])
    empty = ds.select([])
    assert array_column(empty, "image").shape == (0, 2, 5, 3) and label_column(empty, "label").shape == (0,)

"""uint8 arrays to and from ``datasets`` (``datamodules/images/arrow.py``, ``decode.py``): exact, any view."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
from PIL import Image

from datamodules.images.arrow import array_column, array_dataset, label_column
from datamodules.images.decode import decode_batch, decoded_features


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


def test_decode_batch_writes_the_decoded_features():
    rng = np.random.default_rng(0)
    pictures = [Image.fromarray(rng.integers(0, 256, (4, 6, 3), dtype=np.uint8)) for _ in range(3)]
    table = decode_batch(pictures, [2, 0, 1], mode="L", size=None, shape=(1, 4, 6))
    assert datasets.Features.from_arrow_schema(table.schema) == decoded_features((1, 4, 6))
    ds = datasets.Dataset.from_dict({"picture": pictures, "y": [2, 0, 1]})
    decoded = ds.map(decode_batch, batched=True, input_columns=["picture", "y"], remove_columns=["picture", "y"],
                     fn_kwargs={"mode": "L", "size": None, "shape": (1, 4, 6)}, features=decoded_features((1, 4, 6)))
    expected = np.stack([np.asarray(p.convert("L"))[None] for p in pictures])
    assert np.array_equal(array_column(decoded, "image"), expected)
    with pytest.raises(ValueError, match="differ in size.*set image_size"):
        decode_batch(pictures, [0, 0, 0], mode="L", size=None, shape=(1, 5, 5))

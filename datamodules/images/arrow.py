"""uint8 image arrays to and from Hugging Face ``datasets`` and Arrow, through their public API.

An image column is an ``Array3D(shape=(C, H, W), dtype="uint8")`` feature. Its Arrow storage (nested lists
of uint8) is built from the numpy buffer directly and read back the same way: ``Dataset.from_dict`` and the
``numpy`` format go through one Python object per row or per image and cost seconds on Fashion-MNIST, these
functions milliseconds.
"""

from __future__ import annotations

from collections.abc import Sequence

import datasets
import numpy as np
import pyarrow as pa


def image_features(shape: Sequence[int], label: datasets.ClassLabel | datasets.Value) -> datasets.Features:
    """The features of an array dataset: an ``image`` Array3D(uint8) column and a ``label`` column."""
    return datasets.Features(
        {"image": datasets.Array3D(shape=tuple(int(d) for d in shape), dtype="uint8"), "label": label}
    )


def _nested_lists(array: np.ndarray) -> pa.Array:
    """(N, *dims) uint8 as Arrow list<list<...<uint8>>> of N rows, without copying the pixels."""
    values: pa.Array = pa.array(np.ascontiguousarray(array, dtype=np.uint8).reshape(-1))
    for dim in reversed(array.shape[1:]):
        rows = len(values) // dim
        offsets = pa.array(np.arange(0, rows * dim + 1, dim, dtype=np.int32))
        values = pa.ListArray.from_arrays(offsets, values)
    return values


def array_table(images: np.ndarray, labels: np.ndarray, features: datasets.Features) -> pa.Table:
    """An Arrow table of ``features`` (see ``image_features``) holding ``images`` (N, C, H, W) and ``labels``."""
    schema = features.arrow_schema  # its image field type is the Array3D extension type of ``datasets``
    image = pa.ExtensionArray.from_storage(schema.field("image").type, _nested_lists(images))
    return pa.table([image, pa.array(np.asarray(labels, dtype=np.int64))], schema=schema)


def array_dataset(images: np.ndarray, labels: np.ndarray, class_names: Sequence[str]) -> datasets.Dataset:
    """A ``datasets.Dataset`` with an ``image`` Array3D(uint8) column and a ``label`` ClassLabel column.

    The table is handed over as an in-memory Arrow stream (``Dataset.from_buffer``, zero-copy).
    """
    features = image_features(images.shape[1:], datasets.ClassLabel(names=list(class_names)))
    table = array_table(images, labels, features)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return datasets.Dataset.from_buffer(sink.getvalue())


def _arrow_column(ds: datasets.Dataset, column: str) -> pa.ChunkedArray:
    """One column as Arrow, with any ``select``/``shuffle`` view applied, no other column touched."""
    return ds.select_columns([column]).with_format("arrow")[:][column]


def array_column(ds: datasets.Dataset, column: str) -> np.ndarray:
    """An Array3D column as one (N, *shape) numpy array, read from the Arrow buffers without copies per row."""
    shape = tuple(ds.features[column].shape)
    parts = []
    for chunk in _arrow_column(ds, column).chunks:
        values = chunk.storage if isinstance(chunk, pa.ExtensionArray) else chunk
        for _ in shape:
            values = values.flatten()
        parts.append(values.to_numpy(zero_copy_only=False).reshape((len(chunk), *shape)))
    return np.concatenate(parts) if parts else np.zeros((0, *shape), dtype=np.uint8)


def label_column(ds: datasets.Dataset, column: str) -> np.ndarray:
    """An integer column as a writable int64 array, read without decoding any other column."""
    return np.array(_arrow_column(ds, column).to_numpy(), dtype=np.int64)

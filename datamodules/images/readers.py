"""Raw files we parse ourselves, read into uint8 numpy arrays: Fashion-MNIST's idx files, sklearn's digits.

What comes out is (N, 1, H, W) uint8 images and int64 labels; ``cache.cached_arrays`` turns them into a
``datasets`` cache once.
"""

from __future__ import annotations

import gzip
import math
import struct
from pathlib import Path

import numpy as np

FASHION_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
FASHION_MNIST_CLASSES = [
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
]  # fmt: skip


def read_idx(path: Path, ndim: int) -> np.ndarray:
    """Read an idx file of unsigned bytes (``.gz`` or plain) with ``ndim`` dimensions, checking its header."""
    try:
        with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError
        raise ValueError(f"{path}: cannot read this idx file ({e}); it is corrupt or truncated, replace it") from e
    expected_magic = 0x0800 | ndim
    magic = int.from_bytes(data[:4], "big") if len(data) >= 4 else None
    if magic != expected_magic:
        found = "a file shorter than 4 bytes" if magic is None else f"0x{magic:08x}"
        raise ValueError(
            f"{path}: malformed idx file: magic number {found}, expected 0x{expected_magic:08x} "
            f"(unsigned bytes, {ndim} dimensions); replace the file"
        )
    header = 4 + 4 * ndim
    if len(data) < header:
        raise ValueError(f"{path}: malformed idx file: truncated header ({len(data)} bytes); replace the file")
    dims = struct.unpack(f">{ndim}I", data[4:header])
    size = math.prod(dims)
    if len(data) - header != size:
        raise ValueError(
            f"{path}: malformed idx file: the header gives dimensions {dims} ({size} bytes of data) but the file "
            f"holds {len(data) - header} bytes of data; replace the file"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims)


def read_idx_pair(images_path: Path, labels_path: Path, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """(images (N, 1, H, W) uint8, labels (N,) int64) from an idx images file and its labels file."""
    images = read_idx(images_path, 3)
    labels = read_idx(labels_path, 1)
    if len(images) != len(labels):
        raise ValueError(f"{images_path} holds {len(images)} images but {labels_path} holds {len(labels)} labels")
    if labels.size and int(labels.max()) >= num_classes:
        raise ValueError(f"{labels_path}: label {int(labels.max())} is out of range 0..{num_classes - 1}")
    return images[:, None], labels.astype(np.int64)


def find_fashion_files(directory: Path) -> dict[str, tuple[Path, Path]] | None:
    """The four Fashion-MNIST idx files in ``directory`` (``.gz`` preferred), or None if any is missing."""
    found = {}
    for split, names in FASHION_MNIST_FILES.items():
        paths = []
        for name in names:
            path = next((p for p in (directory / f"{name}.gz", directory / name) if p.is_file()), None)
            if path is None:
                return None
            paths.append(path)
        found[split] = tuple(paths)
    return found


def read_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 8x8 digits: (1797, 1, 8, 8) uint8 (its 0..16 scaled to 0..255), (1797,) int64 labels."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.rint(digits.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)[:, None]
    return images, digits.target.astype(np.int64)

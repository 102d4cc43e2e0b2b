"""Shared fixtures and data writers of the ``tests/test_images_*.py`` files (offline, CPU, tiny data).

Every cache goes to tmp_path; the hub is forced offline (HF_HUB_OFFLINE=1). A test file takes the fixtures
by importing them: ``from tests.images_helpers import cache, isolated  # noqa: F401``.
"""

from __future__ import annotations

import gzip
import io
import struct
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from PIL import Image

from datamodules.images import ImageDataModule

DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")
DIGITS_N = 1797


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    """No user data dirs, no default caches in the home directory, no network, no leaked Lightning seed."""
    monkeypatch.delenv("DATA_DIR", raising=False)
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "default-hf-cache"))


@pytest.fixture
def cache(tmp_path) -> str:
    return str(tmp_path / "cache")


@pytest.fixture
def fashion_dir(tmp_path) -> Path:
    write_fashion(tmp_path / "fashion")
    return tmp_path / "fashion"


def make(cache: str, **kwargs) -> ImageDataModule:
    dm = ImageDataModule(cache_dir=cache, **kwargs)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def rows(dataset) -> set[int]:
    return set(dataset.indices.tolist())


def class_counts(labels, num_classes: int = 10) -> np.ndarray:
    return np.bincount(np.asarray(labels), minlength=num_classes)



# ------------------------------------------------------------------------------------- data writers


def write_idx(path: Path, array: np.ndarray, magic: int | None = None, truncate: int = 0) -> None:
    """Write ``array`` (uint8) as a gzipped idx file in the real format: big-endian magic, dims, raw bytes."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    magic = 0x0800 | array.ndim if magic is None else magic
    header = struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + array.tobytes()
    with gzip.open(path, "wb") as f:
        f.write(payload[: len(payload) - truncate])


def write_fashion(directory: Path, n_train: int = 60, n_test: int = 20, seed: int = 0) -> dict[str, np.ndarray]:
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    data = {
        "train_x": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train_y": rng.permutation(np.arange(n_train) % 10).astype(np.uint8),
        "test_x": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "test_y": rng.permutation(np.arange(n_test) % 10).astype(np.uint8),
    }
    write_idx(directory / "train-images-idx3-ubyte.gz", data["train_x"])
    write_idx(directory / "train-labels-idx1-ubyte.gz", data["train_y"])
    write_idx(directory / "t10k-images-idx3-ubyte.gz", data["test_x"])
    write_idx(directory / "t10k-labels-idx1-ubyte.gz", data["test_y"])
    return data


def write_folder(root: Path, classes=("cat", "dog", "frog"), per_class: int = 6, size=(10, 12), mode="RGB", seed=0):
    """PNG image folder root/<class>/<i>.png; returns {raw bytes of the (H, W[, C]) array: class index}."""
    rng = np.random.default_rng(seed)
    written = {}
    for k, name in enumerate(classes):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            shape = (*size, 3) if mode == "RGB" else size
            pixels = rng.integers(0, 256, shape, dtype=np.uint8)
            Image.fromarray(pixels, mode=mode).save(root / name / f"{i}.png")
            written[pixels.tobytes()] = k
    return written


def chw_to_key(image: torch.Tensor) -> bytes:
    array = image.numpy()
    return (array[0] if array.shape[0] == 1 else array.transpose(1, 2, 0)).tobytes()


def hub_like(splits: dict[str, int], image_column: str = "img", seed: int = 0, **label_columns) -> datasets.DatasetDict:
    """A DatasetDict shaped like a hub image dataset: PIL images plus ClassLabel columns (name=class names)."""
    rng = np.random.default_rng(seed)
    features = {"caption": datasets.Value("string"), image_column: datasets.Image()}
    features |= {c: datasets.ClassLabel(names=names) for c, names in label_columns.items()}
    out = {}
    for split, n in splits.items():
        columns = {
            "caption": [f"image {i}" for i in range(n)],
            image_column: [Image.fromarray(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)) for _ in range(n)],
        }
        columns |= {c: [i % len(names) for i in range(n)] for c, names in label_columns.items()}
        out[split] = datasets.Dataset.from_dict(columns, features=datasets.Features(features))
    return datasets.DatasetDict(out)


def jpeg_bytes(rng: np.random.Generator, size=(12, 16), quality: int = 90) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


def write_jpeg_folder(root: Path, splits=("train", "val"), classes=("n01", "n02"), per_class: int = 5,
                      size=(12, 16), seed: int = 0) -> dict[str, int]:  # fmt: skip
    """ImageNet-layout JPEGs: root/<split>/<class>/<i>.JPEG; returns {relative path: class index}."""
    rng = np.random.default_rng(seed)
    written = {}
    for split in splits:
        for k, name in enumerate(classes):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                rel = f"{split}/{name}/{i}.JPEG"
                (root / rel).write_bytes(jpeg_bytes(rng, size))
                written[rel] = k
    return written

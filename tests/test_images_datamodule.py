"""Tests for datamodules/images.py: offline, CPU, tiny real or generated data.

Every cache goes to tmp_path; the hub is forced offline (HF_HUB_OFFLINE=1) except in the one test that checks
the reachability probe against a closed local port. Only the Debian Fashion-MNIST test touches 60k images.
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import struct
import time
from pathlib import Path
from types import SimpleNamespace

import datasets
import huggingface_hub.constants
import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import RandomSampler

import datamodules.images as images_mod
from datamodules.images import AUGMENTS, SOURCES, ImageDataModule, SeededRandomSampler, balanced_subset

DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")
DIGITS_N = 1797


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    """No user data dirs, no default caches in the home directory, no network, no leaked Lightning seed."""
    monkeypatch.delenv("DATA_DIR", raising=False)
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "default-hf-cache"))


@pytest.fixture
def cache(tmp_path) -> str:
    return str(tmp_path / "cache")


def make(cache: str, **kwargs) -> ImageDataModule:
    dm = ImageDataModule(cache_dir=cache, **kwargs)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def rows(dataset) -> set[int]:
    return set(dataset.indices.tolist())


def class_counts(labels, num_classes: int = 10) -> np.ndarray:
    return np.bincount(np.asarray(labels), minlength=num_classes)


# ---------------------------------------------------------------------------------------------------- fixtures


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


# ---------------------------------------------------------------------------------------------------- splits


def test_digits_splits_add_up_and_are_stratified(cache):
    from sklearn.datasets import load_digits

    dm = make(cache, source="digits", val_fraction=0.1, test_fraction=0.2)
    train, val, test = rows(dm.train_dataset), rows(dm.val_dataset), rows(dm.test_dataset)
    assert len(train) + len(val) + len(test) == DIGITS_N
    assert train | val | test == set(range(DIGITS_N)) and not (train & val or train & test or val & test)
    assert len(test) == round(0.2 * DIGITS_N) and len(val) == round(0.1 * (DIGITS_N - len(test)))
    assert (dm.num_classes, dm.input_shape, dm.class_names) == (10, (1, 8, 8), [str(d) for d in range(10)])

    full = class_counts(load_digits().target)
    test_counts = class_counts(dm.test_dataset.targets)
    val_counts = class_counts(dm.val_dataset.targets)
    assert np.all(np.abs(test_counts - 0.2 * full) < 1)
    assert np.all(np.abs(val_counts - 0.1 * (full - test_counts)) < 1)
    # the pixels are sklearn's 0..16 scaled to uint8 0..255
    assert dm.train_dataset.images.dtype == torch.uint8 and int(dm.train_dataset.images.max()) == 255


def test_split_seed_alone_determines_the_splits(cache, monkeypatch):
    a = make(cache, source="digits", split_seed=1)
    monkeypatch.setenv("PL_GLOBAL_SEED", "123")  # a different training seed must not move the split
    b = make(cache, source="digits", split_seed=1)
    c = make(cache, source="digits", split_seed=2)
    for name in ("train_dataset", "val_dataset", "test_dataset"):
        assert rows(getattr(a, name)) == rows(getattr(b, name))
    assert rows(a.test_dataset) != rows(c.test_dataset)
    assert rows(a.val_dataset) != rows(c.val_dataset)


def test_train_samples_are_nested_and_class_balanced(cache):
    full = make(cache, source="digits")
    subsets = {}
    for n in (7, 25, 100, 333):
        dm = make(cache, source="digits", train_samples=n)
        subset = rows(dm.train_dataset)
        counts = class_counts(dm.train_dataset.targets)
        assert len(subset) == n and len(dm.train_dataset) == n
        assert counts.max() - counts.min() <= 1
        assert subset <= rows(full.train_dataset)  # drawn from the train split, never from val/test
        subsets[n] = subset
    sizes = sorted(subsets)
    for small, large in zip(sizes, sizes[1:], strict=False):
        assert subsets[small] < subsets[large]


def test_balanced_subset_nested_for_every_size():
    labels = np.random.default_rng(0).integers(0, 4, size=60)
    previous: set[int] = set()
    for n in range(1, 41):
        chosen = balanced_subset(labels, n, 4, np.random.default_rng(7))
        counts = np.bincount(labels[chosen], minlength=4)
        assert len(chosen) == n and counts.max() - counts.min() <= 1
        assert previous <= set(chosen.tolist())
        previous = set(chosen.tolist())


def test_train_samples_errors(cache):
    dm = ImageDataModule(cache_dir=cache, source="digits", train_samples=5000)
    with pytest.raises(ValueError, match=r"train_samples=5000.*1294"):
        dm.setup()
    labels = np.array([0] * 10 + [1] * 10 + [2] * 2)
    with pytest.raises(ValueError, match=r"class 2 \('c'\).*only 2"):
        balanced_subset(labels, 12, 3, np.random.default_rng(0), class_names=["a", "b", "c"])


def test_val_fraction_zero_gives_an_empty_val_loader(cache):
    dm = make(cache, source="digits", val_fraction=0.0)
    assert len(dm.val_dataset) == 0 and len(dm.val_dataloader()) == 0
    assert len(dm.train_dataset) + len(dm.test_dataset) == DIGITS_N


# ---------------------------------------------------------------------------------------------------- loaders


def test_global_batch_is_split_across_devices(cache):
    dm = ImageDataModule(cache_dir=cache, source="digits", batch_size=128, eval_batch_size=64)
    dm.trainer = SimpleNamespace(world_size=2)
    dm.setup()
    assert dm.per_device_batch_size == 64 and dm.per_device_eval_batch_size == 32
    assert dm.train_dataloader().batch_size == 64 and dm.test_dataloader().batch_size == 32
    assert next(iter(dm.train_dataloader()))[0].shape[0] == 64

    alone = make(cache, source="digits", batch_size=128)
    assert alone.per_device_batch_size == 128

    odd = ImageDataModule(cache_dir=cache, source="digits", batch_size=127)
    odd.trainer = SimpleNamespace(world_size=2)
    with pytest.raises(ValueError, match=r"batch_size=127.*world size 2"):
        odd.setup()


def test_batches_are_normalised_float_with_int64_labels(cache):
    dm = make(cache, source="digits", batch_size=64)
    xs, ys = [], []
    for x, y in dm.train_dataloader():
        assert x.dtype == torch.float32 and x.shape[1:] == (1, 8, 8) and y.dtype == torch.int64
        xs.append(x)
        ys.append(y)
    x = torch.cat(xs)
    assert len(x) == len(dm.train_dataset) // 64 * 64  # drop_last: the split holds >= 2 batches
    assert abs(x.mean().item()) < 0.05 and abs(x.std().item() - 1) < 0.05
    assert set(torch.cat(ys).tolist()) == set(range(10))

    # the stats come from the train split's raw pixels and map uint8 v to (v / 255 - mean) / std
    raw = dm.train_dataset.images[dm.train_dataset.indices].double() / 255
    assert dm.mean[0] == pytest.approx(raw.mean().item()) and dm.std[0] == pytest.approx(raw.std().item(), rel=1e-3)
    x0, y0 = dm.test_dataset[0]
    j = dm.test_dataset.indices[0]
    expected = (dm.test_dataset.images[j].float() / 255 - dm.mean[0]) / dm.std[0]
    assert torch.allclose(x0, expected, atol=1e-5) and y0 == dm.test_dataset.labels[j]

    # eval loaders: no shuffle, no drop
    test_batches = list(dm.test_dataloader())
    assert sum(len(b[0]) for b in test_batches) == len(dm.test_dataset)
    first = torch.stack([dm.test_dataset[i][0] for i in range(64)])
    assert torch.allclose(test_batches[0][0], first)


def test_given_mean_and_std_are_used(cache):
    dm = make(cache, source="digits", mean=[0.5], std=[0.25])
    x, _ = dm.test_dataset[3]
    raw = dm.test_dataset.images[dm.test_dataset.indices[3]].float() / 255
    assert torch.allclose(x, (raw - 0.5) / 0.25, atol=1e-5)
    with pytest.raises(ValueError, match="3 values but the images have 1 channel"):
        make(cache, source="digits", mean=[0.5] * 3, std=[0.25] * 3)


@pytest.mark.parametrize(("batch_size", "drop_last"), [(8, True), (16, False)])
def test_drop_last_only_when_the_train_split_holds_two_batches(cache, batch_size, drop_last):
    dm = make(cache, source="digits", train_samples=20, batch_size=batch_size)
    loader = dm.train_dataloader()
    assert loader.drop_last is drop_last
    assert sum(len(b[1]) for b in loader) == (16 if drop_last else 20)


def test_sampler_order_depends_only_on_seed_and_epoch():
    data = list(range(50))
    a, b = SeededRandomSampler(data, seed=1), SeededRandomSampler(data, seed=1)
    assert isinstance(a, RandomSampler)  # so Lightning treats the loader as shuffled
    a.set_epoch(3)
    b.set_epoch(3)
    order = list(a)
    assert order == list(a) == list(b) and sorted(order) == data and order != data
    b.set_epoch(4)
    assert list(b) != order
    other_seed = SeededRandomSampler(data, seed=2)
    other_seed.set_epoch(3)
    assert list(other_seed) != order


def test_train_loader_uses_the_lightning_global_seed(cache, monkeypatch):
    dm = make(cache, source="digits")
    monkeypatch.setenv("PL_GLOBAL_SEED", "7")
    sampler = dm.train_dataloader().sampler
    assert isinstance(sampler, SeededRandomSampler) and sampler.seed == 7


def test_lightning_sets_the_epoch_so_a_resumed_run_sees_the_same_order(cache, monkeypatch):
    """The order Lightning feeds each epoch is the sampler's (seed, epoch) permutation, nothing else."""
    import lightning as L

    class Recorder(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(64, 10)
            self.seen: dict[int, list[torch.Tensor]] = {}

        def training_step(self, batch, batch_idx):
            x, y = batch
            self.seen.setdefault(self.current_epoch, []).append(x.clone())
            return torch.nn.functional.cross_entropy(self.layer(x.flatten(1)), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    monkeypatch.setenv("PL_GLOBAL_SEED", "0")  # restored after the test; seed_everything overwrites it
    L.seed_everything(3, verbose=False)
    dm = ImageDataModule(cache_dir=cache, source="digits", train_samples=40, batch_size=8)
    model = Recorder()
    trainer = L.Trainer(
        max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
    )  # fmt: skip
    trainer.fit(model, datamodule=dm)
    for epoch in (0, 1):
        sampler = SeededRandomSampler(dm.train_dataset, seed=3)
        sampler.set_epoch(epoch)
        order = sampler.permutation()
        expected = torch.stack([dm.train_dataset[i][0] for i in order])
        assert torch.equal(torch.cat(model.seen[epoch]), expected)
    assert not torch.equal(torch.cat(model.seen[0]), torch.cat(model.seen[1]))


# ---------------------------------------------------------------------------------------------------- augment


@pytest.fixture
def fashion_dir(tmp_path) -> Path:
    write_fashion(tmp_path / "fashion")
    return tmp_path / "fashion"


@pytest.mark.parametrize("augment", AUGMENTS)
@pytest.mark.parametrize("source", ["digits", "fashion_mnist"])
def test_every_augment_runs_and_changes_only_training_images(cache, fashion_dir, source, augment):
    data_dir = str(fashion_dir) if source == "fashion_mnist" else None
    plain = make(cache, source=source, data_dir=data_dir)
    dm = make(cache, source=source, data_dir=data_dir, augment=augment, batch_size=16)
    shape = (1, 8, 8) if source == "digits" else (1, 28, 28)
    torch.manual_seed(0)
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (16, *shape) and x.dtype == torch.float32 and torch.isfinite(x).all()
    batch = list(range(16))
    augmented = torch.stack([s[0] for s in dm.train_dataset.__getitems__(batch)])
    reference = torch.stack([s[0] for s in plain.train_dataset.__getitems__(batch)])
    assert torch.equal(augmented, reference) is (augment == "none")
    # evaluation data is never augmented
    assert torch.equal(dm.test_dataset[0][0], plain.test_dataset[0][0])


# ---------------------------------------------------------------------------------------------------- Fashion-MNIST


@pytest.mark.skipif(
    not (DEBIAN_DIR / "train-images-idx3-ubyte.gz").is_file(),
    reason=f"{DEBIAN_DIR} absent: install the Debian package dataset-fashion-mnist to run this test",
)
def test_fashion_mnist_from_the_debian_files(cache):
    dm = make(cache, source="fashion_mnist")
    info = dm.describe()
    assert info["origin"] == str(DEBIAN_DIR) and info["test_split"] == "official test"
    assert len(dm.train_dataset) + len(dm.val_dataset) == 60000 and len(dm.test_dataset) == 10000
    assert dm.input_shape == (1, 28, 28) and dm.num_classes == 10 and dm.class_names[9] == "Ankle boot"
    with gzip.open(DEBIAN_DIR / "t10k-labels-idx1-ubyte.gz") as f:
        labels = np.frombuffer(f.read(), dtype=np.uint8, offset=8)
    assert np.array_equal(dm.test_dataset.targets.numpy(), labels)  # official order kept
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (128, 1, 28, 28) and abs(x.mean().item()) < 0.3


@pytest.mark.parametrize("where", ["data_dir", "DATA_DIR/fashion-mnist", "DATA_DIR"])
def test_fashion_mnist_from_idx_files_round_trips(cache, tmp_path, monkeypatch, where):
    target = {"data_dir": tmp_path / "given", "DATA_DIR/fashion-mnist": tmp_path / "data" / "fashion-mnist"}
    directory = target.get(where, tmp_path / "data")
    data = write_fashion(directory, n_train=40, n_test=12, seed=3)
    if where != "data_dir":
        monkeypatch.setenv("DATA_DIR", str(tmp_path / "data"))
    dm = make(cache, source="fashion_mnist", data_dir=str(directory) if where == "data_dir" else None)
    assert dm.describe()["origin"] == str(directory)
    assert len(dm.train_dataset) + len(dm.val_dataset) == 40 and len(dm.test_dataset) == 12
    test = dm.test_dataset
    assert np.array_equal(test.images[test.indices][:, 0].numpy(), data["test_x"])
    assert np.array_equal(test.targets.numpy(), data["test_y"])
    # what the loader serves, de-normalised, is the file's pixels
    x, y = next(iter(dm.test_dataloader()))
    pixels = ((x[:, 0] * dm.std[0] + dm.mean[0]) * 255).round().to(torch.uint8)
    assert torch.equal(pixels, torch.from_numpy(data["test_x"])) and torch.equal(
        y, torch.from_numpy(data["test_y"]).long()
    )
    pool = dm.train_dataset.images[:, 0].numpy()
    assert np.array_equal(pool, data["train_x"])


@pytest.mark.parametrize(
    ("bad_file", "kind"),
    [
        ("train-images-idx3-ubyte.gz", "magic"),
        ("t10k-labels-idx1-ubyte.gz", "truncated"),
        ("train-labels-idx1-ubyte.gz", "not gzip"),
    ],
)
def test_malformed_idx_file_is_named_in_the_error(cache, fashion_dir, bad_file, kind):
    path = fashion_dir / bad_file
    if kind == "magic":
        write_idx(path, np.zeros((60, 28, 28), np.uint8), magic=0x0801)
    elif kind == "truncated":
        write_idx(path, np.zeros(20, np.uint8), truncate=3)
    else:
        path.write_bytes(b"this is not a gzip file")
    dm = ImageDataModule(cache_dir=cache, source="fashion_mnist", data_dir=str(fashion_dir))
    with pytest.raises(ValueError, match="malformed|cannot read") as error:
        dm.prepare_data()
    assert str(path) in str(error.value)


def test_fashion_mnist_second_setup_reads_the_cache(cache, fashion_dir, monkeypatch):
    first = make(cache, source="fashion_mnist", data_dir=str(fashion_dir))
    cached = sorted((Path(cache) / "attention-repro").iterdir())
    assert [p.name.startswith("fashion_mnist-") for p in cached] == [True]  # one cache, no temp dirs left

    def no_parsing(*args, **kwargs):
        raise AssertionError("the idx files were parsed again instead of read from the cache")

    monkeypatch.setattr(images_mod, "_read_idx", no_parsing)
    second = make(cache, source="fashion_mnist", data_dir=str(fashion_dir))
    assert torch.equal(second.train_dataset.images, first.train_dataset.images)

    # a changed source file (new mtime) invalidates the cache: conversion is attempted again
    path = fashion_dir / "t10k-labels-idx1-ubyte.gz"
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    with pytest.raises(AssertionError, match="parsed again"):
        make(cache, source="fashion_mnist", data_dir=str(fashion_dir))


def test_an_interrupted_cache_write_leaves_no_cache(cache, fashion_dir, monkeypatch):
    real_save = datasets.DatasetDict.save_to_disk

    def save_then_die(self, path, *args, **kwargs):
        real_save(self, path, *args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(datasets.DatasetDict, "save_to_disk", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        make(cache, source="fashion_mnist", data_dir=str(fashion_dir))
    assert list((Path(cache) / "attention-repro").iterdir()) == []
    monkeypatch.setattr(datasets.DatasetDict, "save_to_disk", real_save)
    assert len(make(cache, source="fashion_mnist", data_dir=str(fashion_dir)).test_dataset) == 20


def test_fashion_mnist_missing_everywhere_says_where_it_looked(cache, tmp_path, monkeypatch):
    monkeypatch.setenv("DATA_DIR", str(tmp_path / "data"))
    (tmp_path / "data").mkdir()
    monkeypatch.setattr(images_mod, "FASHION_MNIST_DEBIAN_DIR", str(tmp_path / "no-debian"))
    dm = ImageDataModule(cache_dir=cache, source="fashion_mnist")
    with pytest.raises(FileNotFoundError) as error:
        dm.prepare_data()
    message = str(error.value)
    for place in (tmp_path / "data" / "fashion-mnist", tmp_path / "data", tmp_path / "no-debian"):
        assert str(place) in message
    for hint in ("zalando-datasets/fashion_mnist", "apt-get install dataset-fashion-mnist", "DATA_DIR", "network"):
        assert hint in message

    with pytest.raises(FileNotFoundError, match="does-not-exist"):
        ImageDataModule(cache_dir=cache, source="fashion_mnist", data_dir=str(tmp_path / "does-not-exist"))


# ---------------------------------------------------------------------------------------------------- folder


def test_folder_without_test_split_holds_one_out(cache, tmp_path):
    written = write_folder(tmp_path / "imgs")
    dm = make(cache, source="folder", data_dir=str(tmp_path / "imgs"), batch_size=4)
    assert dm.class_names == ["cat", "dog", "frog"] and dm.input_shape == (3, 10, 12)
    assert dm.describe()["test_split"] == "held out" and dm.describe()["in_memory"] is True
    assert len(dm.test_dataset) == round(0.2 * 18)
    assert len(dm.train_dataset) + len(dm.val_dataset) + len(dm.test_dataset) == 18
    for split in (dm.train_dataset, dm.val_dataset, dm.test_dataset):
        for j in split.indices.tolist():  # every pixel array is a written image, with its class as label
            assert written[chw_to_key(split.images[j])] == int(split.labels[j])
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (4, 3, 10, 12) and y.dtype == torch.int64


def test_folder_with_test_split_and_resize(cache, tmp_path):
    write_folder(tmp_path / "imgs" / "train", per_class=5, seed=1)
    write_folder(tmp_path / "imgs" / "test", per_class=2, seed=2)
    dm = make(cache, source="folder", data_dir=str(tmp_path / "imgs"), image_size=8)
    assert dm.describe()["test_split"] == "official test" and len(dm.test_dataset) == 6
    assert len(dm.train_dataset) + len(dm.val_dataset) == 15
    assert dm.input_shape == (3, 8, 8) and next(iter(dm.test_dataloader()))[0].shape == (6, 3, 8, 8)
    assert sorted(dm.test_dataset.targets.tolist()) == [0, 0, 1, 1, 2, 2]


def test_lazy_folder_serves_the_same_tensors_as_in_memory(cache, tmp_path):
    write_folder(tmp_path / "imgs", per_class=4)
    kwargs = {"source": "folder", "data_dir": str(tmp_path / "imgs"), "batch_size": 4}
    memory = make(cache, **kwargs)
    lazy = make(cache, max_in_memory_bytes=0, **kwargs)
    assert memory.in_memory is True and lazy.in_memory is False
    assert lazy.mean == pytest.approx(memory.mean) and lazy.std == pytest.approx(memory.std)
    assert lazy.input_shape == memory.input_shape
    for a, b in zip(lazy.test_dataloader(), memory.test_dataloader(), strict=True):
        assert torch.allclose(a[0], b[0], atol=1e-5) and torch.equal(a[1], b[1])
    lazy_aug = make(cache, augment="randaugment", max_in_memory_bytes=0, **kwargs)
    assert next(iter(lazy_aug.train_dataloader()))[0].shape == (4, 3, 10, 12)


def test_grayscale_folder_has_one_channel(cache, tmp_path):
    write_folder(tmp_path / "imgs", mode="L", per_class=3)
    dm = make(cache, source="folder", data_dir=str(tmp_path / "imgs"))
    assert dm.input_shape == (1, 10, 12) and len(dm.mean) == 1


def test_folder_errors_name_the_path(cache, tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match=str(missing)):
        ImageDataModule(cache_dir=cache, source="folder", data_dir=str(missing))
    (tmp_path / "empty" / "cat").mkdir(parents=True)
    (tmp_path / "empty" / "cat" / "notes.txt").write_text("no images here")
    with pytest.raises(FileNotFoundError, match=r"no images .*empty"):
        ImageDataModule(cache_dir=cache, source="folder", data_dir=str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="needs data_dir"):
        ImageDataModule(cache_dir=cache, source="folder")
    write_folder(tmp_path / "mixed", classes=("x",), size=(10, 12))
    write_folder(tmp_path / "mixed", classes=("y",), size=(9, 9), seed=1)
    with pytest.raises(ValueError, match="differ in size.*set image_size"):
        make(cache, source="folder", data_dir=str(tmp_path / "mixed"))
    assert make(cache, source="folder", data_dir=str(tmp_path / "mixed"), image_size=9).input_shape == (3, 9, 9)


# ---------------------------------------------------------------------------------------------------- hub


@pytest.mark.parametrize(
    ("source", "name"), [("cifar10", "uoft-cs/cifar10"), ("someone/tiny-images", "someone/tiny-images")]
)
def test_offline_hub_load_fails_fast_and_clearly(cache, source, name):
    before = (datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE)
    dm = ImageDataModule(cache_dir=cache, source=source)
    start = time.monotonic()
    with pytest.raises(FileNotFoundError) as error:
        dm.prepare_data()
    assert time.monotonic() - start < 20
    message = str(error.value)
    assert name in message and "not in the local datasets cache" in message and "network" in message
    assert (datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE) == before


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


def test_hub_sources_pick_their_columns_and_splits(cache, monkeypatch):
    loaded = []

    def fake_load(name, cache_dir):
        loaded.append(name)
        return hubs[name]

    hubs = {
        "uoft-cs/cifar100": hub_like(
            {"train": 30, "test": 8}, coarse_label=["c0", "c1"], fine_label=["f0", "f1", "f2"]
        ),
        "owner/pictures": hub_like(
            {"train": 20, "validation": 6}, image_column="picture", label=["a", "b"], other=list("xyz")
        ),
    }
    monkeypatch.setattr(images_mod, "_load_hub_dataset", fake_load)
    dm = make(cache, source="cifar100")
    assert loaded[-1] == "uoft-cs/cifar100" and dm.class_names == ["f0", "f1", "f2"]  # fine, not coarse
    assert dm.input_shape == (3, 6, 6) and len(dm.test_dataset) == 8 and dm.describe()["test_split"] == "official test"
    assert dm.test_dataset.targets.tolist() == [i % 3 for i in range(8)]

    dm = make(cache, source="owner/pictures")  # first Image column, first ClassLabel column, validation as test
    assert dm.class_names == ["a", "b"] and len(dm.test_dataset) == 6
    assert dm.describe()["test_split"] == "official validation"
    assert make(cache, source="owner/pictures", label_column="other").class_names == ["x", "y", "z"]
    with pytest.raises(ValueError, match="no label column 'nope'.*set label_column"):
        make(cache, source="owner/pictures", label_column="nope")


def test_unreachable_hub_is_detected_by_the_probe(cache, monkeypatch):
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    for var in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    with socket.socket() as s:  # a local port nobody listens on: connections are refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    start = time.monotonic()
    with pytest.raises(FileNotFoundError, match=r"uoft-cs/cifar100.*unreachable"):
        ImageDataModule(cache_dir=cache, source="cifar100").prepare_data()
    assert time.monotonic() - start < 20
    assert datasets.config.HF_HUB_OFFLINE is False and huggingface_hub.constants.HF_HUB_OFFLINE is False


# ---------------------------------------------------------------------------------------------------- config


def test_bad_config_values_fail_at_construction(cache):
    with pytest.raises(ValueError, match="unknown source 'mnist'") as error:
        ImageDataModule(source="mnist")
    assert all(s in str(error.value) for s in SOURCES)
    with pytest.raises(ValueError, match="unknown augment 'mixup'") as error:
        ImageDataModule(augment="mixup")
    assert all(a in str(error.value) for a in AUGMENTS)
    for kwargs, pattern in [
        ({"val_fraction": 1.0}, "val_fraction=1.0"),
        ({"val_fraction": -0.1}, "val_fraction=-0.1"),
        ({"test_fraction": 0.0}, "test_fraction=0.0"),
        ({"batch_size": 0}, "batch_size=0"),
        ({"train_samples": 0}, "train_samples=0"),
        ({"image_mode": "CMYK"}, "image_mode 'CMYK'"),
        ({"mean": [0.5]}, "mean=.*std="),
        ({"mean": [0.5], "std": [0.0]}, "std=.*positive"),
    ]:
        with pytest.raises(ValueError, match=pattern):
            ImageDataModule(**kwargs)


def test_setup_is_idempotent_and_describe_is_json(cache):
    dm = ImageDataModule(cache_dir=cache, source="digits", train_samples=50, augment="crop_flip")
    with pytest.raises(RuntimeError, match="setup"):
        dm.describe()
    dm.prepare_data()
    dm.setup("fit")
    train = dm.train_dataset
    dm.setup("test")
    assert dm.train_dataset is train
    info = json.loads(json.dumps(dm.describe()))
    assert (info["train_size"], info["val_size"], info["test_size"]) == (50, len(dm.val_dataset), len(dm.test_dataset))
    assert (info["source"], info["num_classes"], info["input_shape"], info["augment"]) == (
        "digits",
        10,
        [1, 8, 8],
        "crop_flip",
    )


def test_constructor_signature_works_with_jsonargparse():
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_class_arguments(ImageDataModule, "data")
    cfg = parser.parse_args(
        ["--data.source=fashion_mnist", "--data.mean=[0.5]", "--data.std=[0.25]", "--data.image_size=32"]
    )
    assert (cfg.data.source, cfg.data.mean, cfg.data.std, cfg.data.image_size) == ("fashion_mnist", [0.5], [0.25], 32)
    assert cfg.data.batch_size == 128 and cfg.data.augment == "none"
    assert "GLOBAL training batch size" in parser.format_help()


def test_one_process_sees_the_global_batches_of_many():
    """Step k of a one-process run holds exactly the samples the W ranks of a DDP run hold at
    step k (the union of their per-rank batches), for every epoch: same seed, same data."""
    from torch.utils.data import DistributedSampler

    data, world, global_batch = list(range(103)), 2, 8
    for epoch in range(3):
        single = SeededRandomSampler(data, seed=5)
        single.set_epoch(epoch)
        order = single.permutation()
        ranks = []
        for rank in range(world):
            dist = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=5)
            dist.set_epoch(epoch)
            ranks.append(list(dist))
        per_rank = global_batch // world
        for k in range(len(data) // global_batch):
            union = set().union(*(r[k * per_rank:(k + 1) * per_rank] for r in ranks))
            assert union == set(order[k * global_batch:(k + 1) * global_batch])


def test_batched_crop_flip_is_torchvisions_crop_and_flip_per_image():
    """CropFlip on a batch: every output image is some zero-padded crop of its input, flipped or
    not (exactly what v2.RandomCrop(padding) + v2.RandomHorizontalFlip can produce); the offsets
    cover all 2 pad + 1 positions per axis, both flips occur, images get their own draws; and a
    seeded draw repeats."""
    from datamodules.images import CropFlip

    torch.manual_seed(0)
    x = torch.randint(0, 256, (512, 2, 8, 6), dtype=torch.uint8)
    aug = CropFlip(8, 6, pad_h=1, pad_w=2)
    torch.manual_seed(1)
    out = aug(x)
    torch.manual_seed(1)
    assert torch.equal(out, aug(x))
    assert out.shape == x.shape and out.dtype == torch.uint8
    padded = torch.nn.functional.pad(x, (2, 2, 1, 1))
    seen = set()
    for i in range(len(x)):
        matches = [(dy, dx, f) for dy in range(3) for dx in range(5) for f in (False, True)
                   if torch.equal(out[i], (lambda c: c.flip(-1) if f else c)(padded[i, :, dy:dy + 8, dx:dx + 6]))]
        assert matches, i
        seen.add(matches[0])
    assert {d[0] for d in seen} == {0, 1, 2} and {d[1] for d in seen} == set(range(5)) and {d[2] for d in seen} == {False, True}
    assert aug(x[0]).shape == x[0].shape  # one image


def test_flip_augment_mirrors_without_shifting(cache):
    """augment='flip': every training image is its original or its mirror image (never shifted),
    both occur, and evaluation images stay as they are."""
    plain = make(cache, source="digits", batch_size=64)
    dm = make(cache, source="digits", augment="flip", batch_size=64)
    rows = list(range(64))
    torch.manual_seed(0)
    out = torch.stack([s[0] for s in dm.train_dataset.__getitems__(rows)])
    ref = torch.stack([s[0] for s in plain.train_dataset.__getitems__(rows)])
    same = (out == ref).flatten(1).all(1)
    mirrored = (out == ref.flip(-1)).flatten(1).all(1)
    assert (same | mirrored).all()
    assert (same & ~mirrored).any() and (mirrored & ~same).any()
    assert torch.equal(dm.val_dataset[0][0], plain.val_dataset[0][0])

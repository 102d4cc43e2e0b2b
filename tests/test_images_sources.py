"""The sources (``datamodules/images/sources.py``, ``readers.py``, ``cache.py``): Fashion-MNIST idx files and
their cache, image folders, the registry."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch

import datamodules.images.readers as readers
import datamodules.images.sources as sources
from datamodules.images import SOURCES, ImageDataModule, resolve_source
from tests.images_helpers import (  # noqa: F401
    DEBIAN_DIR,
    cache,
    chw_to_key,
    fashion_dir,
    isolated,
    make,
    write_fashion,
    write_folder,
    write_idx,
)


# ------------------------------------------------------------------------------------ Fashion-MNIST


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

    monkeypatch.setattr(readers, "read_idx", no_parsing)
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
    monkeypatch.setattr(sources, "FASHION_MNIST_DEBIAN_DIR", str(tmp_path / "no-debian"))
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



# ------------------------------------------------------------------------------------------- folder


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



# ---------------------------------------------------------------------------------------------------- registry


def test_the_registry_resolves_named_sources_and_hub_names():
    assert list(SOURCES) == ["digits", "fashion_mnist", "cifar10", "cifar100", "folder", "imagenet"]
    assert resolve_source("digits") is SOURCES["digits"]
    hub = resolve_source("someone/pictures")
    assert hub.read.args == ("someone/pictures", None, None)  # columns found from the features
    assert SOURCES["cifar100"].read.args == ("uoft-cs/cifar100", "img", "fine_label")
    with pytest.raises(ValueError) as error:
        resolve_source("mnist")
    assert str(error.value) == (
        "unknown source 'mnist': use one of digits, fashion_mnist, cifar10, cifar100, folder, imagenet, or a hub dataset "
        "name 'owner/name'"
    )


def test_source_settings_are_checked_at_construction(tmp_path):
    with pytest.raises(ValueError, match="source='folder' needs data_dir"):
        ImageDataModule(source="folder")
    with pytest.raises(FileNotFoundError, match="does-not-exist"):
        ImageDataModule(source="fashion_mnist", data_dir=str(tmp_path / "does-not-exist"))
    ImageDataModule(source=" digits ")  # surrounding blanks are dropped

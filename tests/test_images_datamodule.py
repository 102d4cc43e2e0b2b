"""``ImageDataModule`` through its public API: splits, loaders, settings (``datamodules/images/module.py``).

Offline, CPU, tiny data: the shared fixtures are in ``tests/images_helpers.py``.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from datamodules.images import AUGMENTS, IMAGE_MODES, SOURCES, ImageDataModule
from tests.images_helpers import DIGITS_N, cache, class_counts, isolated, make, rows, write_folder  # noqa: F401


# ------------------------------------------------------------------------------------------- splits


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
    for n in (10, 25, 100, 333):  # at least one image per class
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


def test_train_samples_errors(cache):
    dm = ImageDataModule(cache_dir=cache, source="digits", train_samples=5000)
    with pytest.raises(ValueError, match=r"train_samples=5000.*1294"):
        dm.setup()


@pytest.mark.parametrize(("n", "classes"), [(1, r"\[1\.\.9\]"), (5, r"\[5\.\.9\]"), (9, r"\[9\]")])
def test_train_samples_below_one_per_class_is_refused(cache, n, classes):
    """A balanced subset smaller than the class count would silently train without some classes."""
    dm = ImageDataModule(cache_dir=cache, source="digits", train_samples=n)
    with pytest.raises(ValueError, match=rf"train_samples={n} leaves classes {classes} with no training image; "
                                         r"use at least 10 \(one per class\)"):
        dm.setup()
    assert len(make(cache, source="digits", train_samples=10).train_dataset) == 10


def test_a_class_without_training_images_is_refused(cache, tmp_path):
    """A class that only the test split has, or whose images the hold-outs take: named, with the cause."""
    write_folder(tmp_path / "split" / "train", classes=("cat", "dog"), per_class=5)
    write_folder(tmp_path / "split" / "test", classes=("cat", "dog", "frog"), per_class=2)
    with pytest.raises(ValueError, match=r"classes \[2\] \('frog'\) \(of 3\): the source's train split has none"):
        make(cache, source="folder", data_dir=str(tmp_path / "split"))
    # one frog among 11 images: a 0.7 test share takes it (its 0.7 is the largest remainder of 3.5, 3.5, 0.7)
    write_folder(tmp_path / "few", classes=("cat", "dog"), per_class=5)
    write_folder(tmp_path / "few", classes=("frog",), per_class=1, seed=1)
    with pytest.raises(ValueError, match=r"classes \[2\] \('frog'\).*holding out test_fraction=0\.7 and val_"):
        make(cache, source="folder", data_dir=str(tmp_path / "few"), test_fraction=0.7)


def test_val_fraction_zero_gives_an_empty_val_loader(cache):
    dm = make(cache, source="digits", val_fraction=0.0)
    assert len(dm.val_dataset) == 0 and len(dm.val_dataloader()) == 0
    assert len(dm.train_dataset) + len(dm.test_dataset) == DIGITS_N



# ------------------------------------------------------------------------------------------ loaders


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



# ----------------------------------------------------------------------------------------- settings


def test_bad_config_values_fail_at_construction(cache):
    with pytest.raises(ValueError, match="unknown source 'mnist'") as error:
        ImageDataModule(source="mnist")
    assert all(s in str(error.value) for s in SOURCES) and "owner/name" in str(error.value)
    for kwargs, pattern in [
        ({"val_fraction": 1.0}, "val_fraction=1.0"),
        ({"val_fraction": -0.1}, "val_fraction=-0.1"),
        ({"test_fraction": 0.0}, "test_fraction=0.0"),
        ({"batch_size": 0}, "batch_size=0"),
        ({"train_samples": 0}, "train_samples=0"),
        ({"mean": [0.5]}, "mean=.*std="),
        ({"mean": [0.5], "std": [0.0]}, "std=.*positive"),
        ({"crop_padding": -1}, r"crop_padding=-1 must be an integer >= 0"),
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


def test_closed_choices_are_checked_when_the_config_is_parsed():
    """``augment`` and ``image_mode`` are Literal types: the CLI parser lists their choices in ``--help`` and
    rejects any other value before anything is built, as configs name the class (``class_path``)."""
    import lightning as L
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(exit_on_error=False)
    parser.add_subclass_arguments(L.LightningDataModule, "data")
    config = "data:\n  class_path: datamodules.images.ImageDataModule\n  init_args:\n    augment: {}\n"
    assert parser.parse_string(config.format("none")).data.init_args.augment == "none"
    for key, value, choices in [("augment", "mixup", AUGMENTS), ("image_mode", "CMYK", IMAGE_MODES)]:
        with pytest.raises(Exception, match=f"{key}(.|\\n)*{value}") as error:
            parser.parse_string(config.replace("augment: {}", f"{key}: {value}"))
        assert all(repr(c) in str(error.value) for c in choices)
    plain = ArgumentParser()
    plain.add_class_arguments(ImageDataModule, "data")
    assert "{none,flip,crop_flip,randaugment,autoaugment,random_resized_crop}" in plain.format_help()


def test_closed_choices_given_in_python_fail_at_use(cache):
    """Python callers bypass the parser: an unknown augment or image mode fails at setup, listing the choices."""
    with pytest.raises(ValueError, match="unknown augment 'mixup': use one of none, flip, crop_flip"):
        ImageDataModule(cache_dir=cache, source="digits", augment="mixup").setup()



def test_train_images_are_normalised_unaugmented_training_images_spread_over_the_split(cache):
    """``train_images(n)``: n images of the training split (evenly spaced rows), exactly as the
    evaluation would see them (normalised, never cropped or flipped); all of them when n is larger."""
    dm = make(cache, source="digits", augment="crop_flip", crop_padding=2)
    images = dm.train_images(10)
    assert images.shape == (10, *dm.input_shape) and images.dtype == torch.float32
    train = dm.train_dataset
    spots = torch.linspace(0, len(train) - 1, 10).round().long()
    plain = make(cache, source="digits")  # the same split without augmentation
    torch.testing.assert_close(images, torch.stack([plain.train_dataset[int(i)][0] for i in spots]))
    assert abs(float(images.mean())) < 0.5 and 0.5 < float(images.std()) < 2  # normalised
    assert len(dm.train_images(10**6)) == len(train)
    assert dm._train_unaugmented is not None and dm.train_dataset.transform is not None
    assert (dm.train_dataset.transform.crop_flip.pad_h, dm.train_dataset.transform.crop_flip.pad_w) == (2, 2)

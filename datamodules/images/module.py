"""``ImageDataModule``: the LightningDataModule over every image source, from settings to loaders.

``prepare_data`` reads the source (``sources``) and fills the caches (``cache``, ``pools``); ``setup`` builds
the pools, the splits (``splits``), the normalisation and the augmentation (``augment``) into the torch
datasets (``torch_datasets``); the loaders shuffle with ``SeededRandomSampler`` (``sampler``).
"""

from __future__ import annotations

from typing import Any

import lightning as L
from torch.utils.data import DataLoader, Dataset

from datamodules.images.augment import Augmentation, build_augment
from datamodules.images.cache import cache_root
from datamodules.images.decode import ImageMode
from datamodules.images.pools import Pools, load_pools
from datamodules.images.sampler import SeededRandomSampler, run_seed
from datamodules.images.sources import ReadOptions, SourceData, resolve_source
from datamodules.images.splits import split_rows


class ImageDataModule(L.LightningDataModule):
    """Image-classification data for every image source of the ViT ablations (see ``datamodules.images``).

    Args:
        source: ``digits`` (sklearn 8x8), ``fashion_mnist`` (local idx files, else the hub), ``cifar10``,
            ``cifar100``, ``folder`` (a local image folder, needs ``data_dir``), or any hub dataset
            ``owner/name``.
        data_dir: for ``folder``: the image folder (``<class>/<image>``, optionally under ``train/`` and
            ``test/``); for ``fashion_mnist``: the directory with the four idx ``.gz`` files (default:
            ``$DATA_DIR/fashion-mnist``, ``$DATA_DIR``, then ``/usr/share/datasets/fashion-mnist``).
        batch_size: the GLOBAL training batch size, split evenly across devices (must be divisible by the world
            size).
        eval_batch_size: the global validation/test batch size (default: ``batch_size``).
        num_workers: DataLoader worker processes per device.
        val_fraction: share of the training split held out for validation (stratified, seeded by
            ``split_seed``); 0 disables validation.
        test_fraction: share held out as the test set when the source has no test split (stratified, seeded
            by ``split_seed``).
        train_samples: train on a class-balanced subset of this many images of the train split (nested: for a
            fixed ``split_seed`` smaller subsets are contained in larger ones); at least one per class. None:
            the whole train split.
        augment: ``none``, ``flip`` (horizontal flip only: no shift, so short runs are not slowed; the
            time-to-accuracy recipe), ``crop_flip`` (random crop with padding size/8 + horizontal flip), ``randaugment``
            (crop_flip + RandAugment) or ``autoaugment`` (crop_flip + AutoAugment, CIFAR-10 policy).
        image_size: resize images to ``image_size`` x ``image_size``; None keeps the native size.
        split_seed: seed of the test hold-out, the train/val split and the subset order; independent of the
            training seed so every training seed sees the same split.
        mean: per-channel mean in [0, 1] units used to normalise; None computes it from the train split
            (after the val split; from a seeded sample of 1024 images for lazily decoded folders).
        std: per-channel std in [0, 1] units; None computes it like ``mean``.
        image_column: image column of a hub dataset (default: the first ``Image`` column).
        label_column: label column of a hub dataset (default: the first ``ClassLabel`` column).
        image_mode: ``L`` (1 channel) or ``RGB`` (3 channels) for decoded images; None: ``L`` if the sampled
            images are all grayscale, else ``RGB``.
        cache_dir: root of the datasets caches (default: ``$HF_DATASETS_CACHE``, else
            ``~/.cache/huggingface/datasets``); converted local files go to its ``attention-repro/`` folder.
        max_in_memory_bytes: datasets whose uint8 pixels (all splits) fit in this many bytes are held in
            memory; larger hub/folder datasets are decoded lazily per sample.
        pin_memory: pin loader memory (worth it when training on a GPU).
    """

    def __init__(
        self,
        source: str = "digits",
        data_dir: str | None = None,
        batch_size: int = 128,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        val_fraction: float = 0.1,
        test_fraction: float = 0.2,
        train_samples: int | None = None,
        augment: Augmentation = "none",
        image_size: int | None = None,
        split_seed: int = 0,
        mean: list[float] | None = None,
        std: list[float] | None = None,
        image_column: str | None = None,
        label_column: str | None = None,
        image_mode: ImageMode | None = None,
        cache_dir: str | None = None,
        max_in_memory_bytes: int = 2_000_000_000,
        pin_memory: bool = False,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        source = source.strip()
        resolve_source(source).check(data_dir)
        _check_numbers(val_fraction, test_fraction, batch_size, eval_batch_size, num_workers, train_samples,
                       image_size, mean, std)  # fmt: skip

        self.source = source
        self.data_dir = data_dir
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size if eval_batch_size is not None else batch_size
        self.num_workers = num_workers
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self.train_samples = train_samples
        self.augment = augment
        self.image_size = image_size
        self.split_seed = split_seed
        self.mean = list(mean) if mean is not None else None
        self.std = list(std) if std is not None else None
        self.image_column = image_column
        self.label_column = label_column
        self.image_mode = image_mode
        self.cache_dir = cache_dir
        self.max_in_memory_bytes = max_in_memory_bytes
        self.pin_memory = pin_memory

        self.world_size = 1
        self.per_device_batch_size = batch_size
        self.per_device_eval_batch_size = self.eval_batch_size
        self.num_classes: int | None = None
        self.input_shape: tuple[int, int, int] | None = None
        self.class_names: list[str] | None = None
        self.train_dataset: Dataset | None = None
        self.val_dataset: Dataset | None = None
        self.test_dataset: Dataset | None = None
        self.in_memory: bool | None = None
        self._origin = self._test_origin = None

    # ---------------------------------------------------------------------------------------------- Lightning

    def prepare_data(self) -> None:
        """Fill the caches (convert local files, download hub data, decode images); runs on rank 0 only."""
        self._pools(self._read(), keep=False)

    def setup(self, stage: str | None = None) -> None:
        """Load the data from the caches, build the splits and datasets (idempotent; runs on every rank)."""
        self._set_batch_sizes()
        if self.train_dataset is not None:
            return
        data = self._read()
        pools = self._pools(data, keep=True)
        self.class_names = list(data.class_names)
        self.num_classes = len(self.class_names)
        self._origin, self._test_origin = data.origin, data.test_origin

        rows = split_rows(
            pools.train.labels, None if pools.test is None else pools.test.labels,
            val_fraction=self.val_fraction, test_fraction=self.test_fraction, train_samples=self.train_samples,
            num_classes=self.num_classes, class_names=self.class_names, split_seed=self.split_seed,
        )  # fmt: skip
        channels, height, width = self.input_shape
        if self.mean is None:
            self.mean, self.std = pools.stats(pools.train, rows.train, self.split_seed)
        if len(self.mean) != channels:
            raise ValueError(
                f"mean={self.mean} and std={self.std} have {len(self.mean)} values but the images have "
                f"{channels} channel(s)"
            )
        augment = build_augment(self.augment, height, width)
        test_pool = pools.train if rows.test_from_train else pools.test
        self.train_dataset = pools.dataset(pools.train, rows.subset, self.mean, self.std, augment)
        self.val_dataset = pools.dataset(pools.train, rows.val, self.mean, self.std)
        self.test_dataset = pools.dataset(test_pool, rows.test, self.mean, self.std)

    def train_dataloader(self) -> DataLoader:
        dataset = self._require("train_dataset")
        sampler = SeededRandomSampler(dataset, seed=run_seed())
        return DataLoader(
            dataset,
            batch_size=self.per_device_batch_size,
            sampler=sampler,
            drop_last=len(dataset) >= 2 * self.batch_size,
            **self._loader_kwargs(),
        )

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader(self._require("val_dataset"))

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader(self._require("test_dataset"))

    def describe(self) -> dict[str, Any]:
        """What a results file should record about the data (after ``setup``)."""
        self._require("train_dataset")
        return {
            "source": self.source,
            "origin": self._origin,
            "test_split": self._test_origin,
            "train_size": len(self.train_dataset),
            "val_size": len(self.val_dataset),
            "test_size": len(self.test_dataset),
            "num_classes": self.num_classes,
            "class_names": list(self.class_names),
            "input_shape": list(self.input_shape),
            "augment": self.augment,
            "image_size": self.image_size,
            "train_samples": self.train_samples,
            "val_fraction": self.val_fraction,
            "split_seed": self.split_seed,
            "batch_size": self.batch_size,
            "per_device_batch_size": self.per_device_batch_size,
            "mean": list(self.mean),
            "std": list(self.std),
            "in_memory": self.in_memory,
        }

    # ---------------------------------------------------------------------------------------------- loading

    def _read(self) -> SourceData:
        """The source as Hugging Face datasets (train, optional test), from the caches."""
        options = ReadOptions(self.data_dir, cache_root(self.cache_dir), self.image_column, self.label_column)
        return resolve_source(self.source).read(options)

    def _pools(self, data: SourceData, keep: bool) -> Pools:
        pools = load_pools(data, image_size=self.image_size, image_mode=self.image_mode,
                           max_in_memory_bytes=self.max_in_memory_bytes, keep=keep)  # fmt: skip
        self.in_memory = pools.in_memory
        if pools.input_shape is not None:
            self.input_shape = pools.input_shape
        return pools

    # ---------------------------------------------------------------------------------------------- loaders

    def _set_batch_sizes(self) -> None:
        trainer = getattr(self, "trainer", None)
        self.world_size = int(trainer.world_size) if trainer is not None else 1
        for name in ("batch_size", "eval_batch_size"):
            value = getattr(self, name)
            if value % self.world_size:
                raise ValueError(
                    f"{name}={value} is not divisible by the world size {self.world_size} (devices x nodes): "
                    f"the global batch is split evenly across devices; use a multiple of {self.world_size}"
                )
        self.per_device_batch_size = self.batch_size // self.world_size
        self.per_device_eval_batch_size = self.eval_batch_size // self.world_size

    def _loader_kwargs(self) -> dict[str, Any]:
        return {
            "num_workers": self.num_workers,
            "pin_memory": self.pin_memory,
            "persistent_workers": self.num_workers > 0,
        }

    def _eval_loader(self, dataset: Dataset) -> DataLoader:
        return DataLoader(
            dataset, batch_size=self.per_device_eval_batch_size, shuffle=False, drop_last=False, **self._loader_kwargs()
        )

    def _require(self, attribute: str) -> Any:
        value = getattr(self, attribute)
        if value is None:
            raise RuntimeError(f"{type(self).__name__}.{attribute} is not built yet: call prepare_data() and setup()")
        return value


def _check_numbers(
    val_fraction: float,
    test_fraction: float,
    batch_size: int,
    eval_batch_size: int | None,
    num_workers: int,
    train_samples: int | None,
    image_size: int | None,
    mean: list[float] | None,
    std: list[float] | None,
) -> None:
    """The range checks a type cannot express (the closed choices are ``Literal`` types)."""
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction={val_fraction} must be in [0, 1), e.g. 0.1")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction={test_fraction} must be in (0, 1), e.g. 0.2")
    for name, value in (("batch_size", batch_size), ("eval_batch_size", eval_batch_size)):
        if value is not None and value < 1:
            raise ValueError(f"{name}={value} must be a positive integer")
    if num_workers < 0:
        raise ValueError(f"num_workers={num_workers} must be >= 0")
    if train_samples is not None and train_samples < 1:
        raise ValueError(f"train_samples={train_samples} must be a positive integer, or None for all")
    if image_size is not None and image_size < 1:
        raise ValueError(f"image_size={image_size} must be a positive integer, or None for the native size")
    if (mean is None) != (std is None) or (mean is not None and len(mean) != len(std)):
        raise ValueError(f"mean={mean} and std={std} must both be given with one value per channel, or both None")
    if std is not None and any(s <= 0 for s in std):
        raise ValueError(f"std={std} must be positive")

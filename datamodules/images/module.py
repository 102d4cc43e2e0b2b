"""``ImageDataModule``: the LightningDataModule over every image source, from settings to loaders.

``prepare_data`` reads the source (``sources``), preparing it once if needed (``prepared``: folders and hub
datasets as memory-mapped Arrow files of encoded images; ``cache``: digits and Fashion-MNIST as uint8 arrays),
and decodes what is held in memory (``pools``); ``setup`` opens them (warm: seconds, whatever the number of
images), builds the splits (``splits``), the normalisation, the augmentation (``augment``, ``transforms``) and
the torch datasets (``torch_datasets``); the training loader shuffles with ``datamodules.sampler`` (resumable
mid-epoch). With ``on_device`` the splits are copied to the training device and the loaders build each batch
there (``device_loader``).
"""

from __future__ import annotations

from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader, Dataset

from datamodules.images.augment import Augmentation, build_augment
from datamodules.images.cache import cache_root
from datamodules.images.decode import Decoder, ImageMode
from datamodules.images.device_loader import DeviceLoader, ResumableDeviceLoader
from datamodules.images.pools import InMemory, Pools, load_pools
from datamodules.images.prepared import open_prepared
from datamodules.images.sources import ReadOptions, SourceData, from_prepared, resolve_source
from datamodules.images.splits import split_rows
from datamodules.images.workspace import human_bytes
from datamodules.images.transforms import (
    BatchMix,
    EvalResize,
    PolicyOnTensor,
    random_erasing,
    timm_policy,
)
from datamodules.sampler import ResumableLoader, ResumableSampler, run_seed
from utils.stop import pause_at

Interpolation = Literal["bilinear", "bicubic"]
ON_DEVICE_AUGMENTS = ("none", "flip", "crop_flip")
"""The augmentations ``on_device=true`` builds on the device (batched crop + flip)."""


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
            (crop_flip + RandAugment) or ``autoaugment`` (crop_flip + AutoAugment, CIFAR-10 policy), or
            ``random_resized_crop`` (the ImageNet recipe: timm's RandomResizedCrop of 8-100% of the area to
            ``image_size`` + horizontal flip, from each image at its native size).
        crop_padding: the random crop's zero padding in pixels (each side), for ``crop_flip``,
            ``randaugment`` and ``autoaugment``; None: size/8 (4 px at 32). The fast CIFAR-10 CNNs
            shift by 2 px in short runs: less to learn per epoch.
        image_size: resize images to ``image_size`` x ``image_size`` (with ``random_resized_crop`` /
            ``eval_crop_fraction``: the size of the crops); None keeps the native size.
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
        max_in_memory_bytes: with ``in_memory=auto``, datasets whose uint8 pixels (all splits) fit in this many
            bytes are held in memory; larger hub/folder datasets are decoded per sample in the loader workers.
        pin_memory: pin loader memory; None: when training on a CUDA device.
        in_memory: ``auto`` (hold decoded uint8 images in memory where they fit: digits, Fashion-MNIST,
            CIFAR-sized data; decode per sample otherwise; the choice and its reason are printed in one line),
            ``true`` or ``false``.
        decoder: ``torchvision`` (libjpeg-turbo/libpng straight into a tensor; Pillow for other formats; the
            faster, measured by ``bench data``) or ``pil``.
        skip_bad_images: when preparing, leave out files that cannot be decoded (counted and printed; listed in
            the manifest) instead of stopping with an error naming the first.
        prepared: a prepared directory (``repro data prepare`` prints it) to open instead of
            reading the source: e.g. a copy on a node's local disk; ``data_dir`` is then not needed.
        prepare_workers: processes that prepare and decode (None: every core this process may use).
        auto_augment: a timm augmentation policy applied after the crop and flip, e.g. DeiT's
            ``rand-m9-mstd0.5-inc1`` (RandAugment); None: none.
        random_erasing: probability of timm's random erasing (per-pixel noise in one box) of a training image
            after normalisation (DeiT: 0.25); 0 disables it.
        mixup_alpha: timm Mixup's alpha (DeiT: 0.8); with ``cutmix_alpha``, batches are mixed and the training
            targets become class probabilities (B, num_classes). 0 and 0 disable mixing.
        cutmix_alpha: timm CutMix's alpha (DeiT: 1.0).
        mix_prob: probability that a batch is mixed (DeiT: 1.0).
        mix_switch_prob: probability of CutMix rather than Mixup when both are on (DeiT: 0.5).
        eval_crop_fraction: evaluation geometry: resize the shorter side to ``image_size / eval_crop_fraction``,
            then take the centre ``image_size`` crop (ImageNet: 0.875, 224 from 256); None: resize to
            ``image_size`` x ``image_size``.
        interpolation: ``bilinear`` or ``bicubic`` (DeiT), for the crops and resizes of encoded images.
        on_device: hold the decoded uint8 images on the device the run trains on (a GPU) and build every batch
            there: index, random crop + flip, normalisation, Mixup / CutMix, batched
            (``datamodules.images.device_loader``); the same samples, order, augmentation draws and mid-epoch
            resume as the ordinary loader, without loader workers (``num_workers`` is not used). Needs the images
            in memory at the input size and ``augment`` ``none``, ``flip`` or ``crop_flip`` without
            ``auto_augment`` or random erasing (per image on the CPU).
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
        pin_memory: bool | None = None,
        in_memory: InMemory = "auto",
        decoder: Decoder = "torchvision",
        skip_bad_images: bool = False,
        prepared: str | None = None,
        prepare_workers: int | None = None,
        auto_augment: str | None = None,
        random_erasing: float = 0.0,
        mixup_alpha: float = 0.0,
        cutmix_alpha: float = 0.0,
        mix_prob: float = 1.0,
        mix_switch_prob: float = 0.5,
        eval_crop_fraction: float | None = None,
        interpolation: Interpolation = "bilinear",
        crop_padding: int | None = None,
        on_device: bool = False,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        source = source.strip()
        self.cache_dir = cache_dir
        self.data_dir = data_dir
        self.image_column = image_column
        self.label_column = label_column
        self.skip_bad_images = skip_bad_images
        self.prepare_workers = prepare_workers
        self.prepared = prepared
        if prepared is None:
            resolve_source(source).check(self._options())
        elif not (open_prepared(prepared).path / "manifest.json").is_file():  # pragma: no cover (open raises)
            raise FileNotFoundError(prepared)
        _check_numbers(val_fraction, test_fraction, batch_size, eval_batch_size, num_workers, train_samples,
                       image_size, mean, std)  # fmt: skip
        _check_recipe(augment, image_size, random_erasing, mixup_alpha, cutmix_alpha, mix_prob, mix_switch_prob,
                      eval_crop_fraction, in_memory)  # fmt: skip
        if on_device:
            _check_on_device(augment, in_memory, auto_augment, random_erasing, eval_crop_fraction)
        self.on_device = bool(on_device)
        self.device: torch.device | None = None  # where the batches are built (after setup with on_device)

        self.source = source
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
        self.image_mode = image_mode
        self.max_in_memory_bytes = max_in_memory_bytes
        self.pin_memory = pin_memory
        self.in_memory_setting = in_memory
        self.decoder = decoder
        self.auto_augment = auto_augment
        self.random_erasing = random_erasing
        self.mixup_alpha, self.cutmix_alpha = mixup_alpha, cutmix_alpha
        self.mix_prob, self.mix_switch_prob = mix_prob, mix_switch_prob
        self.eval_crop_fraction = eval_crop_fraction
        self.interpolation = interpolation
        if crop_padding is not None and (not isinstance(crop_padding, int) or crop_padding < 0):
            raise ValueError(f"crop_padding={crop_padding!r} must be an integer >= 0 (pixels), or None for size/8")
        self.crop_padding = crop_padding

        self.world_size = 1
        self.per_device_batch_size = batch_size
        self.per_device_eval_batch_size = self.eval_batch_size
        self.num_classes: int | None = None
        self.input_shape: tuple[int, int, int] | None = None
        self.class_names: list[str] | None = None
        self.train_dataset: Dataset | None = None
        self._train_unaugmented: Dataset | None = None
        self.val_dataset: Dataset | None = None
        self.test_dataset: Dataset | None = None
        self.in_memory: bool | None = None
        self.prepared_path: str | None = None
        self._origin = self._test_origin = None
        self._data: SourceData | None = None
        self._reason_shown = False

    # ---------------------------------------------------------------------------------------------- Lightning

    def prepare_data(self) -> None:
        """Prepare the data once (convert local files, download and verify hub data, prepare folders, decode what
        is held in memory); runs on local rank 0 only."""
        pause_at("data")  # the test hook (utils/stop.py): a signal while the data is prepared
        self._pools(self._read(), keep=False)

    def setup(self, stage: str | None = None) -> None:
        """Open the prepared data, build the splits and datasets (idempotent; runs on every rank)."""
        self._set_batch_sizes()
        if self.train_dataset is not None:
            return
        data = self._read()
        pools = self._pools(data, keep=True)
        if not self._reason_shown:
            rank_zero_info(f"[data] {self.source}: {pools.reason}" + self._workers_note(pools))
            self._reason_shown = True
        self.class_names = list(data.class_names)
        self.num_classes = len(self.class_names)
        self._origin, self._test_origin = data.origin, data.test_origin

        rows = split_rows(
            pools.train.labels, None if pools.test is None else pools.test.labels,
            val_fraction=self.val_fraction, test_fraction=self.test_fraction, train_samples=self.train_samples,
            num_classes=self.num_classes, class_names=self.class_names, split_seed=self.split_seed,
        )  # fmt: skip
        channels, height, width = self.input_shape
        train_transform, eval_transform = self._transforms(pools)
        if self.mean is None:
            self.mean, self.std = pools.stats(pools.train, rows.train, self.split_seed, eval_transform)
        if len(self.mean) != channels:
            raise ValueError(
                f"mean={self.mean} and std={self.std} have {len(self.mean)} values but the images have "
                f"{channels} channel(s)"
            )
        if self.auto_augment and train_transform is not None:
            policy = PolicyOnTensor(timm_policy(self.auto_augment, height, tuple(self.mean) * (3 // channels),
                                                self.interpolation))  # fmt: skip
            train_transform = _then(train_transform, policy)
        erase = random_erasing(self.random_erasing)
        mix = None
        if self.mixup_alpha > 0 or self.cutmix_alpha > 0:
            mix = BatchMix(self.num_classes, self.mixup_alpha, self.cutmix_alpha, self.mix_prob, self.mix_switch_prob)
        test_pool = pools.train if rows.test_from_train else pools.test
        self.train_dataset = pools.dataset(pools.train, rows.subset, self.mean, self.std, train_transform, erase, mix)
        self._train_unaugmented = pools.dataset(pools.train, rows.subset, self.mean, self.std, eval_transform)
        self.val_dataset = pools.dataset(pools.train, rows.val, self.mean, self.std, eval_transform)
        self.test_dataset = pools.dataset(test_pool, rows.test, self.mean, self.std, eval_transform)
        if self.on_device:
            self._to_device(pools, train_transform, eval_transform)

    def _to_device(self, pools: Pools, train_transform, eval_transform) -> None:
        """Copy the training, validation and test splits' pixels to the training device (``on_device``)."""
        if not pools.in_memory:
            raise ValueError(
                f"on_device=true needs the images held in memory, but {self.source} is {pools.reason}; set "
                "in_memory true (or raise max_in_memory_bytes), or on_device false"
            )
        if eval_transform is not None or (train_transform is not None and not hasattr(train_transform, "batch")):
            raise RuntimeError(  # the recipe checks in __init__ leave no such case: a guard, not a user error
                f"on_device=true builds batches from images stored at the input size {self.input_shape}, but they are "
                f"stored at {pools.stored_shape}; prepare them at that size (image_size) or set on_device false"
            )
        trainer = getattr(self, "trainer", None)
        root = getattr(getattr(trainer, "strategy", None), "root_device", None)
        self.device = root if root is not None else torch.device("cpu")
        moved: dict[int, torch.Tensor] = {}
        self.train_dataset = self.train_dataset.to(self.device, moved)
        self.val_dataset = self.val_dataset.to(self.device, moved)
        self.test_dataset = self.test_dataset.to(self.device, moved)
        held = sum(t.numel() * t.element_size() for t in moved.values())
        rank_zero_info(f"[data] on the device: {self.device}, {human_bytes(held)}; batches indexed, augmented and "
                       "normalised there (on_device=true)")  # fmt: skip

    def _transforms(self, pools: Pools):
        """(training transform, evaluation transform) of uint8 images as the pools store them."""
        _, height, width = self.input_shape
        augment = build_augment(self.augment, height, width, self.interpolation, padding=self.crop_padding)
        at_input = pools.stored_shape == self.input_shape and self.eval_crop_fraction is None
        if at_input and self.augment != "random_resized_crop":
            # held in memory at the input size: evaluation needs nothing, training the augment (batched)
            return augment, None
        eval_transform = None if at_input else EvalResize(self.image_size, self.eval_crop_fraction, self.interpolation)
        if self.augment == "random_resized_crop":  # crops each image at its native size
            return augment, eval_transform
        return (_then(eval_transform, augment) if augment is not None else eval_transform), eval_transform

    def _native(self) -> bool:
        """Whether the recipe crops each image at its native size."""
        return self.augment == "random_resized_crop" or self.eval_crop_fraction is not None

    def _workers_note(self, pools: Pools) -> str:
        if pools.in_memory or self.num_workers > 0:
            return f"; {self.num_workers} loader workers per device" if not pools.in_memory else ""
        return "; num_workers=0: decoding runs in the training process, set data.num_workers to use more cores"

    def train_dataloader(self) -> DataLoader:
        dataset = self._require("train_dataset")
        trainer = getattr(self, "trainer", None)
        rank = int(getattr(trainer, "global_rank", 0) or 0)
        sampler = ResumableSampler(dataset, seed=run_seed(), num_replicas=self.world_size, rank=rank)
        if self.on_device:
            return ResumableDeviceLoader(dataset, batch_size=self.per_device_batch_size, sampler=sampler,
                                         drop_last=len(dataset) >= 2 * self.batch_size, num_workers=0)  # fmt: skip
        return ResumableLoader(
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

    def train_images(self, n: int) -> torch.Tensor:
        """``n`` training images (all, if fewer), normalised as the batches, without augmentation,
        spread evenly over the training split: (n, C, H, W) float32. For layers a net fits to the
        data before training (``models.hybrid.PatchWhitening``)."""
        data = self._require("_train_unaugmented")
        rows = torch.linspace(0, len(data) - 1, min(n, len(data))).round().long().unique()
        return torch.stack([data[int(i)][0] for i in rows])

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
            "prepared": self.prepared_path,
            "decoder": self.decoder,
            "auto_augment": self.auto_augment,
            "random_erasing": self.random_erasing,
            "mixup_alpha": self.mixup_alpha,
            "cutmix_alpha": self.cutmix_alpha,
            "eval_crop_fraction": self.eval_crop_fraction,
            "on_device": self.on_device,
        }

    # ---------------------------------------------------------------------------------------------- loading

    def _options(self, refresh: bool = False) -> ReadOptions:
        return ReadOptions(self.data_dir, cache_root(self.cache_dir), self.image_column, self.label_column,
                           self.skip_bad_images, self.prepare_workers, refresh)  # fmt: skip

    def _read(self, refresh: bool = False) -> SourceData:
        """The source as Hugging Face datasets (train, optional test), prepared once, then opened memory-mapped
        (the first read of this object is kept for the second: prepare_data and setup read once)."""
        if self._data is not None and not refresh:
            return self._data
        if self.prepared is not None:
            data = from_prepared(open_prepared(self.prepared), None, None, self._options())
        else:
            data = resolve_source(self.source).read(self._options(refresh))
        if data.prepared is not None:
            self.prepared_path = str(data.prepared.path)
        self._data = data
        return data

    def prepare(self, refresh: bool = True) -> SourceData:
        """Prepare the source now (``refresh``: fingerprint a folder's every file, not only its directories) and
        decode what ``in_memory`` holds in memory; for ``repro data prepare``."""
        data = self._read(refresh=refresh)
        pools = self._pools(data, keep=False)
        print(f"[data] {self.source}: {pools.reason}", flush=True)
        return data

    def _pools(self, data: SourceData, keep: bool) -> Pools:
        pools = load_pools(data, image_size=self.image_size, image_mode=self.image_mode,
                           max_in_memory_bytes=self.max_in_memory_bytes, in_memory=self.in_memory_setting,
                           native_needed=self._native(), decoder=self.decoder, workers=self.prepare_workers,
                           keep=keep)  # fmt: skip
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
        pin = self.pin_memory
        if pin is None:  # pinned host memory when training on a CUDA device
            trainer = getattr(self, "trainer", None)
            root = getattr(getattr(trainer, "strategy", None), "root_device", None)
            pin = root is not None and root.type == "cuda" and torch.cuda.is_available()
        return {
            "num_workers": self.num_workers,
            "pin_memory": pin,
            "persistent_workers": self.num_workers > 0,
        }

    def _eval_loader(self, dataset: Dataset) -> DataLoader:
        if self.on_device:
            return DeviceLoader(dataset, batch_size=self.per_device_eval_batch_size, shuffle=False, drop_last=False,
                                num_workers=0)  # fmt: skip
        return DataLoader(
            dataset, batch_size=self.per_device_eval_batch_size, shuffle=False, drop_last=False, **self._loader_kwargs()
        )

    def _require(self, attribute: str) -> Any:
        value = getattr(self, attribute)
        if value is None:
            raise RuntimeError(f"{type(self).__name__}.{attribute} is not built yet: call prepare_data() and setup()")
        return value


def _then(first, second):
    """``second(first(x))``; keeps ``first``'s name in ``repr``."""
    return _Then(first, second)


class _Then:
    def __init__(self, first, second) -> None:
        self.first, self.second = first, second

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x))

    def __repr__(self) -> str:
        return f"{self.first!r} -> {self.second!r}"


def _check_recipe(augment: str, image_size: int | None, random_erasing: float, mixup_alpha: float,
                  cutmix_alpha: float, mix_prob: float, mix_switch_prob: float, eval_crop_fraction: float | None,
                  in_memory: Any) -> None:  # fmt: skip
    """The range checks of the ImageNet-recipe settings."""
    if eval_crop_fraction is not None and (image_size is None or not 0.0 < eval_crop_fraction <= 1.0):
        raise ValueError(f"eval_crop_fraction={eval_crop_fraction} must be in (0, 1] (e.g. 0.875) and needs image_size")
    if not 0.0 <= random_erasing <= 1.0:
        raise ValueError(f"random_erasing={random_erasing} must be a probability in [0, 1], e.g. 0.25")
    if mixup_alpha < 0 or cutmix_alpha < 0:
        raise ValueError(f"mixup_alpha={mixup_alpha} and cutmix_alpha={cutmix_alpha} must be >= 0 (0 disables)")
    for name, value in (("mix_prob", mix_prob), ("mix_switch_prob", mix_switch_prob)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name}={value} must be a probability in [0, 1]")
    if in_memory not in ("auto", True, False):
        raise ValueError(f"in_memory={in_memory!r} must be auto, true or false")


def _check_on_device(augment: str, in_memory: Any, auto_augment: str | None, random_erasing: float,
                     eval_crop_fraction: float | None) -> None:  # fmt: skip
    """What ``on_device=true`` builds on the device: in-memory images, crop + flip, normalisation, and
    Mixup / CutMix per batch (timm's, with the same draws as on the CPU)."""
    if augment not in ON_DEVICE_AUGMENTS:
        raise ValueError(f"on_device=true does augment={augment!r} only on the CPU; use augment "
                         f"{', '.join(ON_DEVICE_AUGMENTS)}, or on_device false")  # fmt: skip
    unsupported = {"in_memory=false": in_memory in (False, "false"), f"auto_augment={auto_augment!r}": bool(auto_augment),
                   f"random_erasing={random_erasing}": random_erasing > 0,
                   f"eval_crop_fraction={eval_crop_fraction}": eval_crop_fraction is not None}  # fmt: skip
    bad = [name for name, on in unsupported.items() if on]
    if bad:
        raise ValueError(f"on_device=true cannot be combined with {', '.join(bad)} (done per image on the CPU); "
                         "drop them or set on_device false")  # fmt: skip


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

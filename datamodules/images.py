"""Image-classification data for the ViT ablations: one LightningDataModule for every source.

Sources (``source=``):

- ``digits``: scikit-learn's 8x8 digits (1 channel, 10 classes, 1797 images, no network). No official
  test split, so a seeded, stratified ``test_fraction`` is held out.
- ``fashion_mnist``: the idx ``.gz`` files from a local directory (``data_dir``, else ``$DATA_DIR/fashion-mnist``
  or ``$DATA_DIR``, else the Debian package's ``/usr/share/datasets/fashion-mnist``), falling back to the hub
  dataset ``zalando-datasets/fashion_mnist``. Official 60k/10k split.
- ``cifar10`` / ``cifar100``: the hub datasets ``uoft-cs/cifar10`` / ``uoft-cs/cifar100`` (fine labels).
- any ``owner/name``: a hub dataset (image column = first ``Image`` column, label column = first ``ClassLabel``
  column, unless ``image_column`` / ``label_column`` say otherwise).
- ``folder``: a local image folder (``data_dir/<class>/<image>``, optionally with ``train/`` and ``test/`` (or
  ``val/``) levels above the class folders), read with ``datasets.load_dataset("imagefolder")``.

Data path. Everything is read through Hugging Face ``datasets`` (cached, memory-mapped). Raw files we parse
ourselves (idx, sklearn digits) are converted once into a ``datasets.DatasetDict`` saved under
``<cache root>/attention-repro/<source>-<key>``, where the key hashes the source files' names, sizes and mtimes;
the save goes to a temporary directory that is renamed into place, so an interrupted run never leaves a
half-written cache. Hub and folder images are decoded to uint8 arrays with a cached ``Dataset.map``.
Datasets that fit in ``max_in_memory_bytes`` are then held as one uint8 tensor (N, C, H, W) and served in whole
batches (``__getitems__``): without augmentation a batch is one tensor index, with augmentation the
random crop + flip runs on the whole uint8 batch at once (``CropFlip``), a torchvision ``transforms.v2`` policy (RandAugment, AutoAugment) per sample; conversion to float and normalisation are batched.
Larger folders are decoded lazily, per sample, with the same transforms.

Splits depend only on ``split_seed`` (never on the training seed): the test hold-out (when the source has no
test split), the stratified train/val split and the order in which ``train_samples`` picks a class-balanced,
nested subset. Shuffling of the training set depends only on (Lightning global seed, epoch), see
:class:`SeededRandomSampler`, so a run resumed at an epoch boundary sees the same order as an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import logging
import math
import os
import shutil
import socket
import struct
import tempfile
import threading
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import datasets
import huggingface_hub.constants
import lightning as L
import numpy as np
import pyarrow as pa
import torch
from datasets.features.features import Array3DExtensionType, numpy_to_pyarrow_listarray
from datasets.table import InMemoryTable
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, RandomSampler
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

log = logging.getLogger(__name__)

SOURCES = ("digits", "fashion_mnist", "cifar10", "cifar100", "folder")
"""Named sources; any other value containing a ``/`` is a hub dataset name."""
AUGMENTS = ("none", "flip", "crop_flip", "randaugment", "autoaugment")
IMAGE_MODES = ("L", "RGB")

# Hub names and their (image, label) columns for the named hub sources; any other hub name is given in full.
HUB_SOURCES = {
    "cifar10": ("uoft-cs/cifar10", "img", "label"),
    "cifar100": ("uoft-cs/cifar100", "img", "fine_label"),
}
FASHION_MNIST_HUB = ("zalando-datasets/fashion_mnist", "image", "label")
FASHION_MNIST_DEBIAN_DIR = "/usr/share/datasets/fashion-mnist"  # Debian/Ubuntu package `dataset-fashion-mnist`
FASHION_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
FASHION_MNIST_CLASSES = [
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
]  # fmt: skip
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pbm")
_GRAYSCALE_MODES = {"1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "I;16N", "F"}

# Bump when the layout of what we save changes, so stale caches are not read.
_CACHE_FORMAT = "attention-repro-images-v1"
_CACHE_SUBDIR = "attention-repro"
_HUB_PROBE_TIMEOUT_S = 3.0
# Independent random streams derived from split_seed, one per purpose.
_STREAM_TEST, _STREAM_VAL, _STREAM_SUBSET, _STREAM_STATS = 1, 2, 3, 4


# --------------------------------------------------------------------------------------------------------------
# Shuffling
# --------------------------------------------------------------------------------------------------------------


class SeededRandomSampler(RandomSampler):
    """A ``RandomSampler`` whose permutation depends only on ``(seed, epoch)``.

    Lightning calls ``set_epoch(current_epoch)`` on the train sampler at the start of every epoch, so a run
    resumed from a checkpoint at an epoch boundary draws exactly the order an uninterrupted run draws. It
    subclasses ``RandomSampler`` so that Lightning recognises the loader as shuffled (and swaps in its own
    seeded ``DistributedSampler`` under DDP).

    Args:
        data_source: the dataset to sample from (only its length is used).
        seed: the base seed (the Lightning global seed, ``PL_GLOBAL_SEED``).
    """

    def __init__(self, data_source: Sequence[Any], seed: int = 0) -> None:
        super().__init__(data_source)
        self.seed = int(seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def permutation(self) -> list[int]:
        """The order of this epoch: a function of (seed, epoch) and the dataset length only.

        It is the permutation ``torch.utils.data.DistributedSampler`` draws for the same seed and
        epoch (Lightning seeds that one with ``PL_GLOBAL_SEED`` too). Under DDP rank r takes
        positions r, r + W, r + 2W, ... of it, so the W per-rank batches of step k together hold
        exactly the samples of step k of a one-process run with the same global batch: one and
        many processes train on the same global batches.
        """
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(len(self.data_source), generator=generator).tolist()

    def __iter__(self) -> Iterator[int]:
        yield from self.permutation()


# --------------------------------------------------------------------------------------------------------------
# Torch datasets served to the loaders
# --------------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """Serve samples on one intra-op thread (restoring the setting afterwards).

    Their ops take microseconds, so a second thread only adds synchronisation, and when another process
    competes for the cores that synchronisation can cost milliseconds per op (measured on 2 busy cores: a 3x3
    conv on a 28x28 image, 35 us on one thread, 6 ms on two). DataLoader workers use one thread already.
    """
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _run_seed() -> int:
    """The Lightning global seed of this run (``seed_everything`` sets ``PL_GLOBAL_SEED``; 0 if unset)."""
    return int(os.environ.get("PL_GLOBAL_SEED", 0))


def _normaliser(mean: Sequence[float], std: Sequence[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, shift) such that ``uint8 * scale - shift == (uint8 / 255 - mean) / std``, shaped (C, 1, 1)."""
    m = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)
    return 1.0 / (255.0 * s), m / s


class InMemoryImages(Dataset):
    """A split of an in-memory uint8 image tensor: ``images[indices]`` with per-sample augmentation.

    ``images`` (N, C, H, W) uint8 and ``labels`` (N,) int64 are shared between the splits drawn from the same
    pool; ``indices`` picks this split's rows. Items are ``(float image (C, H, W), int64 label)``;
    ``__getitems__`` builds a whole batch at once (one index op without augmentation).
    """

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        indices: np.ndarray | torch.Tensor,
        mean: Sequence[float],
        std: Sequence[float],
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        self.images = images
        self.labels = labels
        self.indices = torch.as_tensor(np.asarray(indices), dtype=torch.long)
        self.transform = transform
        self.scale, self.shift = _normaliser(mean, std)

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def targets(self) -> torch.Tensor:
        return self.labels[self.indices]

    def _normalise(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.float32).mul_(self.scale).sub_(self.shift)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        with _one_thread():
            j = self.indices[i]
            x = self.images[j]
            if self.transform is not None:
                x = self.transform(x)
            return self._normalise(x), self.labels[j]

    def __getitems__(self, batch: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        with _one_thread():
            rows = self.indices[torch.as_tensor(batch, dtype=torch.long)]
            if self.transform is None:
                x = self.images[rows]
            else:
                # The batch's random augmentation is a function of (run seed, the batch's rows),
                # not of whatever drew from the global generator before: a run resumed from a
                # checkpoint augments its batches exactly as the uninterrupted run, in the main
                # process or in any worker.
                keys = tuple(rows.tolist())
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(hash((_run_seed(), keys)) & 0x7FFF_FFFF_FFFF_FFFF)
                    if hasattr(self.transform, "batch"):
                        x = self.transform.batch(self.images[rows])
                    else:
                        x = torch.stack([self.transform(self.images[j]) for j in keys])
            x = self._normalise(x)
            return list(zip(x.unbind(0), self.labels[rows].unbind(0), strict=True))


class LazyImages(Dataset):
    """A split of a Hugging Face image dataset decoded per sample (for folders too large for memory)."""

    def __init__(
        self,
        hf_dataset: datasets.Dataset,
        image_column: str,
        labels: np.ndarray,
        indices: np.ndarray,
        mode: str,
        image_size: int | None,
        input_shape: tuple[int, int, int],
        mean: Sequence[float],
        std: Sequence[float],
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        self.hf_dataset = hf_dataset.select_columns([image_column])
        self.image_column = image_column
        self.labels = torch.as_tensor(np.asarray(labels), dtype=torch.long)
        self.indices = np.asarray(indices, dtype=np.int64)
        self.mode, self.image_size, self.input_shape = mode, image_size, tuple(input_shape)
        self.transform = transform
        self.scale, self.shift = _normaliser(mean, std)

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def targets(self) -> torch.Tensor:
        return self.labels[torch.as_tensor(self.indices)]

    def decode(self, i: int) -> torch.Tensor:
        """The uint8 (C, H, W) image of item ``i``, resized but neither augmented nor normalised."""
        j = int(self.indices[i])
        x = _decode_image(self.hf_dataset[j][self.image_column], self.mode, self.image_size)
        if tuple(x.shape) != self.input_shape:
            raise ValueError(
                f"image {j} has shape {tuple(x.shape)}, expected {self.input_shape}: the images differ in size; "
                "set image_size to resize them all to one size"
            )
        return x

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        with _one_thread():
            x = self.decode(i)
            if self.transform is not None:
                x = self.transform(x)
            return x.to(torch.float32).mul_(self.scale).sub_(self.shift), self.labels[int(self.indices[i])]


# --------------------------------------------------------------------------------------------------------------
# Raw readers and caches
# --------------------------------------------------------------------------------------------------------------


def _read_idx(path: Path, ndim: int) -> np.ndarray:
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


def _read_idx_pair(images_path: Path, labels_path: Path, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    images = _read_idx(images_path, 3)
    labels = _read_idx(labels_path, 1)
    if len(images) != len(labels):
        raise ValueError(f"{images_path} holds {len(images)} images but {labels_path} holds {len(labels)} labels")
    if labels.size and int(labels.max()) >= num_classes:
        raise ValueError(f"{labels_path}: label {int(labels.max())} is out of range 0..{num_classes - 1}")
    return images[:, None], labels.astype(np.int64)


def _find_fashion_files(directory: Path) -> dict[str, tuple[Path, Path]] | None:
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


def _files_key(paths: Sequence[Path]) -> str:
    digest = hashlib.sha256(_CACHE_FORMAT.encode())
    for path in paths:
        st = path.stat()
        digest.update(f"{path.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def _array_dataset(images: np.ndarray, labels: np.ndarray, class_names: Sequence[str]) -> datasets.Dataset:
    """A ``datasets.Dataset`` with an ``image`` Array3D(uint8) column and a ``label`` ClassLabel column.

    Built from Arrow buffers directly (``Dataset.from_dict`` goes through Python lists: ~10x slower).
    """
    shape = tuple(int(d) for d in images.shape[1:])
    features = datasets.Features(
        {"image": datasets.Array3D(shape=shape, dtype="uint8"), "label": datasets.ClassLabel(names=list(class_names))}
    )
    storage = numpy_to_pyarrow_listarray(np.ascontiguousarray(images, dtype=np.uint8), type=pa.uint8())
    table = pa.table(
        {
            "image": pa.ExtensionArray.from_storage(Array3DExtensionType(shape, "uint8"), storage),
            "label": pa.array(np.asarray(labels, dtype=np.int64)),
        }
    )
    return datasets.Dataset(InMemoryTable(table), info=datasets.DatasetInfo(features=features))


def _array_column(ds: datasets.Dataset, column: str) -> np.ndarray:
    """An Array3D column as one (N, *shape) numpy array, read from the Arrow buffers without copies per row."""
    shape = tuple(ds.features[column].shape)
    if ds._indices is not None:  # a select()/shuffle() view: materialise it first
        ds = ds.flatten_indices()
    parts = []
    for chunk in ds.data.column(column).chunks:
        values = chunk.storage if isinstance(chunk, pa.ExtensionArray) else chunk
        for _ in shape:
            values = values.flatten()
        parts.append(values.to_numpy(zero_copy_only=False).reshape((len(chunk), *shape)))
    return np.concatenate(parts) if parts else np.zeros((0, *shape), dtype=np.uint8)


def _label_column(ds: datasets.Dataset, column: str) -> np.ndarray:
    """An integer column as a writable int64 array, read without decoding any other column."""
    if ds._indices is not None:
        ds = ds.flatten_indices()
    return np.array(ds.data.column(column).to_numpy(), dtype=np.int64)


def _save_atomically(dataset_dict: datasets.DatasetDict, final: Path) -> None:
    """``save_to_disk`` into a temporary sibling directory, then rename it to ``final``."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    try:
        dataset_dict.save_to_disk(str(tmp))
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():  # not a concurrent writer that won the race: a real error
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _cached_arrays(
    root: Path, name: str, key_files: Sequence[Path], build: Callable[[], datasets.DatasetDict]
) -> datasets.DatasetDict:
    """Load ``<root>/attention-repro/<name>-<key>`` or build it (once) with ``build`` and save it atomically."""
    final = root / _CACHE_SUBDIR / f"{name}-{_files_key(key_files)}"
    if not final.is_dir():
        log.info("converting %s into the datasets cache %s", name, final)
        _save_atomically(build(), final)
    return datasets.load_from_disk(str(final))


def _decode_image(image: Any, mode: str, size: int | None) -> torch.Tensor:
    """A decoded image (PIL) as uint8 (C, H, W) in ``mode``, resized to ``size`` x ``size`` if given."""
    if image.mode != mode:
        image = image.convert(mode)
    x = TF.pil_to_tensor(image)
    if size is not None and tuple(x.shape[-2:]) != (size, size):
        x = TF.resize(x, [size, size], antialias=True)
    return x


def _decode_batch(
    images: list[Any], labels: list[int], mode: str, size: int | None, shape: tuple[int, int, int]
) -> pa.Table:
    """``Dataset.map`` function: decode a batch of images into an Array3D(uint8) table."""
    arrays = []
    for image in images:
        x = _decode_image(image, mode, size)
        if tuple(x.shape) != shape:
            raise ValueError(
                f"an image has shape {tuple(x.shape)} (C, H, W), others {shape}: the images differ in size; "
                "set image_size to resize them all to one size"
            )
        arrays.append(x.numpy())
    stacked = np.stack(arrays) if arrays else np.zeros((0, *shape), dtype=np.uint8)
    storage = numpy_to_pyarrow_listarray(stacked, type=pa.uint8())
    return pa.table(
        {
            "image": pa.ExtensionArray.from_storage(Array3DExtensionType(shape, "uint8"), storage),
            "label": pa.array(np.asarray(labels, dtype=np.int64)),
        }
    )


# --------------------------------------------------------------------------------------------------------------
# Hugging Face Hub access that fails fast offline
# --------------------------------------------------------------------------------------------------------------

_TRUE = {"1", "ON", "YES", "TRUE"}


def _endpoint_reachable(endpoint: str, timeout: float = _HUB_PROBE_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the hub endpoint (or the proxy in front of it) opens within ``timeout``."""
    url = urlparse(endpoint)
    host, port = url.hostname, url.port or (443 if url.scheme == "https" else 80)
    proxy = urllib.request.getproxies().get(url.scheme)
    if proxy and host and not urllib.request.proxy_bypass(host):
        proxy_url = urlparse(proxy if "://" in proxy else f"http://{proxy}")
        host, port = proxy_url.hostname, proxy_url.port or 80
    if not host:
        return False
    result: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            result.append(True)
        except OSError:
            result.append(False)

    # A thread bounds DNS resolution too, which the socket timeout does not cover.
    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout + 0.5)
    return bool(result and result[0])


def _hub_offline() -> tuple[bool, str]:
    """(offline?, why), reading the environment now (the libraries read it once, at import time)."""
    value = os.environ.get("HF_DATASETS_OFFLINE")
    var = "HF_DATASETS_OFFLINE"
    if value is None:
        var = "HF_HUB_OFFLINE" if os.environ.get("HF_HUB_OFFLINE") else "TRANSFORMERS_OFFLINE"
        value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE")
    if value:
        return value.strip().upper() in _TRUE, f"{var}={value}"
    if datasets.config.HF_HUB_OFFLINE:
        return True, "datasets.config.HF_HUB_OFFLINE is set"
    endpoint = huggingface_hub.constants.ENDPOINT
    if not _endpoint_reachable(endpoint):
        return True, f"{endpoint} is unreachable: a connection probe failed or took over {_HUB_PROBE_TIMEOUT_S:g} s"
    return False, f"{endpoint} is reachable"


@contextlib.contextmanager
def _offline_mode(enabled: bool) -> Iterator[None]:
    """Switch ``datasets`` and ``huggingface_hub`` to offline mode for the duration of the block."""
    if not enabled:
        yield
        return
    saved = (
        datasets.config.HF_HUB_OFFLINE,
        datasets.config.HF_DATASETS_OFFLINE,
        huggingface_hub.constants.HF_HUB_OFFLINE,
    )
    datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = True
    huggingface_hub.constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        (
            datasets.config.HF_HUB_OFFLINE,
            datasets.config.HF_DATASETS_OFFLINE,
            huggingface_hub.constants.HF_HUB_OFFLINE,
        ) = saved


class HubDatasetUnavailableError(FileNotFoundError):
    """A hub dataset is not in the local cache and the hub cannot be used; ``why`` says why not."""

    def __init__(self, message: str, why: str) -> None:
        super().__init__(message)
        self.why = why


def _load_hub_dataset(name: str, cache_dir: Path) -> datasets.DatasetDict:
    """``datasets.load_dataset(name)``; offline or unreachable hub: from the cache, or a clear error in seconds."""
    offline, why = _hub_offline()
    try:
        with _offline_mode(offline):
            return datasets.load_dataset(name, cache_dir=str(cache_dir))
    except (ConnectionError, FileNotFoundError) as e:
        if not offline:
            raise
        raise HubDatasetUnavailableError(
            f"hub dataset {name!r} is not in the local datasets cache ({cache_dir}) and the Hugging Face Hub "
            f"cannot be used ({why}). To get it: run once with network access (it is then cached there), or copy "
            f"a filled cache into that directory (cache_dir or HF_DATASETS_CACHE selects it), or use a local "
            f"source (source=folder, data_dir=...). Underlying error: {type(e).__name__}: {e}",
            why,
        ) from e


# --------------------------------------------------------------------------------------------------------------
# Splits
# --------------------------------------------------------------------------------------------------------------


def _rng(split_seed: int, stream: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([split_seed % 2**64, stream]))


def stratified_split(labels: np.ndarray, fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Split positions ``0..len(labels)-1`` into (held out, rest), stratified by label.

    ``round(fraction * N)`` positions are held out in total; each class holds out ``fraction`` of its members
    rounded up or down (largest remainders get the extra ones), so each class's count is within 1 of its share.
    """
    labels = np.asarray(labels)
    classes, counts = np.unique(labels, return_counts=True)
    exact = fraction * counts
    take = np.floor(exact).astype(np.int64)
    extra = int(round(fraction * len(labels))) - int(take.sum())
    if extra > 0:
        # largest fractional parts first; ties broken by a seeded shuffle so no class is always favoured
        tiebreak = rng.permutation(len(classes))
        order = np.lexsort((tiebreak, -(exact - take)))
        take[order[:extra]] += 1
    held, rest = [], []
    for cls, k in zip(classes, take, strict=True):
        members = rng.permutation(np.flatnonzero(labels == cls))
        held.append(members[:k])
        rest.append(members[k:])
    held_idx = np.sort(np.concatenate(held)) if held else np.zeros(0, np.int64)
    rest_idx = np.sort(np.concatenate(rest)) if rest else np.zeros(0, np.int64)
    return held_idx.astype(np.int64), rest_idx.astype(np.int64)


def balanced_subset(
    labels: np.ndarray, n: int, num_classes: int, rng: np.random.Generator, class_names: Sequence[str] | None = None
) -> np.ndarray:
    """Positions of a class-balanced subset of size ``n``, nested in ``n`` for a fixed ``rng`` seed.

    Each class's members are ordered by one seeded permutation and the subset takes a prefix of each: class
    ``k`` gets ``n // K`` plus one if ``k < n % K``. Growing ``n`` by one grows one prefix by one, so the subset
    of size n is contained in the subset of any size m > n.
    """
    labels = np.asarray(labels)
    if n > len(labels):
        raise ValueError(f"train_samples={n} is larger than the train split ({len(labels)} images); lower it")
    out = []
    for k in range(num_classes):
        members = rng.permutation(np.flatnonzero(labels == k))
        want = n // num_classes + (1 if k < n % num_classes else 0)
        if want > len(members):
            name = class_names[k] if class_names is not None else str(k)
            raise ValueError(
                f"train_samples={n} needs {want} images of class {k} ({name!r}) for a balanced subset, but the "
                f"train split has only {len(members)}; lower train_samples (or val_fraction)"
            )
        out.append(members[:want])
    return np.sort(np.concatenate(out)).astype(np.int64) if out else np.zeros(0, np.int64)


def _channel_stats(images: torch.Tensor, rows: torch.Tensor, chunk: int = 4096) -> tuple[list[float], list[float]]:
    """Per-channel mean and std of ``images[rows] / 255`` (uint8 N, C, H, W), accumulated in float64."""
    channels = images.shape[1]
    total = torch.zeros(channels, dtype=torch.float64)
    total_sq = torch.zeros(channels, dtype=torch.float64)
    count = 0
    for start in range(0, len(rows), chunk):
        x = images[rows[start : start + chunk]].to(torch.float64) / 255.0
        total += x.sum(dim=(0, 2, 3))
        total_sq += x.square().sum(dim=(0, 2, 3))
        count += x.shape[0] * x.shape[2] * x.shape[3]
    if count == 0:
        return [0.5] * channels, [0.5] * channels
    mean = total / count
    std = (total_sq / count - mean.square()).clamp_min(0).sqrt()
    std = torch.where(std > 1e-6, std, torch.ones_like(std))  # a constant channel: leave its scale alone
    return mean.tolist(), std.tolist()


# --------------------------------------------------------------------------------------------------------------
# The DataModule
# --------------------------------------------------------------------------------------------------------------


@dataclass
class _Pool:
    """The rows one or more splits index into: in memory (``images``) or lazily decoded (``hf``)."""

    labels: np.ndarray
    images: torch.Tensor | None = None
    hf: datasets.Dataset | None = None


@dataclass
class _Raw:
    train: datasets.Dataset
    test: datasets.Dataset | None
    image_column: str
    label_column: str
    class_names: list[str]
    origin: str
    test_origin: str  # "official <split>" or "held out"


class ImageDataModule(L.LightningDataModule):
    """Image-classification data for every image source of the ViT ablations (see the module docstring).

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
            fixed ``split_seed`` smaller subsets are contained in larger ones). None: the whole train split.
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
        augment: str = "none",
        image_size: int | None = None,
        split_seed: int = 0,
        mean: list[float] | None = None,
        std: list[float] | None = None,
        image_column: str | None = None,
        label_column: str | None = None,
        image_mode: str | None = None,
        cache_dir: str | None = None,
        max_in_memory_bytes: int = 2_000_000_000,
        pin_memory: bool = False,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        source = source.strip()
        if source not in SOURCES and "/" not in source:
            raise ValueError(
                f"unknown source {source!r}: use one of {', '.join(SOURCES)}, or a hub dataset name 'owner/name'"
            )
        if augment not in AUGMENTS:
            raise ValueError(f"unknown augment {augment!r}: use one of {', '.join(AUGMENTS)}")
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
        if image_mode is not None and image_mode not in IMAGE_MODES:
            raise ValueError(f"unknown image_mode {image_mode!r}: use one of {', '.join(IMAGE_MODES)}, or None")
        if (mean is None) != (std is None) or (mean is not None and len(mean) != len(std)):
            raise ValueError(f"mean={mean} and std={std} must both be given with one value per channel, or both None")
        if std is not None and any(s <= 0 for s in std):
            raise ValueError(f"std={std} must be positive")
        if source == "folder":
            if data_dir is None:
                raise ValueError("source='folder' needs data_dir=<directory with one sub-folder of images per class>")
            _check_image_folder(Path(data_dir).expanduser())
        elif source == "fashion_mnist" and data_dir is not None and not Path(data_dir).expanduser().is_dir():
            raise FileNotFoundError(
                f"data_dir={data_dir!r} does not exist: point it at the directory holding the Fashion-MNIST idx "
                "files, or leave it unset to search $DATA_DIR and /usr/share/datasets/fashion-mnist"
            )

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
        self._origin = self._test_origin = self._image_column = None

    # ---------------------------------------------------------------------------------------------- Lightning

    def prepare_data(self) -> None:
        """Fill the caches (convert local files, download hub data, decode images); runs on rank 0 only."""
        raw = self._raw()
        self._pools(raw, keep=False)

    def setup(self, stage: str | None = None) -> None:
        """Load the data from the caches, build the splits and datasets (idempotent; runs on every rank)."""
        self._set_batch_sizes()
        if self.train_dataset is not None:
            return
        raw = self._raw()
        train_pool, test_pool, mode = self._pools(raw, keep=True)
        self.class_names = list(raw.class_names)
        self.num_classes = len(self.class_names)
        self._origin, self._test_origin = raw.origin, raw.test_origin
        self._image_column = raw.image_column

        # test: the official split, or a stratified hold-out of the source's train split
        if test_pool is None:
            test_rows, pool_rows = stratified_split(
                train_pool.labels, self.test_fraction, _rng(self.split_seed, _STREAM_TEST)
            )
            test_pool = train_pool
        else:
            test_rows, pool_rows = np.arange(len(test_pool.labels)), np.arange(len(train_pool.labels))
        held, kept = stratified_split(
            train_pool.labels[pool_rows], self.val_fraction, _rng(self.split_seed, _STREAM_VAL)
        )
        val_rows, train_rows = pool_rows[held], pool_rows[kept]
        if self.train_samples is not None:
            if self.train_samples > len(train_rows):
                raise ValueError(
                    f"train_samples={self.train_samples} is larger than the train split ({len(train_rows)} images "
                    f"after holding out val_fraction={self.val_fraction}); lower train_samples"
                )
            chosen = balanced_subset(
                train_pool.labels[train_rows], self.train_samples, self.num_classes,
                _rng(self.split_seed, _STREAM_SUBSET), self.class_names,
            )  # fmt: skip
            subset_rows = train_rows[chosen]
        else:
            subset_rows = train_rows

        if self.in_memory:
            self.input_shape = tuple(int(d) for d in train_pool.images.shape[1:])
        channels, height, width = self.input_shape
        if self.mean is None:
            self.mean, self.std = self._stats(train_pool, train_rows, mode)
        if len(self.mean) != channels:
            raise ValueError(
                f"mean={self.mean} and std={self.std} have {len(self.mean)} values but the images have "
                f"{channels} channel(s)"
            )
        augment = _build_augment(self.augment, height, width)
        self.train_dataset = self._dataset(train_pool, subset_rows, mode, augment)
        self.val_dataset = self._dataset(train_pool, val_rows, mode, None)
        self.test_dataset = self._dataset(test_pool, test_rows, mode, None)

    def train_dataloader(self) -> DataLoader:
        dataset = self._require("train_dataset")
        sampler = SeededRandomSampler(dataset, seed=_run_seed())
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

    # ---------------------------------------------------------------------------------------------- loading

    def _cache_root(self) -> Path:
        root = self.cache_dir or os.environ.get("HF_DATASETS_CACHE") or datasets.config.HF_DATASETS_CACHE
        return Path(os.path.expanduser(str(root)))

    def _raw(self) -> _Raw:
        """The source as Hugging Face datasets (train, optional test), from the caches."""
        if self.source == "digits":
            return self._digits()
        if self.source == "fashion_mnist":
            return self._fashion_mnist()
        if self.source == "folder":
            path = Path(self.data_dir).expanduser().resolve()
            dd = datasets.load_dataset("imagefolder", data_dir=str(path), cache_dir=str(self._cache_root()))
            return self._from_dataset_dict(dd, str(path), "image", "label")
        name, image_column, label_column = HUB_SOURCES.get(self.source, (self.source, None, None))
        dd = _load_hub_dataset(name, self._cache_root())
        return self._from_dataset_dict(dd, name, image_column, label_column)

    def _digits(self) -> _Raw:
        from importlib import resources

        import sklearn
        from sklearn.datasets import load_digits

        names = [str(d) for d in range(10)]
        data_file = Path(str(resources.files("sklearn.datasets") / "data" / "digits.csv.gz"))

        def build() -> datasets.DatasetDict:
            digits = load_digits()
            images = np.rint(digits.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)[:, None]
            return datasets.DatasetDict({"train": _array_dataset(images, digits.target, names)})

        key_files = [data_file] if data_file.is_file() else []
        dd = _cached_arrays(self._cache_root(), f"digits-sklearn{sklearn.__version__}", key_files, build)
        return _Raw(
            dd["train"], None, "image", "label", names, f"sklearn.datasets.load_digits ({data_file})", "held out"
        )

    def _fashion_mnist(self) -> _Raw:
        if self.data_dir is not None:
            candidates = [Path(self.data_dir).expanduser()]
        else:
            candidates = []
            if os.environ.get("DATA_DIR"):
                data_dir = Path(os.environ["DATA_DIR"]).expanduser()
                candidates += [data_dir / "fashion-mnist", data_dir]
            candidates.append(Path(FASHION_MNIST_DEBIAN_DIR))
        for directory in candidates:
            files = _find_fashion_files(directory)
            if files is None:
                continue

            def build(files: dict[str, tuple[Path, Path]] = files) -> datasets.DatasetDict:
                return datasets.DatasetDict(
                    {
                        split: _array_dataset(
                            *_read_idx_pair(*paths, len(FASHION_MNIST_CLASSES)), FASHION_MNIST_CLASSES
                        )
                        for split, paths in files.items()
                    }
                )

            key_files = [p for paths in files.values() for p in paths]
            dd = _cached_arrays(self._cache_root(), "fashion_mnist", key_files, build)
            return _Raw(
                dd["train"], dd["test"], "image", "label", list(FASHION_MNIST_CLASSES), str(directory), "official test"
            )

        name, image_column, label_column = FASHION_MNIST_HUB
        looked = "; ".join(str(c) for c in candidates)
        log.warning("Fashion-MNIST idx files not found in %s; trying the hub dataset %s", looked, name)
        try:
            dd = _load_hub_dataset(name, self._cache_root())
        except HubDatasetUnavailableError as e:
            wanted = ", ".join(f"{n}.gz" for names in FASHION_MNIST_FILES.values() for n in names)
            raise FileNotFoundError(
                f"Fashion-MNIST not found. Looked for {wanted} in: {looked}; and for the hub dataset {name!r} in "
                f"the datasets cache {self._cache_root()} (not there, and the hub cannot be used: {e.why}). To get it: "
                f"`apt-get install dataset-fashion-mnist` (installs the files into {FASHION_MNIST_DEBIAN_DIR}), "
                "or set DATA_DIR or data_dir to a directory holding the four idx .gz files, or run once with "
                "network access to fill the hub cache."
            ) from e
        return self._from_dataset_dict(dd, name, image_column, label_column)

    def _from_dataset_dict(
        self, dd: datasets.DatasetDict, origin: str, image_column: str | None, label_column: str | None
    ) -> _Raw:
        if "train" not in dd:
            raise ValueError(f"{origin} has no 'train' split (splits: {list(dd)})")
        train = dd["train"]
        test_split = next((s for s in ("test", "validation") if s in dd), None)
        test = dd[test_split] if test_split else None
        features = train.features
        image_column = self.image_column or image_column
        label_column = self.label_column or label_column
        if image_column is None:
            image_column = next((c for c, f in features.items() if isinstance(f, datasets.Image)), None)
        if label_column is None:
            label_column = next((c for c, f in features.items() if isinstance(f, datasets.ClassLabel)), None)
        if image_column not in features:
            raise ValueError(f"{origin}: no image column {image_column!r}; columns: {dict(features)}; set image_column")
        if label_column not in features:
            raise ValueError(
                f"{origin}: no label column {label_column!r} (no ClassLabel column found); columns: "
                f"{dict(features)}; set label_column"
            )
        if not isinstance(features[image_column], (datasets.Image, datasets.Array3D)):
            raise ValueError(f"{origin}: column {image_column!r} is {features[image_column]}, not an Image column")
        label_feature = features[label_column]
        if isinstance(label_feature, datasets.ClassLabel):
            class_names = list(label_feature.names)
        elif isinstance(label_feature, datasets.Value) and label_feature.dtype.startswith(("int", "uint")):
            top = max(int(_label_column(d, label_column).max(initial=0)) for d in (train, test) if d is not None)
            class_names = [str(i) for i in range(top + 1)]
        else:
            raise ValueError(f"{origin}: label column {label_column!r} is {label_feature}, not integer class labels")
        return _Raw(train, test, image_column, label_column, class_names, origin,
                    f"official {test_split}" if test_split else "held out")  # fmt: skip

    def _pools(self, raw: _Raw, keep: bool) -> tuple[_Pool, _Pool | None, str | None]:
        """Turn the HF datasets into in-memory uint8 tensors, or lazy pools for large image datasets."""
        splits = [d for d in (raw.train, raw.test) if d is not None]
        feature = raw.train.features[raw.image_column]
        if isinstance(feature, datasets.Array3D):  # our converted caches: always in memory
            self.in_memory = True
            if not keep:
                return None, None, None  # type: ignore[return-value]
            pools = [self._array_pool(d, raw) for d in splits]
            return pools[0], pools[1] if len(pools) > 1 else None, None

        mode, native_size = self._probe(raw, splits)
        height, width = (self.image_size, self.image_size) if self.image_size else native_size
        shape = (1 if mode == "L" else 3, height, width)
        total_bytes = sum(len(d) for d in splits) * math.prod(shape)
        self.in_memory = total_bytes <= self.max_in_memory_bytes
        self.input_shape = shape
        pools = []
        for d in splits:
            labels = _label_column(d, raw.label_column)
            if not self.in_memory:
                pools.append(_Pool(labels=labels, hf=d))
                continue
            fn_kwargs = {"mode": mode, "size": self.image_size, "shape": shape}
            fingerprint = hashlib.sha256(
                json.dumps([_CACHE_FORMAT, d._fingerprint, raw.image_column, raw.label_column, fn_kwargs]).encode()
            ).hexdigest()[:16]
            decoded = d.map(
                _decode_batch,
                batched=True,
                batch_size=1000,
                input_columns=[raw.image_column, raw.label_column],
                remove_columns=d.column_names,
                fn_kwargs=fn_kwargs,
                features=datasets.Features(
                    {"image": datasets.Array3D(shape=shape, dtype="uint8"), "label": datasets.Value("int64")}
                ),
                new_fingerprint=fingerprint,
                desc="Decoding images to uint8 arrays",
            )
            if keep:
                pools.append(_Pool(labels=labels, images=torch.from_numpy(_array_column(decoded, "image"))))
        if not keep:
            return None, None, None  # type: ignore[return-value]
        return pools[0], pools[1] if len(pools) > 1 else None, mode

    def _array_pool(self, ds: datasets.Dataset, raw: _Raw) -> _Pool:
        images = torch.from_numpy(_array_column(ds, raw.image_column))
        if self.image_size is not None and tuple(images.shape[-2:]) != (self.image_size, self.image_size):
            size = [self.image_size, self.image_size]
            images = torch.cat(
                [TF.resize(images[i : i + 4096], size, antialias=True) for i in range(0, len(images), 4096)]
            ) if len(images) else images.new_zeros((0, images.shape[1], *size))  # fmt: skip
        labels = _label_column(ds, raw.label_column)
        return _Pool(labels=labels, images=images)

    def _probe(self, raw: _Raw, splits: list[datasets.Dataset]) -> tuple[str, tuple[int, int]]:
        """Image mode (``L``/``RGB``) and native (H, W) from up to 16 images spread over the splits."""
        modes, sizes = set(), set()
        for d in splits:
            column = d.select_columns([raw.image_column])
            for i in sorted({int(i) for i in np.linspace(0, len(d) - 1, num=min(8, len(d)))}):
                image = column[i][raw.image_column]
                modes.add(image.mode)
                sizes.add((image.height, image.width))
        if not sizes:
            raise ValueError(f"{raw.origin}: the dataset holds no images")
        mode = self.image_mode or ("L" if modes <= _GRAYSCALE_MODES else "RGB")
        if len(sizes) > 1 and self.image_size is None:
            raise ValueError(
                f"{raw.origin}: the images differ in size (e.g. {sorted(sizes)[:4]} as (H, W)); set image_size to "
                "resize them all to one size"
            )
        return mode, next(iter(sizes))

    def _stats(self, pool: _Pool, rows: np.ndarray, mode: str | None) -> tuple[list[float], list[float]]:
        if pool.images is not None:
            return _channel_stats(pool.images, torch.as_tensor(rows))
        sample = rows
        if len(rows) > 1024:
            sample = np.sort(_rng(self.split_seed, _STREAM_STATS).choice(rows, size=1024, replace=False))
        lazy = self._dataset(
            pool, sample, mode, None, mean=[0.0] * self.input_shape[0], std=[1.0] * self.input_shape[0]
        )
        images = (
            torch.stack([lazy.decode(i) for i in range(len(lazy))])
            if len(lazy)
            else torch.zeros((0, *self.input_shape), dtype=torch.uint8)
        )
        return _channel_stats(images, torch.arange(len(images)))

    def _dataset(
        self,
        pool: _Pool,
        rows: np.ndarray,
        mode: str | None,
        transform: Callable[[torch.Tensor], torch.Tensor] | None,
        mean: list[float] | None = None,
        std: list[float] | None = None,
    ) -> Dataset:
        mean, std = mean or self.mean, std or self.std
        if pool.images is not None:
            return InMemoryImages(pool.images, torch.from_numpy(pool.labels), rows, mean, std, transform)
        return LazyImages(pool.hf, self._image_column, pool.labels, rows, mode, self.image_size,
                          self.input_shape, mean, std, transform)  # fmt: skip


class CropFlip:
    """Random crop with zero padding, then a horizontal flip with probability 1/2, per image:
    ``v2.RandomCrop(size, padding=(pad_w, pad_h))`` + ``v2.RandomHorizontalFlip()``, computed for a
    whole uint8 batch (B, C, H, W) at once with one gather (a (C, H, W) image works too).

    Each image gets its own offsets (uniform in [0, 2 pad]) and flip, drawn from the global torch
    generator (the datasets seed it per batch). On a CPU the per-image torchvision loop costs
    about as much as a small model's training step; this costs a few percent of it
    (``python -m reproductions bench data``).
    """

    def __init__(self, height: int, width: int, pad_h: int, pad_w: int) -> None:
        self.height, self.width, self.pad_h, self.pad_w = height, width, pad_h, pad_w

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        single = x.dim() == 3
        batch = x.unsqueeze(0) if single else x
        n = batch.shape[0]
        padded = F.pad(batch, (self.pad_w, self.pad_w, self.pad_h, self.pad_h))
        dy = torch.randint(0, 2 * self.pad_h + 1, (n,))
        dx = torch.randint(0, 2 * self.pad_w + 1, (n,))
        flip = torch.rand(n) < 0.5
        rows = dy[:, None] + torch.arange(self.height)  # (B, H)
        cols = dx[:, None] + torch.arange(self.width)  # (B, W)
        cols = torch.where(flip[:, None], cols.flip(1), cols)
        # advanced indices around a slice: the result is (B, H, W, C)
        out = padded[torch.arange(n)[:, None, None], :, rows[:, :, None], cols[:, None, :]]
        out = out.permute(0, 3, 1, 2).contiguous()
        return out[0] if single else out

    def __repr__(self) -> str:
        return f"CropFlip(size=({self.height}, {self.width}), padding=({self.pad_h}, {self.pad_w}))"


class Augment:
    """The training augmentation: ``CropFlip`` on the batch, then an optional per-image policy
    (RandAugment, AutoAugment) on uint8 (C, H, W) tensors. ``aug(image)`` for one image,
    ``aug.batch(images)`` for a batch."""

    def __init__(self, crop_flip: CropFlip, policy: v2.Transform | None = None) -> None:
        self.crop_flip, self.policy = crop_flip, policy

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = self.crop_flip(x)
        return self.policy(x) if self.policy is not None else x

    def batch(self, x: torch.Tensor) -> torch.Tensor:
        x = self.crop_flip(x)
        if self.policy is not None:
            x = torch.stack([self.policy(image) for image in x.unbind(0)])
        return x

    def __repr__(self) -> str:
        return f"Augment({self.crop_flip!r}, policy={self.policy!r})"


def _build_augment(augment: str, height: int, width: int) -> Augment | None:
    """The training augmentation for uint8 images (crop with padding size/8 or none, flip, policy)."""
    if augment == "none":
        return None
    pad_h, pad_w = (0, 0) if augment == "flip" else (max(1, height // 8), max(1, width // 8))
    crop_flip = CropFlip(height, width, pad_h=pad_h, pad_w=pad_w)
    policy = None
    if augment == "randaugment":
        policy = v2.RandAugment()
    elif augment == "autoaugment":
        policy = v2.AutoAugment(v2.AutoAugmentPolicy.CIFAR10)
    return Augment(crop_flip, policy)


def _check_image_folder(path: Path) -> None:
    if not path.is_dir():
        raise FileNotFoundError(
            f"data_dir {str(path)!r} does not exist or is not a directory: source='folder' needs a directory "
            "with one sub-folder of images per class (optionally under train/ and test/)"
        )
    for _, _, files in os.walk(path):
        if any(f.lower().endswith(IMAGE_EXTENSIONS) for f in files):
            return
    raise FileNotFoundError(
        f"no images ({', '.join(IMAGE_EXTENSIONS)}) found under data_dir {str(path)!r}: source='folder' needs "
        "one sub-folder of images per class, e.g. <data_dir>/cat/0001.png"
    )

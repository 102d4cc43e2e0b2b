"""The registry of image sources: name -> ``Source`` (how to check its settings, how to read it).

Named sources (``SOURCES``):

- ``digits``: scikit-learn's 8x8 digits (1 channel, 10 classes, 1797 images, no network). No official
  test split, so a seeded, stratified ``test_fraction`` is held out.
- ``fashion_mnist``: the idx ``.gz`` files from a local directory (``data_dir``, else ``$DATA_DIR/fashion-mnist``
  or ``$DATA_DIR``, else the Debian package's ``/usr/share/datasets/fashion-mnist``), falling back to the hub
  dataset ``zalando-datasets/fashion_mnist``. Official 60k/10k split.
- ``cifar10`` / ``cifar100``: the hub datasets ``uoft-cs/cifar10`` / ``uoft-cs/cifar100`` (fine labels).
- ``folder``: a local image folder (``data_dir/<class>/<image>``, optionally with ``train/`` and ``test/`` (or
  ``val/``) levels above the class folders), read with ``datasets.load_dataset("imagefolder")``.

Any other name of the form ``owner/name`` is a hub dataset (``resolve_source``): image column = first
``Image`` column, label column = first ``ClassLabel`` column, unless ``image_column`` / ``label_column`` say
otherwise. Reading a source gives ``SourceData``: its train and optional test split as ``datasets``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import MappingProxyType

import datasets

from datamodules.images import arrow
from datamodules.images.cache import cached_arrays
from datamodules.images.hub import HubDatasetUnavailableError, load_hub_dataset
from datamodules.images.readers import (
    FASHION_MNIST_CLASSES,
    FASHION_MNIST_FILES,
    find_fashion_files,
    read_digits,
    read_idx_pair,
)

log = logging.getLogger(__name__)

FASHION_MNIST_HUB = ("zalando-datasets/fashion_mnist", "image", "label")
FASHION_MNIST_DEBIAN_DIR = "/usr/share/datasets/fashion-mnist"  # Debian/Ubuntu package `dataset-fashion-mnist`
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pbm")


@dataclass
class SourceData:
    """A source read into Hugging Face datasets: what the pools are built from."""

    train: datasets.Dataset
    test: datasets.Dataset | None
    image_column: str
    label_column: str
    class_names: list[str]
    origin: str  # where it was read from (a path, a hub name)
    test_origin: str  # "official <split>" or "held out"


@dataclass(frozen=True)
class ReadOptions:
    """The ``ImageDataModule`` settings a source reader needs."""

    data_dir: str | None
    cache_root: Path
    image_column: str | None = None
    label_column: str | None = None


def _no_check(data_dir: str | None) -> None:
    pass


@dataclass(frozen=True)
class Source:
    """One source: ``check(data_dir)`` validates its settings at construction, ``read(options)`` loads it."""

    read: Callable[[ReadOptions], SourceData]
    check: Callable[[str | None], None] = _no_check


# ---------------------------------------------------------------------------------------------------- readers


def read_digits_source(options: ReadOptions) -> SourceData:
    """sklearn's digits, converted once into the datasets cache (keyed by sklearn's data file and version)."""
    from importlib import resources

    import sklearn

    names = [str(d) for d in range(10)]
    data_file = Path(str(resources.files("sklearn.datasets") / "data" / "digits.csv.gz"))

    def build() -> datasets.DatasetDict:
        return datasets.DatasetDict({"train": arrow.array_dataset(*read_digits(), names)})

    key_files = [data_file] if data_file.is_file() else []
    dd = cached_arrays(options.cache_root, f"digits-sklearn{sklearn.__version__}", key_files, build)
    origin = f"sklearn.datasets.load_digits ({data_file})"
    return SourceData(dd["train"], None, "image", "label", names, origin, "held out")


def _fashion_dirs(data_dir: str | None) -> list[Path]:
    """Where to look for the idx files, in order."""
    if data_dir is not None:
        return [Path(data_dir).expanduser()]
    candidates = []
    if os.environ.get("DATA_DIR"):
        root = Path(os.environ["DATA_DIR"]).expanduser()
        candidates += [root / "fashion-mnist", root]
    return [*candidates, Path(FASHION_MNIST_DEBIAN_DIR)]


def _read_fashion_files(directory: Path, files: dict[str, tuple[Path, Path]], cache: Path) -> SourceData:
    def build() -> datasets.DatasetDict:
        classes, n = FASHION_MNIST_CLASSES, len(FASHION_MNIST_CLASSES)
        return datasets.DatasetDict(
            {split: arrow.array_dataset(*read_idx_pair(*paths, n), classes) for split, paths in files.items()}
        )

    dd = cached_arrays(cache, "fashion_mnist", [p for paths in files.values() for p in paths], build)
    classes = list(FASHION_MNIST_CLASSES)
    return SourceData(dd["train"], dd["test"], "image", "label", classes, str(directory), "official test")


def read_fashion_mnist(options: ReadOptions) -> SourceData:
    """The idx files of the first directory holding all four, else the hub dataset (from its cache offline)."""
    candidates = _fashion_dirs(options.data_dir)
    for directory in candidates:
        files = find_fashion_files(directory)
        if files is not None:
            return _read_fashion_files(directory, files, options.cache_root)

    name, image_column, label_column = FASHION_MNIST_HUB
    looked = "; ".join(str(c) for c in candidates)
    log.warning("Fashion-MNIST idx files not found in %s; trying the hub dataset %s", looked, name)
    try:
        dd = load_hub_dataset(name, options.cache_root)
    except HubDatasetUnavailableError as e:
        wanted = ", ".join(f"{n}.gz" for names in FASHION_MNIST_FILES.values() for n in names)
        raise FileNotFoundError(
            f"Fashion-MNIST not found. Looked for {wanted} in: {looked}; and for the hub dataset {name!r} in "
            f"the datasets cache {options.cache_root} (not there, and the hub cannot be used: {e.why}). To get "
            f"it: `apt-get install dataset-fashion-mnist` (installs the files into {FASHION_MNIST_DEBIAN_DIR}), "
            "or set DATA_DIR or data_dir to a directory holding the four idx .gz files, or run once with "
            "network access to fill the hub cache."
        ) from e
    return from_dataset_dict(dd, name, image_column, label_column, options)


def read_folder(options: ReadOptions) -> SourceData:
    """An image folder through ``datasets``' ``imagefolder`` builder (cached)."""
    path = Path(options.data_dir).expanduser().resolve()
    dd = datasets.load_dataset("imagefolder", data_dir=str(path), cache_dir=str(options.cache_root))
    return from_dataset_dict(dd, str(path), "image", "label", options)


def read_hub(name: str, image_column: str | None, label_column: str | None, options: ReadOptions) -> SourceData:
    """A hub dataset; ``image_column``/``label_column``: its columns (None: found from the features)."""
    dd = load_hub_dataset(name, options.cache_root)
    return from_dataset_dict(dd, name, image_column, label_column, options)


def _find_columns(
    features: datasets.Features, origin: str, image_column: str | None, label_column: str | None
) -> tuple[str, str]:
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
    return image_column, label_column


def from_dataset_dict(
    dd: datasets.DatasetDict, origin: str, image_column: str | None, label_column: str | None, options: ReadOptions
) -> SourceData:
    """The train split and the test (else validation) split of ``dd``, their columns and class names."""
    if "train" not in dd:
        raise ValueError(f"{origin} has no 'train' split (splits: {list(dd)})")
    train = dd["train"]
    test_split = next((s for s in ("test", "validation") if s in dd), None)
    test = dd[test_split] if test_split else None
    image_column, label_column = _find_columns(
        train.features, origin, options.image_column or image_column, options.label_column or label_column
    )
    label_feature = train.features[label_column]
    if isinstance(label_feature, datasets.ClassLabel):
        class_names = list(label_feature.names)
    elif isinstance(label_feature, datasets.Value) and label_feature.dtype.startswith(("int", "uint")):
        top = max(int(arrow.label_column(d, label_column).max(initial=0)) for d in (train, test) if d is not None)
        class_names = [str(i) for i in range(top + 1)]
    else:
        raise ValueError(f"{origin}: label column {label_column!r} is {label_feature}, not integer class labels")
    return SourceData(train, test, image_column, label_column, class_names, origin,
                      f"official {test_split}" if test_split else "held out")  # fmt: skip



# ---------------------------------------------------------------------------------------------------- checks


def check_image_folder(data_dir: str | None) -> None:
    """``folder`` needs ``data_dir``: an existing directory with at least one image below it."""
    if data_dir is None:
        raise ValueError("source='folder' needs data_dir=<directory with one sub-folder of images per class>")
    path = Path(data_dir).expanduser()
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


def check_fashion_dir(data_dir: str | None) -> None:
    """``fashion_mnist``: a given ``data_dir`` must exist (unset: the default places are searched)."""
    if data_dir is not None and not Path(data_dir).expanduser().is_dir():
        raise FileNotFoundError(
            f"data_dir={data_dir!r} does not exist: point it at the directory holding the Fashion-MNIST idx "
            "files, or leave it unset to search $DATA_DIR and /usr/share/datasets/fashion-mnist"
        )


# ---------------------------------------------------------------------------------------------------- registry


def hub_source(name: str, image_column: str | None = None, label_column: str | None = None) -> Source:
    """A hub dataset ``owner/name`` as a source (columns None: found from its features)."""
    return Source(partial(read_hub, name, image_column, label_column))


SOURCES: Mapping[str, Source] = MappingProxyType({
    "digits": Source(read_digits_source),
    "fashion_mnist": Source(read_fashion_mnist, check_fashion_dir),
    "cifar10": hub_source("uoft-cs/cifar10", "img", "label"),
    "cifar100": hub_source("uoft-cs/cifar100", "img", "fine_label"),
    "folder": Source(read_folder, check_image_folder),
})  # fmt: skip
"""The named sources; any other name containing a ``/`` is a hub dataset (see ``resolve_source``)."""


def resolve_source(name: str) -> Source:
    """The source called ``name``: a named one, or the hub dataset ``owner/name``; else a ValueError."""
    if name in SOURCES:
        return SOURCES[name]
    if "/" in name:
        return hub_source(name)
    raise ValueError(f"unknown source {name!r}: use one of {', '.join(SOURCES)}, or a hub dataset name 'owner/name'")

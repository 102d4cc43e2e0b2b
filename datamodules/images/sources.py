"""The registry of image sources: name -> ``Source`` (how to check its settings, how to read it).

Named sources (``SOURCES``):

- ``digits``: scikit-learn's 8x8 digits (1 channel, 10 classes, 1797 images, no network). No official
  test split, so a seeded, stratified ``test_fraction`` is held out.
- ``fashion_mnist``: the idx ``.gz`` files from a local directory (``data_dir``, else ``$DATA_DIR/fashion-mnist``
  or ``$DATA_DIR``, else the Debian package's ``/usr/share/datasets/fashion-mnist``), falling back to the hub
  dataset ``zalando-datasets/fashion_mnist``. Official 60k/10k split.
- ``cifar10`` / ``cifar100``: the hub datasets ``uoft-cs/cifar10`` / ``uoft-cs/cifar100`` (fine labels).
- ``folder``: a local image folder (``data_dir/<class>/<image>``, optionally with ``train/`` and ``test/`` (or
  ``val/``) levels above the class folders), prepared once into Arrow files of the encoded images
  (``datamodules.images.prepared``).
- ``imagenet``: ImageNet-1k (1000 classes): a folder ``data_dir`` with ``train/<wnid>/*.JPEG`` and
  ``val/<wnid>/*.JPEG``, or, without ``data_dir``, the gated hub dataset ``ILSVRC/imagenet-1k`` (its
  ``validation`` split is the test set: its ``test`` split has no labels). Without a hub token the hub path
  fails at construction, in one line saying how to log in (unless it is prepared locally already).

Any other name of the form ``owner/name`` is a hub dataset (``resolve_source``): image column = first
``Image`` column, label column = first ``ClassLabel`` column, unless ``image_column`` / ``label_column`` say
otherwise. Hub datasets are prepared too (their images verified once, their Arrow files referenced, not
copied), so later runs open them without the network. Reading a source gives ``SourceData``: its train and
optional test split as ``datasets``.
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
from datamodules.images.listing import IMAGE_EXTENSIONS, has_image, is_image_name
from datamodules.images.prepared import Prepared, is_prepared_hub, open_folder, open_hub, read_index
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
IMAGENET_HUB = "ILSVRC/imagenet-1k"
GATED_DATASETS = frozenset({IMAGENET_HUB})
"""Hub datasets known to need an accepted licence and a token (any other gated one is recognised when loading)."""


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
    prepared: Prepared | None = None  # encoded images (folders, hub): their prepared dataset


@dataclass(frozen=True)
class ReadOptions:
    """The ``ImageDataModule`` settings a source reader needs."""

    data_dir: str | None
    cache_root: Path
    image_column: str | None = None
    label_column: str | None = None
    skip_bad_images: bool = False
    workers: int | None = None  # processes that prepare (None: all cores)
    refresh: bool = False  # walk a folder (fingerprint every file) even when its directory stamp is unchanged


def _no_check(options: ReadOptions) -> None:
    pass


@dataclass(frozen=True)
class Source:
    """One source: ``check(options)`` validates its settings at construction, ``read(options)`` loads it."""

    read: Callable[[ReadOptions], SourceData]
    check: Callable[[ReadOptions], None] = _no_check


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
        return read_hub(name, image_column, label_column, options)
    except HubDatasetUnavailableError as e:
        wanted = ", ".join(f"{n}.gz" for names in FASHION_MNIST_FILES.values() for n in names)
        raise FileNotFoundError(
            f"Fashion-MNIST not found. Looked for {wanted} in: {looked}; and for the hub dataset {name!r} in "
            f"the datasets cache {options.cache_root} (not there, and the hub cannot be used: {e.why}). To get "
            f"it: `apt-get install dataset-fashion-mnist` (installs the files into {FASHION_MNIST_DEBIAN_DIR}), "
            "or set DATA_DIR or data_dir to a directory holding the four idx .gz files, or run once with "
            "network access to fill the hub cache."
        ) from e


def read_folder(options: ReadOptions, source: str = "folder") -> SourceData:
    """An image folder, prepared once (``datamodules.images.prepared``), opened memory-mapped."""
    prepared = open_folder(options.data_dir, options.cache_root, workers=options.workers,
                           skip_bad_images=options.skip_bad_images, refresh=options.refresh, source=source)  # fmt: skip
    return from_prepared(prepared, None, None, options)


def read_hub(name: str, image_column: str | None, label_column: str | None, options: ReadOptions,
             test_split: str | None = None) -> SourceData:  # fmt: skip
    """A hub dataset, prepared once; ``image_column``/``label_column``: its columns (None: found from the
    features); ``test_split``: the split used as the test set (None: ``test``, else ``validation``)."""

    def load() -> datasets.DatasetDict:
        try:
            return load_hub_dataset(name, options.cache_root)
        except Exception as e:  # a gated dataset without an accepted licence or a token: say so in one line
            if _is_gated_error(e):
                raise GatedDatasetError(gated_message(name)) from None
            raise

    def choose(dd: datasets.DatasetDict) -> tuple[dict[str, str], str, str]:
        return choose_splits(dd, name, options.image_column or image_column, options.label_column or label_column,
                             test_split)  # fmt: skip

    identity = f"{options.image_column or image_column}:{test_split}"
    prepared = open_hub(name, load, choose, options.cache_root, workers=options.workers,
                        skip_bad_images=options.skip_bad_images, refresh=options.refresh,
                        identity_extra=identity)  # fmt: skip
    return from_prepared(prepared, image_column, label_column, options)


# ---------------------------------------------------------------------------------------------------- ImageNet


class GatedDatasetError(PermissionError):
    """A gated hub dataset and no token: the message says how to log in."""


def gated_message(name: str) -> str:
    return (
        f"hub dataset {name!r} is gated: accept its terms at https://huggingface.co/datasets/{name} and log in "
        "(`hf auth login`, formerly `huggingface-cli login`, or set HF_TOKEN), or prepare it where you can "
        "(`repro data prepare --source ...`), or use the folder layout (--data.data_dir with "
        "train/<wnid>/ and val/<wnid>/)"
    )


def _is_gated_error(error: BaseException) -> bool:
    import huggingface_hub.errors as hf_errors

    chain: BaseException | None = error
    while chain is not None:
        if isinstance(chain, (hf_errors.GatedRepoError,)) or "gated" in str(chain).lower():
            return True
        chain = chain.__cause__ or chain.__context__
    return False


def check_hub_access(name: str, options: ReadOptions, identity: str) -> None:
    """A known gated dataset that is not prepared here needs a token: fail now, in one line, before training."""
    if name not in GATED_DATASETS:
        return
    import huggingface_hub

    if huggingface_hub.get_token() is None and not is_prepared_hub(name, options.cache_root, identity):
        raise GatedDatasetError(gated_message(name))


def read_imagenet(options: ReadOptions) -> SourceData:
    """ImageNet-1k: the folder ``data_dir`` (``train/<wnid>/``, ``val/<wnid>/``), else the hub ``ILSVRC/imagenet-1k``."""
    if options.data_dir is not None:
        return read_folder(options, source="imagenet")
    return read_hub(IMAGENET_HUB, "image", "label", options, test_split="validation")


def check_imagenet(options: ReadOptions) -> None:
    if options.data_dir is not None:
        check_image_folder(options)
        return
    check_hub_access(IMAGENET_HUB, options, f"{options.image_column or 'image'}:validation")


# ---------------------------------------------------------------------------------------------------- columns


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


def choose_splits(dd: datasets.DatasetDict, origin: str, image_column: str | None, label_column: str | None,
                  test_split: str | None = None) -> tuple[dict[str, str], str, str]:  # fmt: skip
    """({"train": "train", "test": its test split}, image column, test origin) of a hub DatasetDict.

    The test split: ``test_split`` if given, else ``test``, else ``validation``; a split whose labels are all
    negative (unlabelled, as ImageNet's hub ``test``) is passed over.
    """
    if "train" not in dd:
        raise ValueError(f"{origin} has no 'train' split (splits: {list(dd)})")
    image_column, label_column = _find_columns(dd["train"].features, origin, image_column, label_column)
    candidates = [test_split] if test_split else ["test", "validation"]
    chosen = None
    for name in candidates:
        if name in dd and (len(dd[name]) == 0 or arrow.label_column(dd[name], label_column).max(initial=-1) >= 0):
            chosen = name
            break
    if test_split and chosen is None:
        raise ValueError(f"{origin} has no labelled {test_split!r} split (splits: {list(dd)})")
    splits = {"train": "train", **({"test": chosen} if chosen else {})}
    return splits, image_column, f"official {chosen}" if chosen else "held out"


def from_prepared(prepared: Prepared, image_column: str | None, label_column: str | None,
                  options: ReadOptions) -> SourceData:  # fmt: skip
    """A prepared dataset's train and test splits, their columns and class names."""
    manifest = prepared.manifest
    train = prepared.split("train")
    test = prepared.split("test") if "test" in manifest["splits"] else None
    image_column = manifest.get("image_column") or options.image_column or image_column
    label_column = options.label_column or label_column or manifest.get("label_column")
    data = _with_columns(train, test, manifest["origin"], image_column, label_column, manifest["test_origin"])
    data.prepared = prepared
    return data


def from_dataset_dict(
    dd: datasets.DatasetDict, origin: str, image_column: str | None, label_column: str | None, options: ReadOptions
) -> SourceData:
    """The train split and the test (else validation) split of ``dd``, their columns and class names."""
    splits, _, test_origin = choose_splits(dd, origin, options.image_column or image_column,
                                           options.label_column or label_column)  # fmt: skip
    test = dd[splits["test"]] if "test" in splits else None
    return _with_columns(dd["train"], test, origin, options.image_column or image_column,
                         options.label_column or label_column, test_origin)  # fmt: skip


def _with_columns(train: datasets.Dataset, test: datasets.Dataset | None, origin: str, image_column: str | None,
                  label_column: str | None, test_origin: str) -> SourceData:  # fmt: skip
    image_column, label_column = _find_columns(train.features, origin, image_column, label_column)
    label_feature = train.features[label_column]
    if isinstance(label_feature, datasets.ClassLabel):
        class_names = list(label_feature.names)
    elif isinstance(label_feature, datasets.Value) and label_feature.dtype.startswith(("int", "uint")):
        top = max(int(arrow.label_column(d, label_column).max(initial=0)) for d in (train, test) if d is not None)
        class_names = [str(i) for i in range(top + 1)]
    else:
        raise ValueError(f"{origin}: label column {label_column!r} is {label_feature}, not integer class labels")
    return SourceData(train, test, image_column, label_column, class_names, origin, test_origin)



# ---------------------------------------------------------------------------------------------------- checks


def check_image_folder(options: ReadOptions) -> None:
    """``folder`` needs ``data_dir``: an existing directory with at least one image below it (not looked for
    when the folder is prepared already: a warm start lists nothing under ``data_dir``)."""
    data_dir = options.data_dir
    if data_dir is None:
        raise ValueError("source='folder' needs data_dir=<directory with one sub-folder of images per class>")
    path = Path(data_dir).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(
            f"data_dir {str(path)!r} does not exist or is not a directory: source='folder' needs a directory "
            "with one sub-folder of images per class (optionally under train/ and test/)"
        )
    if read_index(options.cache_root, f"folder:{path.resolve()}") is not None:
        return
    if has_image(path):  # stops at the first folder holding an image; follows symlinked folders
        return
    raise FileNotFoundError(
        f"no images ({', '.join(IMAGE_EXTENSIONS)}) found under data_dir {str(path)!r}: source='folder' needs "
        "one sub-folder of images per class, e.g. <data_dir>/cat/0001.png"
    )


def check_fashion_dir(options: ReadOptions) -> None:
    """``fashion_mnist``: a given ``data_dir`` must exist (unset: the default places are searched)."""
    data_dir = options.data_dir
    if data_dir is not None and not Path(data_dir).expanduser().is_dir():
        raise FileNotFoundError(
            f"data_dir={data_dir!r} does not exist: point it at the directory holding the Fashion-MNIST idx "
            "files, or leave it unset to search $DATA_DIR and /usr/share/datasets/fashion-mnist"
        )


# ---------------------------------------------------------------------------------------------------- registry


def hub_source(name: str, image_column: str | None = None, label_column: str | None = None) -> Source:
    """A hub dataset ``owner/name`` as a source (columns None: found from its features)."""
    check = partial(_check_hub, name, image_column)
    return Source(partial(read_hub, name, image_column, label_column), check)


def _check_hub(name: str, image_column: str | None, options: ReadOptions) -> None:
    check_hub_access(name, options, f"{options.image_column or image_column}:None")


SOURCES: Mapping[str, Source] = MappingProxyType({
    "digits": Source(read_digits_source),
    "fashion_mnist": Source(read_fashion_mnist, check_fashion_dir),
    "cifar10": hub_source("uoft-cs/cifar10", "img", "label"),
    "cifar100": hub_source("uoft-cs/cifar100", "img", "fine_label"),
    "folder": Source(read_folder, check_image_folder),
    "imagenet": Source(read_imagenet, check_imagenet),
})  # fmt: skip
"""The named sources; any other name containing a ``/`` is a hub dataset (see ``resolve_source``)."""


def resolve_source(name: str) -> Source:
    """The source called ``name``: a named one, or the hub dataset ``owner/name``; else a ValueError."""
    if name in SOURCES:
        return SOURCES[name]
    if "/" in name:
        return hub_source(name)
    raise ValueError(f"unknown source {name!r}: use one of {', '.join(SOURCES)}, or a hub dataset name 'owner/name'")

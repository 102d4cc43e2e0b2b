"""Image-classification data for the ViT ablations: one LightningDataModule for every source.

``datamodules.images.ImageDataModule(source=...)`` is what the configs name (``class_path``). Sources:
``digits`` (scikit-learn 8x8, no network), ``fashion_mnist`` (local idx files, else the hub), ``cifar10`` /
``cifar100`` and any hub dataset ``owner/name`` (Hugging Face ``datasets``), ``folder`` (a local image folder),
``imagenet`` (ImageNet-1k from a folder, or the gated hub dataset); see ``sources``.

Data path, one module per stage:

- ``sources``: the registry of sources (name -> how to check its settings and read it) and the readers that
  give each source's train and optional test split as ``datasets``;
- ``readers``: the raw files we parse ourselves (Fashion-MNIST's idx files, sklearn's digits) into arrays;
- ``hub``: hub access that fails within seconds offline, with a message saying how to get the data;
- ``cache``: raw files converted once into a ``datasets.DatasetDict`` under
  ``<cache root>/attention-repro/<source>-<key>`` (keyed by the files' names, sizes and mtimes; written
  atomically); ``arrow``: uint8 arrays to and from ``datasets``/Arrow without per-row Python;
- ``listing`` and ``prepared``: a folder walked once (fingerprint of every file, stamp of its directories) and
  prepared once, in parallel, into memory-mapped Arrow files of the ENCODED images under
  ``<cache root>/attention-repro/prepared/``; hub datasets verified once and referenced; a warm open makes no
  per-file filesystem call;
- ``decode`` and ``pools``: encoded images decoded (torchvision's libjpeg-turbo, or Pillow) to uint8; data that
  fits in ``max_in_memory_bytes`` held as one uint8 tensor (N, C, H, W) (``in_memory``: auto, true, false),
  larger data decoded per sample in the loader workers;
- ``splits``: the test hold-out (when the source has no test split), the stratified train/val split and the
  class-balanced, nested ``train_samples`` subset, all from ``split_seed`` alone (never the training seed);
  the channel statistics;
- ``augment``: the batched random crop + flip (``CropFlip``) and the optional per-image policy;
  ``transforms``: the ImageNet recipe (RandomResizedCrop + flip, timm policies, random erasing, Mixup/CutMix,
  resize + centre-crop evaluation);
- ``torch_datasets``: what the loaders index: whole batches at once (``__getitems__``) in memory, conversion
  to float and normalisation batched;
- ``device_loader``: with ``on_device=True``, the loaders over images held on the training device (a GPU),
  each batch indexed, cropped, flipped and normalised there with the ordinary loader's order and draws;
- ``module``: ``ImageDataModule``, from the settings to the loaders.
"""

from datamodules.images.augment import AUGMENTS, Augment, Augmentation, CropFlip, build_augment
from datamodules.images.decode import DECODERS, IMAGE_MODES, BadImageError, ImageMode
from datamodules.images.hub import HubDatasetUnavailableError
from datamodules.images.module import ImageDataModule
from datamodules.images.prepared import Prepared, list_prepared, open_prepared
from datamodules.images.sources import FASHION_MNIST_DEBIAN_DIR, SOURCES, GatedDatasetError, Source, resolve_source
from datamodules.images.splits import balanced_subset, channel_stats, stratified_split
from datamodules.images.torch_datasets import InMemoryImages, LazyImages

__all__ = [
    "AUGMENTS",
    "DECODERS",
    "FASHION_MNIST_DEBIAN_DIR",
    "IMAGE_MODES",
    "SOURCES",
    "Augment",
    "Augmentation",
    "BadImageError",
    "CropFlip",
    "GatedDatasetError",
    "HubDatasetUnavailableError",
    "ImageDataModule",
    "ImageMode",
    "InMemoryImages",
    "LazyImages",
    "Prepared",
    "Source",
    "balanced_subset",
    "build_augment",
    "channel_stats",
    "list_prepared",
    "open_prepared",
    "resolve_source",
    "stratified_split",
]

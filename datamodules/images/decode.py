"""Decoding hub and folder images (PIL) into uint8 (C, H, W) tensors, one mode and one size for all."""

from __future__ import annotations

from typing import Any, Literal, get_args

import datasets
import numpy as np
import pyarrow as pa
import torch
from torchvision.transforms.v2 import functional as TF

from datamodules.images.arrow import array_table, image_features

ImageMode = Literal["L", "RGB"]
"""What decoded images are converted to: ``L`` (1 channel) or ``RGB`` (3 channels)."""
IMAGE_MODES: tuple[str, ...] = get_args(ImageMode)
GRAYSCALE_MODES = frozenset({"1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "I;16N", "F"})
"""PIL modes of one-channel images: a dataset whose images are all in these is decoded as ``L``."""


def channels(mode: str) -> int:
    """The channel count of decoded images in ``mode`` (``L``: 1, ``RGB``: 3)."""
    if mode not in IMAGE_MODES:
        raise ValueError(f"unknown image_mode {mode!r}: use one of {', '.join(IMAGE_MODES)}, or None")
    return 1 if mode == "L" else 3


def decode_image(image: Any, mode: str, size: int | None) -> torch.Tensor:
    """A decoded image (PIL) as uint8 (C, H, W) in ``mode``, resized to ``size`` x ``size`` if given."""
    if image.mode != mode:
        image = image.convert(mode)
    x = TF.pil_to_tensor(image)
    if size is not None and tuple(x.shape[-2:]) != (size, size):
        x = TF.resize(x, [size, size], antialias=True)
    return x


def decode_batch(
    images: list[Any],
    labels: list[int],
    mode: str,
    size: int | None,
    shape: tuple[int, int, int],
    cache_format: str = "",
) -> pa.Table:
    """``Dataset.map`` function: decode a batch of images into an Array3D(uint8) table.

    ``cache_format`` is unused: passed by the caller, it is part of the map's cache fingerprint.
    """
    arrays = []
    for image in images:
        x = decode_image(image, mode, size)
        if tuple(x.shape) != shape:
            raise ValueError(
                f"an image has shape {tuple(x.shape)} (C, H, W), others {shape}: the images differ in size; "
                "set image_size to resize them all to one size"
            )
        arrays.append(x.numpy())
    stacked = np.stack(arrays) if arrays else np.zeros((0, *shape), dtype=np.uint8)
    return array_table(stacked, np.asarray(labels, dtype=np.int64), decoded_features(shape))


def decoded_features(shape: tuple[int, int, int]) -> datasets.Features:
    """The features ``decode_batch`` writes: ``image`` Array3D(uint8) of ``shape``, ``label`` int64."""
    return image_features(shape, datasets.Value("int64"))


def probe_images(
    splits: list[datasets.Dataset], image_column: str, origin: str, image_mode: str | None, image_size: int | None
) -> tuple[str, tuple[int, int]]:
    """Image mode (``L``/``RGB``) and native (H, W) from up to 16 images spread over the splits."""
    modes, sizes = set(), set()
    for d in splits:
        column = d.select_columns([image_column])
        for i in sorted({int(i) for i in np.linspace(0, len(d) - 1, num=min(8, len(d)))}):
            image = column[i][image_column]
            modes.add(image.mode)
            sizes.add((image.height, image.width))
    if not sizes:
        raise ValueError(f"{origin}: the dataset holds no images")
    mode = image_mode or ("L" if modes <= GRAYSCALE_MODES else "RGB")
    if len(sizes) > 1 and image_size is None:
        raise ValueError(
            f"{origin}: the images differ in size (e.g. {sorted(sizes)[:4]} as (H, W)); set image_size to "
            "resize them all to one size"
        )
    return mode, next(iter(sizes))

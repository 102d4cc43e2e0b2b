"""From a source's ``datasets`` to pools of uint8 images the splits index into: in memory, or lazy.

A converted array source (an ``Array3D`` image column) is always read into one uint8 tensor (N, C, H, W).
Hub and folder images are probed for one mode and size, then, if all splits fit in
``max_in_memory_bytes``, decoded once with a cached ``Dataset.map`` into an ``Array3D`` dataset and read into
a tensor; larger ones stay a ``datasets.Dataset`` decoded per sample (``LazyImages``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import datasets
import numpy as np
import torch
from torch.utils.data import Dataset
from torchvision.transforms.v2 import functional as TF

from datamodules.images.arrow import array_column, label_column
from datamodules.images.cache import CACHE_FORMAT
from datamodules.images.decode import channels, decode_batch, decoded_features, probe_images
from datamodules.images.sources import SourceData
from datamodules.images.splits import STATS_STREAM, channel_stats, split_rng
from datamodules.images.torch_datasets import InMemoryImages, LazyImages

STATS_SAMPLE = 1024
"""Lazily decoded pools compute the normalisation from a seeded sample of this many training images."""


@dataclass
class Pool:
    """The rows one or more splits index into: in memory (``images``) or lazily decoded (``hf``)."""

    labels: np.ndarray
    images: torch.Tensor | None = None
    hf: datasets.Dataset | None = None


@dataclass
class Pools:
    """A source's train pool and optional test pool, and how their images are served."""

    train: Pool | None
    test: Pool | None
    image_column: str
    mode: str | None  # decode mode of hub/folder images; None for array sources
    image_size: int | None
    input_shape: tuple[int, int, int] | None
    in_memory: bool

    def dataset(
        self,
        pool: Pool,
        rows: np.ndarray,
        mean: list[float],
        std: list[float],
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> Dataset:
        """The split ``pool[rows]``, normalised with ``mean``/``std``, with ``transform`` on the uint8 images."""
        if pool.images is not None:
            return InMemoryImages(pool.images, torch.from_numpy(pool.labels), rows, mean, std, transform)
        return LazyImages(pool.hf, self.image_column, pool.labels, rows, self.mode, self.image_size,
                          self.input_shape, mean, std, transform)  # fmt: skip

    def stats(self, pool: Pool, rows: np.ndarray, split_seed: int) -> tuple[list[float], list[float]]:
        """Per-channel mean and std of ``pool[rows]`` (of a seeded sample of them for a lazy pool)."""
        if pool.images is not None:
            return channel_stats(pool.images, torch.as_tensor(rows))
        sample = rows
        if len(rows) > STATS_SAMPLE:
            sample = np.sort(split_rng(split_seed, STATS_STREAM).choice(rows, size=STATS_SAMPLE, replace=False))
        c = self.input_shape[0]
        lazy = self.dataset(pool, sample, mean=[0.0] * c, std=[1.0] * c)
        images = (
            torch.stack([lazy.decode(i) for i in range(len(lazy))])
            if len(lazy)
            else torch.zeros((0, *self.input_shape), dtype=torch.uint8)
        )
        return channel_stats(images, torch.arange(len(images)))


def load_pools(
    data: SourceData, *, image_size: int | None, image_mode: str | None, max_in_memory_bytes: int, keep: bool = True
) -> Pools:
    """The pools of ``data``; ``keep=False`` only fills the caches (decodes) and leaves the pools None."""
    splits = [d for d in (data.train, data.test) if d is not None]
    if isinstance(data.train.features[data.image_column], datasets.Array3D):  # our converted caches
        pools = [_array_pool(d, data, image_size) for d in splits] if keep else None
        shape = tuple(int(s) for s in pools[0].images.shape[1:]) if pools else None
        return _assemble(data, pools, mode=None, image_size=image_size, input_shape=shape, in_memory=True)

    mode, native_size = probe_images(splits, data.image_column, data.origin, image_mode, image_size)
    height, width = (image_size, image_size) if image_size else native_size
    shape = (channels(mode), height, width)
    in_memory = sum(len(d) for d in splits) * math.prod(shape) <= max_in_memory_bytes
    pools = []
    for d in splits:
        if in_memory:
            decoded = _decode(d, data, mode, image_size, shape)  # fills the cache even when not kept
            pools.append(Pool(label_column(d, data.label_column), images=_tensor(decoded, "image")) if keep else None)
        else:
            pools.append(Pool(label_column(d, data.label_column), hf=d) if keep else None)
    return _assemble(data, pools if keep else None, mode=mode, image_size=image_size, input_shape=shape,
                     in_memory=in_memory)  # fmt: skip


def _assemble(data: SourceData, pools: list[Pool] | None, **settings) -> Pools:
    train, test = (pools[0], pools[1] if len(pools) > 1 else None) if pools else (None, None)
    return Pools(train=train, test=test, image_column=data.image_column, **settings)


def _tensor(ds: datasets.Dataset, column: str) -> torch.Tensor:
    return torch.from_numpy(array_column(ds, column))


def _array_pool(ds: datasets.Dataset, data: SourceData, image_size: int | None) -> Pool:
    """An array source's split as a pool, resized to ``image_size`` if given."""
    images = _tensor(ds, data.image_column)
    if image_size is not None and tuple(images.shape[-2:]) != (image_size, image_size):
        size = [image_size, image_size]
        images = torch.cat(
            [TF.resize(images[i : i + 4096], size, antialias=True) for i in range(0, len(images), 4096)]
        ) if len(images) else images.new_zeros((0, images.shape[1], *size))  # fmt: skip
    return Pool(labels=label_column(ds, data.label_column), images=images)


def _decode(d: datasets.Dataset, data: SourceData, mode: str, size: int | None, shape) -> datasets.Dataset:
    """``d``'s images decoded to an Array3D(uint8) dataset, cached next to ``d``'s files.

    ``datasets`` fingerprints the result from ``d``'s fingerprint and the map's arguments; ``cache_format``
    among them makes a bump of ``CACHE_FORMAT`` decode again.
    """
    fn_kwargs = {"mode": mode, "size": size, "shape": shape, "cache_format": CACHE_FORMAT}
    return d.map(
        decode_batch,
        batched=True,
        batch_size=1000,
        input_columns=[data.image_column, data.label_column],
        remove_columns=d.column_names,
        fn_kwargs=fn_kwargs,
        features=decoded_features(shape),
        desc="Decoding images to uint8 arrays",
    )

"""From a source's ``datasets`` to pools of images the splits index into: a uint8 tensor in memory, or encoded.

Array sources (digits, Fashion-MNIST: an ``Array3D`` column) are read into one uint8 tensor (N, C, H, W).
Encoded images (folders, hub datasets: a prepared dataset) are held in memory only where that is the fast path
and fits (``in_memory``):

- ``auto``: in memory when the uint8 pixels of all splits fit in ``max_in_memory_bytes`` and can be stored at
  one size (the images have one size, or ``image_size`` resizes them and the recipe does not need each image at
  its native size, as RandomResizedCrop and the centre crop do); decoded once, in parallel, into
  ``<prepared>/decoded-<mode>-<H>x<W>/`` and read back in a fraction of a second on later runs;
- ``true``: in memory whenever they can be stored at one size (an error says why not);
- ``false``: decoded per sample in the loader workers (``LazyImages``).

``Pools.reason`` is the one line the DataModule prints about the choice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import datasets
import numpy as np
import torch
from torch.utils.data import Dataset
from torchvision.transforms.v2 import functional as TF

from datamodules.images import arrow
from datamodules.images.arrow import array_column, label_column
from datamodules.images.decode import GRAYSCALE_MODES, channels, decode_bytes, image_bytes
from datamodules.images.prepared import Prepared
from datamodules.images.shard_pool import default_workers, run_tasks
from datamodules.images.sources import SourceData
from datamodules.images.splits import STATS_STREAM, channel_stats, split_rng
from datamodules.images.torch_datasets import InMemoryImages, LazyImages
from datamodules.images.workspace import human_bytes, owned_directory

InMemory = Literal["auto", True, False]
"""``auto`` (in memory where it fits), ``true`` or ``false`` (decoded per sample in the loader workers)."""
STATS_SAMPLE = 1024
"""Lazily decoded pools compute the normalisation from a seeded sample of this many training images."""
DECODE_TASK_ROWS = 2048


@dataclass
class Pool:
    """The rows one or more splits index into: in memory (``images``) or encoded (``hf``)."""

    labels: np.ndarray
    images: torch.Tensor | None = None
    hf: datasets.Dataset | None = None


@dataclass
class Pools:
    """A source's train pool and optional test pool, and how their images are served."""

    train: Pool | None
    test: Pool | None
    image_column: str
    mode: str | None  # decode mode of encoded images; None for array sources
    image_size: int | None
    input_shape: tuple[int, int, int] | None
    in_memory: bool
    reason: str = ""
    stored_shape: tuple[int, int, int] | None = None  # shape of the in-memory images (native or input_shape)
    decoder: str = "torchvision"
    root: str | None = None  # folder the images' relative paths start from (when bytes are not stored)

    def dataset(self, pool: Pool, rows: np.ndarray, mean: list[float], std: list[float], transform=None,
                erase=None, mix=None) -> Dataset:  # fmt: skip
        """The split ``pool[rows]``, ``transform`` on the uint8 images, normalised, ``erase`` and ``mix`` after."""
        if pool.images is not None:
            return InMemoryImages(pool.images, torch.from_numpy(pool.labels), rows, mean, std, transform, erase, mix)
        return LazyImages(pool.hf, self.image_column, pool.labels, rows, self.mode, self.input_shape, mean, std,
                          transform, self.decoder, erase, mix, self.root)  # fmt: skip

    def stats(self, pool: Pool, rows: np.ndarray, split_seed: int, transform=None) -> tuple[list[float], list[float]]:
        """Per-channel mean and std of ``pool[rows]`` (of a seeded sample of them for a lazy pool)."""
        if pool.images is not None and transform is None:
            return channel_stats(pool.images, torch.as_tensor(rows))
        sample = rows
        if len(rows) > STATS_SAMPLE:
            sample = np.sort(split_rng(split_seed, STATS_STREAM).choice(rows, size=STATS_SAMPLE, replace=False))
        c = self.input_shape[0]
        if pool.images is not None:
            images = [transform(pool.images[int(j)]) for j in sample]
        else:
            lazy = self.dataset(pool, sample, mean=[0.0] * c, std=[1.0] * c, transform=transform)
            images = [lazy.decode(i) for i in range(len(lazy))]
        stacked = torch.stack(images) if images else torch.zeros((0, *self.input_shape), dtype=torch.uint8)
        return channel_stats(stacked, torch.arange(len(stacked)))


def load_pools(data: SourceData, *, image_size: int | None, image_mode: str | None, max_in_memory_bytes: int,
               in_memory: InMemory = "auto", native_needed: bool = False, decoder: str = "torchvision",
               workers: int | None = None, keep: bool = True) -> Pools:  # fmt: skip
    """The pools of ``data``; ``keep=False`` only fills the caches (decodes) and leaves the pools None.

    ``native_needed``: the recipe crops each image at its native size (RandomResizedCrop, centre crop), so
    images held in memory are kept at their native size, which must be one size for all.
    """
    splits = [d for d in (data.train, data.test) if d is not None]
    if isinstance(data.train.features[data.image_column], datasets.Array3D):  # digits, Fashion-MNIST
        pools = [_array_pool(d, data, image_size) for d in splits] if keep else None
        shape = tuple(int(s) for s in pools[0].images.shape[1:]) if pools else None
        n = sum(len(d) for d in splits)
        reason = (f"in memory: {data.origin} is stored as uint8 arrays ({n:,} images"
                  + (f" x {shape} = {human_bytes(n * math.prod(shape))})" if shape else ")"))  # fmt: skip
        return _assemble(data, pools, mode=None, image_size=image_size, input_shape=shape, in_memory=True,
                         reason=reason, stored_shape=shape)  # fmt: skip
    if data.prepared is None:
        raise ValueError(f"{data.origin}: encoded images need a prepared dataset")
    images = data.prepared.manifest.get("images", {})
    modes = set(images.get("modes", {}))
    mode = image_mode or ("L" if modes and modes <= GRAYSCALE_MODES else "RGB")
    (h_lo, h_hi), (w_lo, w_hi) = images.get("height", [None, None]), images.get("width", [None, None])
    uniform = h_lo is not None and h_lo == h_hi and w_lo == w_hi
    if image_size is None and not uniform:
        raise ValueError(
            f"{data.origin}: the images differ in size (height {h_lo}..{h_hi}, width {w_lo}..{w_hi} px); set "
            "image_size to resize them all to one size"
        )
    c = channels(mode)
    input_shape = (c, image_size, image_size) if image_size else (c, h_lo, w_lo)
    n = sum(len(d) for d in splits)
    if native_needed:
        stored = (c, h_lo, w_lo) if uniform else None
        why_not = ("the recipe crops each image at its native size (random_resized_crop / eval_crop_fraction) "
                   "and the images differ in size")
    else:
        stored, why_not = input_shape, ""
    nbytes = n * math.prod(stored) if stored else None
    size_text = f"{n:,} images x {stored} uint8 = {human_bytes(nbytes)}" if stored else f"{n:,} images"
    if in_memory is True or in_memory == "true":
        if stored is None:
            raise ValueError(f"in_memory=true: {data.origin} cannot be held in memory at one size: {why_not}")
        held, reason = True, f"in memory: {size_text} (in_memory=true)"
    elif in_memory is False or in_memory == "false":
        held, reason = False, f"decoded per sample in the loader workers: {size_text} (in_memory=false)"
    elif stored is None:
        held, reason = False, f"decoded per sample in the loader workers: {size_text}; {why_not} (in_memory=auto)"
    elif nbytes <= max_in_memory_bytes:
        held = True
        reason = f"in memory: {size_text} <= max_in_memory_bytes {human_bytes(max_in_memory_bytes)} (in_memory=auto)"
    else:
        held = False
        reason = (f"decoded per sample in the loader workers: {size_text} > max_in_memory_bytes "
                  f"{human_bytes(max_in_memory_bytes)} (in_memory=auto)")  # fmt: skip
    pools: list[Pool | None] = []
    if held:
        decoded = decoded_arrays(data.prepared, data, mode, stored, decoder, workers)
        for name, d in zip(("train", "test"), splits, strict=False):
            # labels from the prepared split (the label column is chosen at open time), pixels from the cache
            pools.append(Pool(label_column(d, data.label_column), images=_tensor(decoded[name], "image"))
                         if keep else None)  # fmt: skip
    else:
        pools = [Pool(label_column(d, data.label_column), hf=d) if keep else None for d in splits]
    root = data.prepared.manifest["origin"] if data.prepared.manifest.get("kind") == "folder" else None
    return _assemble(data, pools if keep else None, mode=mode, image_size=image_size, input_shape=input_shape,
                     in_memory=held, reason=reason, stored_shape=stored if held else None, decoder=decoder,
                     root=root)  # fmt: skip


def _assemble(data: SourceData, pools: list[Pool] | None, **settings: Any) -> Pools:
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


# ------------------------------------------------------------------------------------------------ decoding


def _decode_rows(task: dict[str, Any]) -> dict[str, Any]:
    """Decode rows [start, stop) of a split into one uint8 array (runs in a pool worker)."""
    ds, (c, h, w) = task["dataset"], task["shape"]
    values = ds[task["start"] : task["stop"]][task["column"]]
    out = np.empty((len(values), c, h, w), dtype=np.uint8)
    for k, value in enumerate(values):
        x = decode_bytes(image_bytes(value, task["root"]), task["mode"], task["decoder"])
        if tuple(x.shape[-2:]) != (h, w):
            x = TF.resize(x, [h, w], antialias=True)
        out[k] = x.numpy()
    return {"images": out}


def decoded_arrays(prepared: Prepared, data: SourceData, mode: str, shape: tuple[int, int, int], decoder: str,
                   workers: int | None) -> dict[str, datasets.Dataset]:  # fmt: skip
    """The splits of ``data`` decoded to ``shape`` uint8 arrays, cached in the prepared directory (written once,
    in parallel, atomically)."""
    c, h, w = shape
    final = prepared.path / f"decoded-{mode}-{h}x{w}"
    names = [name for name, d in (("train", data.train), ("test", data.test)) if d is not None]
    if not (final / "dataset_dict.json").is_file():
        workers = workers or default_workers()
        root = prepared.manifest["origin"] if prepared.manifest.get("kind") == "folder" else None
        tasks, owners = [], []
        for name, d in (("train", data.train), ("test", data.test)):
            if d is None:
                continue
            raw = d.select_columns([data.image_column]).cast_column(data.image_column, datasets.Image(decode=False))
            for lo in range(0, len(raw), DECODE_TASK_ROWS):
                tasks.append({"dataset": raw, "start": lo, "stop": min(len(raw), lo + DECODE_TASK_ROWS),
                              "column": data.image_column, "shape": shape, "mode": mode, "decoder": decoder,
                              "root": root})  # fmt: skip
                owners.append(name)
        results = run_tasks(_decode_rows, tasks, [t["stop"] - t["start"] for t in tasks],
                            f"Decoding {prepared.path.name} to {mode} {h}x{w}", "img", workers)  # fmt: skip
        splits = {}
        for name, d in (("train", data.train), ("test", data.test)):
            if d is None:
                continue
            parts = [r["images"] for o, r in zip(owners, results, strict=True) if o == name]
            images = np.concatenate(parts) if parts else np.zeros((0, *shape), dtype=np.uint8)
            features = arrow.image_features(shape, datasets.Value("int64"))
            table = arrow.array_table(images, label_column(d, data.label_column), features)
            splits[name] = datasets.Dataset(table)
        with owned_directory(final, complete=lambda p: (p / "dataset_dict.json").is_file()) as tmp:
            datasets.DatasetDict(splits).save_to_disk(str(tmp))
    loaded = datasets.load_from_disk(str(final))
    return {name: loaded[name] for name in names}

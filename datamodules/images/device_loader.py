"""Loaders of images held on the training device: batches indexed, augmented and normalised there.

With ``ImageDataModule(on_device=True)`` the decoded uint8 images (CIFAR-10's 50,000 are 154 MB) are copied
once to the device the run trains on, and each batch is one index of that tensor, the batched random crop +
flip (``datamodules.images.augment.CropFlip``) and the normalisation, all on the device: no loader workers,
no collation, no host-to-device copy of pixels. On a GPU that takes the loader off the CPU, which small
models at 32 px otherwise wait on; on a CPU it is the same code (the tests run it there).

Order and augmentation are those of the ordinary loader, draw for draw: the training order is the
``ResumableSampler``'s (a function of seed and epoch; the position in the epoch is saved in every checkpoint
by ``ResumableLoader``), and each batch's crops and flips are drawn on the CPU from the seed of its rows
(``torch_datasets.batch_seed``), then gathered on the device. A run resumed mid-epoch therefore trains on the
batches of the uninterrupted run, as with the ordinary loader.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader

from datamodules.sampler import ResumableLoader


def _device_batches(loader: DataLoader) -> Iterator[Any]:
    """One pass over ``loader``'s batch sampler, each batch built by its dataset's ``batch`` (an
    ``InMemoryImages`` on the device) as (images, targets)."""
    dataset = loader.dataset
    for positions in loader.batch_sampler:
        yield dataset.batch(positions)


class DeviceLoader(DataLoader):
    """An evaluation loader over an on-device ``InMemoryImages``: the batches of its sampler (sequential, or
    the ``DistributedSampler`` Lightning puts in under DDP), each built on the device in one call. Give it
    ``num_workers=0``: the work is a few kernels on the device."""

    def __iter__(self) -> Iterator[Any]:
        return _device_batches(self)


class ResumableDeviceLoader(ResumableLoader):
    """The training loader over an on-device ``InMemoryImages``: ``ResumableLoader``'s order, position and
    resume, each batch built on the device in one call."""

    def _batches(self) -> Iterator[Any]:
        return _device_batches(self)

"""The torch datasets served to the loaders: an in-memory uint8 tensor, or encoded images decoded per sample.

Both turn uint8 pixels into normalised float32 (``(x / 255 - mean) / std`` as one multiply-subtract) after
the per-image transform (training augmentation, or evaluation geometry), then apply the optional random
erasing per image and the label mixing per batch (soft (B, K) targets). ``__getitems__`` serves a whole batch
at once: in memory without a transform one tensor index, with ``Augment`` one batched call; encoded images
are decoded one by one (in the DataLoader workers). A batch's random draws are a function of (run seed, the
batch's rows) only (``seeded``), so a resumed run augments exactly as an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import copy
import random
from collections.abc import Callable, Iterator, Sequence

import datasets
import numpy as np
import torch
from torch.utils.data import Dataset

from datamodules.images.decode import decode_bytes, image_bytes
from datamodules.sampler import run_seed

Mix = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


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


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Seed torch's, Python's and numpy's global generators (timm's transforms draw from all three) for the
    block, restoring their states afterwards."""
    py_state, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed % 2**32)
        try:
            yield
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)


def batch_seed(rows: Sequence[int]) -> int:
    """The seed of a batch: a function of the run seed and the batch's rows."""
    return hash((run_seed(), tuple(int(r) for r in rows))) & 0x7FFF_FFFF_FFFF_FFFF


def _erase_mix(x: torch.Tensor, labels: torch.Tensor, erase: Callable | None,
               mix: Mix | None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Random erasing per image, then mixing per batch."""
    if erase is not None:
        x = torch.stack([erase(image) for image in x.unbind(0)]) if len(x) else x
    if mix is not None:
        x, labels = mix(x, labels)
    return x, labels


def _pairs(x: torch.Tensor, labels: torch.Tensor) -> list[tuple]:
    """The (image, target) pairs of a batch, for the DataLoader's collation."""
    return list(zip(x.unbind(0), labels.unbind(0), strict=True))


def _finish(x: torch.Tensor, labels: torch.Tensor, erase: Callable | None, mix: Mix | None) -> list[tuple]:
    """Random erasing per image, mixing per batch, then the (image, target) pairs of the batch."""
    return _pairs(*_erase_mix(x, labels, erase, mix))


def _normaliser(mean: Sequence[float], std: Sequence[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, shift) such that ``uint8 * scale - shift == (uint8 / 255 - mean) / std``, shaped (C, 1, 1)."""
    m = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)
    return 1.0 / (255.0 * s), m / s


class InMemoryImages(Dataset):
    """A split of an in-memory uint8 image tensor: ``images[indices]`` with per-sample augmentation.

    ``images`` (N, C, H, W) uint8 and ``labels`` (N,) int64 are shared between the splits drawn from the same
    pool; ``indices`` picks this split's rows. Items are ``(float image (C, H, W), int64 label)``, or with
    ``mix`` a (K,) float target; ``__getitems__`` builds a whole batch at once (one index op without a transform),
    ``batch`` the same batch as two tensors. ``to(device)`` holds the pixels and labels on a device (a GPU):
    its batches are then indexed, augmented and normalised there, with the same random draws (CPU, per batch).
    """

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        indices: np.ndarray | torch.Tensor,
        mean: Sequence[float],
        std: Sequence[float],
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
        erase: Callable[[torch.Tensor], torch.Tensor] | None = None,
        mix: Mix | None = None,
    ) -> None:
        self.images = images
        self.labels = labels
        self.indices = torch.as_tensor(np.asarray(indices), dtype=torch.long)
        self.transform = transform
        self.erase, self.mix = erase, mix
        self.scale, self.shift = _normaliser(mean, std)

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def targets(self) -> torch.Tensor:
        """The split's labels, on the CPU (also when the images are held on a device)."""
        return self.labels[self.indices.to(self.labels.device)].cpu()

    def _normalise(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.float32).mul_(self.scale).sub_(self.shift)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        with _one_thread():
            j = self.indices[i]
            x = self.images[j]
            if self.transform is not None:
                x = self.transform(x)
            x = self._normalise(x)
            if self.erase is not None:
                x = self.erase(x)
            return x, self.labels[j]

    def __getitems__(self, batch: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return _pairs(*self.batch(batch))

    def batch(self, positions: Sequence[int] | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Items ``positions`` of the split as one batch: (float images (B, C, H, W), targets), on the device
        the images are held on."""
        with _one_thread():
            rows = self.indices[torch.as_tensor(positions, dtype=torch.long)]
            at = rows.to(self.images.device, non_blocking=True) if self.images.device.type != "cpu" else rows
            if self.transform is None and self.erase is None and self.mix is None:
                return self._normalise(self.images[at]), self.labels[at]
            # The batch's random augmentation is a function of (run seed, the batch's rows),
            # not of whatever drew from the global generator before: a run resumed from a
            # checkpoint augments its batches exactly as the uninterrupted run, in the main
            # process or in any worker.
            keys = tuple(rows.tolist())
            with seeded(batch_seed(keys)):
                if self.transform is None:
                    x = self.images[at]
                elif hasattr(self.transform, "batch"):
                    x = self.transform.batch(self.images[at])
                else:
                    x = torch.stack([self.transform(self.images[j]) for j in keys])
                return _erase_mix(self._normalise(x), self.labels[at], self.erase, self.mix)

    def to(self, device: torch.device | str, moved: dict[int, torch.Tensor] | None = None) -> InMemoryImages:
        """This split with its pixels, labels and normalisation on ``device`` (the row indices stay on the CPU,
        where the batches' random draws are made). ``moved`` (id of a tensor -> its copy on the device) lets
        the splits of one pool share one copy."""
        moved = {} if moved is None else moved

        def on(t: torch.Tensor) -> torch.Tensor:
            if id(t) not in moved:
                moved[id(t)] = t.to(device)
            return moved[id(t)]

        out = copy.copy(self)
        out.images, out.labels = on(self.images), on(self.labels)
        out.scale, out.shift = self.scale.to(device), self.shift.to(device)
        return out


class LazyImages(Dataset):
    """A split of encoded images (a prepared ``datasets.Dataset``), decoded per sample in the loader workers.

    Each item: the image's bytes (memory-mapped Arrow), decoded by ``decoder`` into uint8 (C, H, W) in ``mode``,
    ``transform`` (training augmentation or evaluation geometry) to ``input_shape``, normalised, then ``erase``;
    ``__getitems__`` serves a batch and applies ``mix`` to it.
    """

    def __init__(
        self,
        hf_dataset: datasets.Dataset,
        image_column: str,
        labels: np.ndarray,
        indices: np.ndarray,
        mode: str,
        input_shape: tuple[int, int, int],
        mean: Sequence[float],
        std: Sequence[float],
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
        decoder: str = "torchvision",
        erase: Callable[[torch.Tensor], torch.Tensor] | None = None,
        mix: Mix | None = None,
        root: str | None = None,
    ) -> None:
        self.hf_dataset = hf_dataset.select_columns([image_column]).cast_column(
            image_column, datasets.Image(decode=False)
        )
        self.image_column = image_column
        self.labels = torch.as_tensor(np.asarray(labels), dtype=torch.long)
        self.indices = np.asarray(indices, dtype=np.int64)
        self.mode, self.input_shape, self.decoder = mode, tuple(input_shape), decoder
        self.transform, self.erase, self.mix, self.root = transform, erase, mix, root
        self.scale, self.shift = _normaliser(mean, std)

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def targets(self) -> torch.Tensor:
        return self.labels[torch.as_tensor(self.indices)]

    def _image(self, j: int, value: dict) -> torch.Tensor:
        x = decode_bytes(image_bytes(value, self.root), self.mode, self.decoder)
        if self.transform is not None:
            x = self.transform(x)
        if tuple(x.shape) != self.input_shape:
            where = value.get("path") or f"row {j}"
            raise ValueError(
                f"image {where} has shape {tuple(x.shape)}, expected {self.input_shape}: the images differ in size; "
                "set image_size to resize them all to one size"
            )
        return x

    def decode(self, i: int) -> torch.Tensor:
        """The uint8 (C, H, W) image of item ``i`` after ``transform``, not normalised."""
        j = int(self.indices[i])
        return self._image(j, self.hf_dataset[j][self.image_column])

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        with _one_thread():
            x = self.decode(i).to(torch.float32).mul_(self.scale).sub_(self.shift)
            if self.erase is not None:
                x = self.erase(x)
            return x, self.labels[int(self.indices[i])]

    def __getitems__(self, batch: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        with _one_thread():
            rows = [int(self.indices[i]) for i in batch]
            values = self.hf_dataset[rows][self.image_column]
            labels = self.labels[torch.as_tensor(rows, dtype=torch.long)]
            with seeded(batch_seed(rows)):
                x = torch.stack([self._image(j, v) for j, v in zip(rows, values, strict=True)])
                x = x.to(torch.float32).mul_(self.scale).sub_(self.shift)
                return _finish(x, labels, self.erase, self.mix)

"""The torch datasets served to the loaders: an in-memory uint8 tensor, or a dataset decoded per sample.

Both turn uint8 pixels into normalised float32 (``(x / 255 - mean) / std`` as one multiply-subtract) after
the training augmentation. ``InMemoryImages.__getitems__`` serves a whole batch at once: without
augmentation one tensor index, with it one batched ``Augment`` call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import datasets
import numpy as np
import torch
from torch.utils.data import Dataset

from datamodules.images.decode import decode_image
from datamodules.images.sampler import run_seed


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
                    torch.manual_seed(hash((run_seed(), keys)) & 0x7FFF_FFFF_FFFF_FFFF)
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
        x = decode_image(self.hf_dataset[j][self.image_column], self.mode, self.image_size)
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

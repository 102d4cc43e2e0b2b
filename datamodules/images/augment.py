"""The training augmentation, on uint8 images: a batched random crop + flip, then an optional policy.

``augment=`` names one of ``AUGMENTS``; ``build_augment`` turns the name into an ``Augment`` (or None).
Evaluation data is never augmented.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, get_args

import torch
import torch.nn.functional as F
from torchvision.transforms import v2

Augmentation = Literal["none", "flip", "crop_flip", "randaugment", "autoaugment", "random_resized_crop"]
"""``none``; ``flip`` (horizontal flip only); ``crop_flip`` (random crop with padding size/8 + flip);
``randaugment`` / ``autoaugment`` (crop_flip, then RandAugment / AutoAugment with the CIFAR-10 policy);
``random_resized_crop`` (the ImageNet recipe's RandomResizedCrop + flip, per image:
``datamodules.images.transforms.RandomResizedCropFlip``)."""
AUGMENTS: tuple[str, ...] = get_args(Augmentation)

#: the per-image policy applied after the crop + flip, by augment name
POLICIES: dict[str, Callable[[], v2.Transform]] = {
    "randaugment": v2.RandAugment,
    "autoaugment": lambda: v2.AutoAugment(v2.AutoAugmentPolicy.CIFAR10),
}


class CropFlip:
    """Random crop with zero padding, then a horizontal flip with probability 1/2, per image:
    ``v2.RandomCrop(size, padding=(pad_w, pad_h))`` + ``v2.RandomHorizontalFlip()``, computed for a
    whole uint8 batch (B, C, H, W) at once with one gather (a (C, H, W) image works too).

    Each image gets its own offsets (uniform in [0, 2 pad]) and flip, drawn from the global CPU torch
    generator (the datasets seed it per batch) whatever the device of the batch: a batch held on a
    GPU (``data.on_device``) gets the same crops and flips as the same batch on the CPU, gathered there.

    Why hand-written rather than torchvision's transforms: those take one image per call, and on a
    CPU that per-image loop costs about as much as a small model's training step. One gather for the
    batch measured 12x faster on 28x28 Fashion-MNIST batches (298k against 24k images/s), a few
    percent of a training step; ``repro bench data`` (``reproductions/benchmarks/loaders.py``)
    measures both again.
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
        if batch.device.type != "cpu":  # drawn on the CPU (above), gathered where the batch is
            rows, cols = rows.to(batch.device, non_blocking=True), cols.to(batch.device, non_blocking=True)
        # advanced indices around a slice: the result is (B, H, W, C)
        out = padded[torch.arange(n, device=batch.device)[:, None, None], :, rows[:, :, None], cols[:, None, :]]
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


def build_augment(augment: str, height: int, width: int, interpolation: str = "bilinear",
                  padding: int | None = None) -> Callable | None:  # fmt: skip
    """The training augmentation ``augment`` for uint8 images of ``height`` x ``width`` (None for ``none``);
    ``random_resized_crop`` crops to ``height`` with ``interpolation``; the crops pad by ``padding``
    pixels (None: size/8, at least 1)."""
    if augment not in AUGMENTS:
        raise ValueError(f"unknown augment {augment!r}: use one of {', '.join(AUGMENTS)}")
    if augment == "none":
        return None
    if augment == "random_resized_crop":
        from datamodules.images.transforms import RandomResizedCropFlip

        return RandomResizedCropFlip(height, interpolation=interpolation)
    if augment == "flip":
        pad_h = pad_w = 0
    elif padding is not None:
        pad_h = pad_w = padding
    else:
        pad_h, pad_w = max(1, height // 8), max(1, width // 8)
    policy = POLICIES.get(augment)
    return Augment(CropFlip(height, width, pad_h=pad_h, pad_w=pad_w), policy() if policy is not None else None)

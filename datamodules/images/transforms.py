"""Per-image transforms of decoded uint8 images, and the per-batch label mixing: the ImageNet (DeiT) recipe.

Training (``augment="random_resized_crop"``, per image, in the loader workers): timm's
``RandomResizedCropAndInterpolation`` (area 8-100%, aspect 3/4-4/3) to ``image_size`` and a horizontal flip on the
uint8 tensor, then optionally a timm policy (``auto_augment``, e.g. DeiT's ``rand-m9-mstd0.5-inc1``: RandAugment,
2 ops, magnitude 9 with std 0.5) on the 224 px crop, then normalisation, then timm's ``RandomErasing``
(``random_erasing`` = its probability, per-pixel normal noise, DeiT 0.25). Per batch: timm's ``Mixup`` (Mixup
alpha 0.8 / CutMix alpha 1.0 in DeiT, one of the two per batch), which turns the labels into class
probabilities (B, K) that sum to 1; ``nn.CrossEntropyLoss`` takes them as they are (label smoothing stays the
loss's, so it is not applied twice).

Evaluation (``eval_crop_fraction``, e.g. 0.875): the shorter side resized to ``floor(image_size / fraction)``
(256 for 224), then the centre ``image_size`` crop: timm's ``transforms_imagenet_eval``. Without a fraction,
images are resized to ``image_size`` x ``image_size`` (or kept at their size).

Timm's RandAugment ``PosterizeIncreasing`` asks Pillow for 0 bits at magnitudes near 10 (mstd noise reaches
them); Pillow 13 refuses 0 where older versions returned a black image. ``timm_policy`` gives those ops the old
result, so the recipe behaves as published.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from PIL import Image, ImageOps
from torchvision.transforms import InterpolationMode
from torchvision.transforms.v2 import functional as TF

#: interpolation names of the settings -> torchvision's
INTERPOLATIONS = {"bilinear": InterpolationMode.BILINEAR, "bicubic": InterpolationMode.BICUBIC}


def _resize(x: torch.Tensor, size: list[int], interpolation: str) -> torch.Tensor:
    """Antialiased resize of a uint8 image (bicubic results are rounded and clamped to 0..255 by torchvision)."""
    return TF.resize(x, size, interpolation=INTERPOLATIONS[interpolation], antialias=True)


class EvalResize:
    """Evaluation geometry of a uint8 (C, H, W) image: the shorter side to ``floor(size / crop_fraction)`` and the
    centre ``size`` crop (``crop_fraction``), else a resize to ``size`` x ``size`` (``size`` None: unchanged)."""

    def __init__(self, size: int | None, crop_fraction: float | None = None, interpolation: str = "bilinear") -> None:
        if crop_fraction is not None and size is None:
            raise ValueError("eval_crop_fraction needs image_size (the size of the centre crop)")
        self.size, self.crop_fraction, self.interpolation = size, crop_fraction, interpolation

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.size is None:
            return x
        height, width = x.shape[-2:]
        if self.crop_fraction is None:
            if (height, width) == (self.size, self.size):
                return x
            return _resize(x, [self.size, self.size], self.interpolation)
        short = math.floor(self.size / self.crop_fraction)
        if min(height, width) != short:
            x = _resize(x, [short], self.interpolation)  # the shorter side, as timm's (torchvision's) Resize
        return TF.center_crop(x, [self.size, self.size])

    def __repr__(self) -> str:
        return f"EvalResize(size={self.size}, crop_fraction={self.crop_fraction}, {self.interpolation})"


def _posterize(image: Image.Image, bits_to_keep: int, **_) -> Image.Image:
    """timm's posterize with Pillow < 13's result for 0 bits (a black image) instead of Pillow 13's error."""
    if bits_to_keep >= 8:
        return image
    if bits_to_keep <= 0:
        return Image.new(image.mode, image.size)
    return ImageOps.posterize(image, bits_to_keep)


def timm_policy(config: str, size: int, mean: tuple[float, ...] = (0.485, 0.456, 0.406),
                interpolation: str = "bicubic") -> Callable[[Image.Image], Image.Image]:  # fmt: skip
    """timm's augmentation policy ``config`` (``rand-...``, ``augmix-...`` or an AutoAugment name) for ``size`` px
    images, as ``timm.data.create_transform`` builds it, on PIL images."""
    from timm.data.auto_augment import augment_and_mix_transform, auto_augment_transform, rand_augment_transform
    from timm.data.transforms import str_to_pil_interp

    params = {"translate_const": int(size * 0.45), "img_mean": tuple(min(255, round(255 * m)) for m in mean),
              "interpolation": str_to_pil_interp(interpolation)}  # fmt: skip
    if config.startswith("rand"):
        policy = rand_augment_transform(config, params)
    elif config.startswith("augmix"):
        policy = augment_and_mix_transform(config, {**params, "translate_pct": 0.3})
    else:
        policy = auto_augment_transform(config, params)
    ops = list(getattr(policy, "ops", [])) + [op for sub in getattr(policy, "policy", []) for op in sub]
    for op in ops:
        if getattr(op, "name", "").startswith("Posterize"):
            op.aug_fn = _posterize
    return policy


class PolicyOnTensor:
    """A PIL policy applied to a uint8 (C, H, W) tensor. One channel goes through the policy as an
    RGB image of three equal channels and comes back as grey (PIL's ``convert("L")``): timm's
    geometric ops fill the uncovered corners with the RGB mean, which a mode-``L`` image refuses."""

    def __init__(self, policy: Callable[[Image.Image], Image.Image]) -> None:
        self.policy = policy

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 1:
            return TF.pil_to_tensor(self.policy(TF.to_pil_image(x.expand(3, -1, -1))).convert("L"))
        return TF.pil_to_tensor(self.policy(TF.to_pil_image(x)))

    def __repr__(self) -> str:
        return f"PolicyOnTensor({self.policy!r})"


class RandomResizedCropFlip:
    """Training geometry of a uint8 (C, H, W) image: timm's ``RandomResizedCropAndInterpolation`` to ``size``
    (``scale`` of the area, ``ratio`` of the aspect) and a horizontal flip with probability 1/2, then ``policy``."""

    def __init__(self, size: int, scale: tuple[float, float] = (0.08, 1.0),
                 ratio: tuple[float, float] = (3 / 4, 4 / 3), interpolation: str = "bicubic",
                 policy: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:  # fmt: skip
        from timm.data.transforms import RandomResizedCropAndInterpolation

        self.size, self.interpolation, self.policy = size, interpolation, policy
        self.rrc = RandomResizedCropAndInterpolation(size, scale=scale, ratio=ratio, interpolation=interpolation)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        top, left, height, width = self.rrc.get_params(x, self.rrc.scale, self.rrc.ratio)
        x = _resize(TF.crop(x, top, left, height, width), [self.size, self.size], self.interpolation)
        if torch.rand(()) < 0.5:
            x = x.flip(-1)
        return self.policy(x) if self.policy is not None else x

    def __repr__(self) -> str:
        return (f"RandomResizedCropFlip(size={self.size}, scale={self.rrc.scale}, {self.interpolation}, "
                f"policy={self.policy!r})")


def random_erasing(probability: float) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """timm's ``RandomErasing`` (per-pixel normal noise, one box, on the normalised image), or None for 0."""
    if probability <= 0:
        return None
    from timm.data.random_erasing import RandomErasing

    return RandomErasing(probability=probability, mode="pixel", max_count=1, device="cpu")


class BatchMix:
    """timm's ``Mixup`` on a normalised batch (B, C, H, W) and its int labels: (mixed batch, (B, K) float targets
    summing to 1). Label smoothing is left to the loss. An odd batch mixes its first B-1 images and gives the
    last its one-hot target (timm's ``Mixup`` needs an even batch)."""

    def __init__(self, num_classes: int, mixup_alpha: float = 0.8, cutmix_alpha: float = 1.0, prob: float = 1.0,
                 switch_prob: float = 0.5) -> None:  # fmt: skip
        from timm.data import Mixup

        self.num_classes = num_classes
        self.mixup = Mixup(mixup_alpha=mixup_alpha, cutmix_alpha=cutmix_alpha, prob=prob, switch_prob=switch_prob,
                           mode="batch", label_smoothing=0.0, num_classes=num_classes)  # fmt: skip

    def __call__(self, x: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = len(x) - len(x) % 2
        targets = torch.nn.functional.one_hot(labels.long(), self.num_classes).to(x.dtype)
        if n >= 2:
            x[:n], targets[:n] = self.mixup(x[:n], labels[:n])
        return x, targets

    def __repr__(self) -> str:
        m = self.mixup
        return f"BatchMix(mixup_alpha={m.mixup_alpha}, cutmix_alpha={m.cutmix_alpha}, prob={m.mix_prob})"

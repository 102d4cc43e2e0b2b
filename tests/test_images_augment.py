"""The training augmentation (``datamodules/images/augment.py``): batched crop + flip, policies."""

from __future__ import annotations

import pytest
import torch

from datamodules.images import AUGMENTS, CropFlip, build_augment
from tests.images_helpers import cache, fashion_dir, isolated, make  # noqa: F401


@pytest.mark.parametrize("augment", AUGMENTS)
@pytest.mark.parametrize("source", ["digits", "fashion_mnist"])
def test_every_augment_runs_and_changes_only_training_images(cache, fashion_dir, source, augment):
    data_dir = str(fashion_dir) if source == "fashion_mnist" else None
    plain = make(cache, source=source, data_dir=data_dir)
    dm = make(cache, source=source, data_dir=data_dir, augment=augment, batch_size=16)
    shape = (1, 8, 8) if source == "digits" else (1, 28, 28)
    torch.manual_seed(0)
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (16, *shape) and x.dtype == torch.float32 and torch.isfinite(x).all()
    batch = list(range(16))
    augmented = torch.stack([s[0] for s in dm.train_dataset.__getitems__(batch)])
    reference = torch.stack([s[0] for s in plain.train_dataset.__getitems__(batch)])
    assert torch.equal(augmented, reference) is (augment == "none")
    # evaluation data is never augmented
    assert torch.equal(dm.test_dataset[0][0], plain.test_dataset[0][0])


def test_batched_crop_flip_is_torchvisions_crop_and_flip_per_image():
    """CropFlip on a batch: every output image is some zero-padded crop of its input, flipped or
    not (exactly what v2.RandomCrop(padding) + v2.RandomHorizontalFlip can produce); the offsets
    cover all 2 pad + 1 positions per axis, both flips occur, images get their own draws; and a
    seeded draw repeats."""
    from datamodules.images import CropFlip

    torch.manual_seed(0)
    x = torch.randint(0, 256, (512, 2, 8, 6), dtype=torch.uint8)
    aug = CropFlip(8, 6, pad_h=1, pad_w=2)
    torch.manual_seed(1)
    out = aug(x)
    torch.manual_seed(1)
    assert torch.equal(out, aug(x))
    assert out.shape == x.shape and out.dtype == torch.uint8
    padded = torch.nn.functional.pad(x, (2, 2, 1, 1))
    seen = set()
    for i in range(len(x)):
        matches = [(dy, dx, f) for dy in range(3) for dx in range(5) for f in (False, True)
                   if torch.equal(out[i], (lambda c: c.flip(-1) if f else c)(padded[i, :, dy:dy + 8, dx:dx + 6]))]
        assert matches, i
        seen.add(matches[0])
    assert {d[0] for d in seen} == {0, 1, 2} and {d[1] for d in seen} == set(range(5)) and {d[2] for d in seen} == {False, True}
    assert aug(x[0]).shape == x[0].shape  # one image


def test_flip_augment_mirrors_without_shifting(cache):
    """augment='flip': every training image is its original or its mirror image (never shifted),
    both occur, and evaluation images stay as they are."""
    plain = make(cache, source="digits", batch_size=64)
    dm = make(cache, source="digits", augment="flip", batch_size=64)
    rows = list(range(64))
    torch.manual_seed(0)
    out = torch.stack([s[0] for s in dm.train_dataset.__getitems__(rows)])
    ref = torch.stack([s[0] for s in plain.train_dataset.__getitems__(rows)])
    same = (out == ref).flatten(1).all(1)
    mirrored = (out == ref.flip(-1)).flatten(1).all(1)
    assert (same | mirrored).all()
    assert (same & ~mirrored).any() and (mirrored & ~same).any()
    assert torch.equal(dm.val_dataset[0][0], plain.val_dataset[0][0])



@pytest.mark.parametrize("augment", AUGMENTS)
def test_build_augment_names_map_to_the_documented_pipeline(augment):
    aug = build_augment(augment, 28, 20)
    if augment == "none":
        assert aug is None
        return
    if augment == "random_resized_crop":  # the ImageNet recipe's crop, per image (tests/test_images_transforms.py)
        assert aug.size == 28 and aug.rrc.scale == (0.08, 1.0)
        return
    padding = (0, 0) if augment == "flip" else (3, 2)  # size // 8 per axis, at least 1
    assert (aug.crop_flip.pad_h, aug.crop_flip.pad_w) == padding
    policy = {"randaugment": "RandAugment", "autoaugment": "AutoAugment"}.get(augment)
    assert (type(aug.policy).__name__ if aug.policy is not None else None) == policy
    x = torch.randint(0, 256, (4, 1, 28, 20), dtype=torch.uint8)
    assert aug.batch(x).shape == x.shape and aug(x[0]).shape == x[0].shape


def test_build_augment_padding_overrides_size_over_8():
    aug = build_augment("crop_flip", 32, 32, padding=2)
    assert (aug.crop_flip.pad_h, aug.crop_flip.pad_w) == (2, 2)
    assert build_augment("autoaugment", 32, 32, padding=0).crop_flip.pad_h == 0
    assert build_augment("flip", 32, 32, padding=2).crop_flip.pad_h == 0  # flip never shifts


def test_build_augment_refuses_an_unknown_name():
    with pytest.raises(ValueError, match="unknown augment 'mixup': use one of none, flip, crop_flip, randaugment"):
        build_augment("mixup", 8, 8)

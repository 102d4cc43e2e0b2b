"""Tiny models for the unit tests (seconds on a CPU): one definition each, shared by the test files."""

from __future__ import annotations

from models.ctr import BST
from models.resnet import ResNet
from models.vit import ViT


def tiny_vit(**kw) -> ViT:
    """A 2-block ViT on 8x8 single-channel images, 4 classes (16 tokens of patch 2, width 16)."""
    args = dict(img_size=8, in_chans=1, num_classes=4, patch_size=2, embed_dim=16, depth=2, num_heads=2, mlp_ratio=2.0)
    args.update(kw)
    return ViT(**args)


def tiny_resnet(**kw) -> ResNet:
    """A 2-stage GroupNorm ResNet on 16x16 RGB images, 4 classes."""
    args = dict(img_size=16, in_chans=3, num_classes=4, layers=(1, 1), channels=(16, 32), stem_chs=8, gn_groups=4)
    args.update(kw)
    return ResNet(**args)


def tiny_bst(**kw) -> BST:
    """A 1-block BST over 10 items and 4 categories, widths of 4, one hidden MLP layer of 8."""
    args = dict(n_items=10, n_categories=4, item_dim=4, category_dim=4, position_dim=4, num_heads=2, mlp_dims=(8,))
    args.update(kw)
    return BST(**args)

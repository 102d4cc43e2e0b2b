"""Tiny models for the unit tests (seconds on a CPU): one definition each, shared by the test files."""

from __future__ import annotations

from functools import partial

import torch
from timm.layers import HybridEmbed
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from models.ctr import BST
from models.resnet import ResNet
from models.vit import ViT, ViTBlock


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


#: the attention analyses' tiny ViT: 8x8 RGB images, 16 tokens, 2 blocks of 4 heads
ATTENTION_VIT = dict(img_size=8, in_chans=3, num_classes=5, patch_size=2, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2.0)


def attention_vit(**overrides) -> ViT:
    torch.manual_seed(0)
    return ViT(**{**ATTENTION_VIT, **overrides}).eval()


def cnn_stride4() -> nn.Module:
    """A CNN stem of total stride 4: 16x16 images -> 4x4 feature maps."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(),
    )


def timm_hybrid(block_fn=ViTBlock) -> VisionTransformer:
    """A hybrid as timm builds one: HybridEmbed over a CNN (patch size 1 on its features), 16x16 RGB images."""
    torch.manual_seed(0)
    return VisionTransformer(
        img_size=16, patch_size=1, in_chans=3, num_classes=5, embed_dim=32, depth=2, num_heads=4,
        mlp_ratio=2.0, embed_layer=partial(HybridEmbed, backbone=cnn_stride4()), block_fn=block_fn,
    ).eval()

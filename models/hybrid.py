"""CNN + Transformer hybrid of the ViT paper (Dosovitskiy et al. 2021, Sec. 3.1 "Hybrid
Architecture", Sec. 4.1, Table 6, Fig. 5).

The image is not cut into pixel patches: a BiT-style ResNet (weight-standardised convs +
GroupNorm, ``models/resnet.py``) turns it into a feature map, and every feature-map pixel
(``patch_size=1``) is one token, projected to the transformer width by a 1x1 conv. This is
composition, as in timm: ``ViT(embed_layer=partial(HybridEmbed, backbone=cnn))``, so the
transformer is our ``ViT`` with every position-embedding kind and placement, both poolings,
both attention scorings and the explicit-attention path (``models.vit.explicit_attention``).

The two constructions of the paper (Sec. 4.1, "Model Variants"), chosen by ``construction``:
- ``last_stage``: the backbone as given, tokens from its last stage. R50 (3, 4, 6, 3):
  stride 32, "R50x1+ViT-B/32".
- ``extend_previous``: drop the last stage and add its blocks to the stage before, tokens
  from that extended stage. R50: blocks (3, 4, 9), stride 16, a 4x longer sequence,
  "R50x1+ViT-B/16" (the paper's main hybrid; timm's ``vit_base_r50_s16_224``).
``backbone_layers`` always names the full ResNet; the construction derives the stages built.

Token grid: ``grid_size = img_size / stride`` with ``stride = cnn_stride * patch_size``, the
input pixels per token side. Analysis code converts grid distances to pixels with it (mean
attention distance: P = ``model.stride`` = img_size / grid_size).

Names: ``create_hybrid('r50_vit_b16')`` builds the paper's R50+ViT-B/16 at 224 px (same
parameter names, shapes and count as timm's ``vit_base_r50_s16_224``: 97,890,112 with 1000
classes); ``HYBRIDS`` lists the names and their keywords (overridable).
Small images (28-32 px) use ``stem='small'`` (3x3 stride-1 conv, no pooling) and 2-3 stages:
total stride 2-4, e.g. 28 px -> 7x7 tokens with three stages (as many as ViT patch 4).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any, Optional

from timm.layers import HybridEmbed

from models.resnet import ResNet, STEM_STRIDE, validate_resnet_config
from models.vit import ViT, validate_vit_config

CONSTRUCTIONS = ("last_stage", "extend_previous")


def stage_layers(backbone_layers: Sequence[int], construction: str) -> tuple[int, ...]:
    """Blocks per stage actually built: (3, 4, 6, 3) -> itself (``last_stage``) or (3, 4, 9)
    (``extend_previous``: the last stage's blocks move into the one before it)."""
    layers = tuple(backbone_layers)
    if construction == "last_stage":
        return layers
    return layers[:-2] + (layers[-2] + layers[-1],)


def validate_hybrid_config(
    *, img_size: int, backbone_layers: Sequence[int], stem: str, construction: str, patch_size: int
) -> int:
    """The checks only the hybrid needs, after the full ResNet's and the ViT's keywords passed
    theirs; returns the CNN's total stride."""
    if construction not in CONSTRUCTIONS:
        raise ValueError(f"construction={construction!r} is not one of {list(CONSTRUCTIONS)}")
    layers = tuple(backbone_layers)
    if construction == "extend_previous" and len(layers) < 2:
        raise ValueError(
            f"construction='extend_previous' drops the last stage and extends the one before: it needs at least "
            f"2 stages, got backbone_layers={list(layers)}; use construction='last_stage'"
        )
    num_stages = len(stage_layers(layers, construction))
    cnn_stride = STEM_STRIDE[stem] * 2 ** (num_stages - 1)
    token = cnn_stride * patch_size
    if img_size % token:
        sizes = [s for s in range(token, 4 * token + 1, token)]
        raise ValueError(
            f"img_size={img_size} is not a multiple of the token stride {token} (CNN stride {cnn_stride} of "
            f"stem={stem!r} with {num_stages} stage(s), x patch_size={patch_size}); image sizes that work: "
            f"{sizes}..., or change the stages, stem or patch_size"
        )
    return cnn_stride


class HybridViT(ViT):
    """ResNet stem + ViT encoder (the paper's hybrid), configured by keyword.

    Backbone keywords (``models/resnet.py`` has the details): ``backbone_layers`` (blocks per
    stage of the full ResNet), ``backbone_channels`` (stage widths, default the ResNet's),
    ``backbone_width`` (BiT width factor), ``stem`` (``imagenet`` | ``small``), ``stem_chs``,
    ``block`` (``bottleneck``, the paper's, | ``preact_bottleneck`` | ``preact_basic``),
    ``padding`` (``symmetric`` | ``same``), ``gn_groups``, ``zero_init_last`` (zero scale of each
    block's last GroupNorm, as vit_jax and timm; bottleneck only), ``construction``
    (``last_stage`` | ``extend_previous``, see the module docstring).

    Transformer keywords: those of ``models.vit.ViT``; ``patch_size`` is in feature-map
    pixels (the paper: 1).

    Parameter names are timm's hybrid's: ``patch_embed.backbone.*`` (the ResNet, without its
    classifier), ``patch_embed.proj`` (the 1x1 token projection), then the ViT's.
    Shapes: (B, in_chans, img_size, img_size) -> CNN (B, C, img_size/cnn_stride, ...) ->
    tokens (B, grid^2 [+1 class token], embed_dim) -> logits (B, num_classes).
    """

    def __init__(
        self,
        *,
        img_size: int = 32,
        in_chans: int = 3,
        num_classes: int = 10,
        backbone_layers: Sequence[int] = (1, 1, 1),
        backbone_channels: Optional[Sequence[int]] = (64, 128, 256),
        backbone_width: float = 1.0,
        stem: str = "small",
        stem_chs: int = 32,
        block: str = "bottleneck",
        padding: str = "symmetric",
        gn_groups: int = 32,
        zero_init_last: bool = True,
        construction: str = "last_stage",
        patch_size: int = 1,
        embed_dim: int = 192,
        depth: int = 6,
        num_heads: int = 3,
        mlp_ratio: float = 4.0,
        pool: str = "cls",
        pos_embed: str = "learned_1d",
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        drop_path: float = 0.0,
        pos_placement: str = "stem",
        attention: str = "dot",
        additive_dim: Optional[int] = None,
    ) -> None:
        # Everything is validated before the (possibly large) CNN is built.
        validate_vit_config(
            img_size=img_size, in_chans=in_chans, num_classes=num_classes, patch_size=patch_size,
            embed_dim=embed_dim, depth=depth, num_heads=num_heads, mlp_ratio=mlp_ratio, pool=pool,
            pos_embed=pos_embed, dropout=dropout, attn_dropout=attn_dropout, drop_path=drop_path,
            pos_placement=pos_placement, attention=attention, additive_dim=additive_dim,
        )
        resnet = dict(
            img_size=img_size, in_chans=in_chans, num_classes=0, pool="none", width_factor=backbone_width,
            stem=stem, stem_chs=stem_chs, block=block, padding=padding, gn_groups=gn_groups,
            zero_init_last=zero_init_last,
        )
        # the full ResNet first: if it is valid, so is the one the construction derives from it
        validate_resnet_config(
            **resnet, layers=backbone_layers, channels=backbone_channels,
            cbam=False, cbam_reduction=16, cbam_kernel_size=7, dropout=0.0, drop_path=0.0,
        )
        cnn_stride = validate_hybrid_config(
            img_size=img_size, backbone_layers=backbone_layers, stem=stem, construction=construction,
            patch_size=patch_size,
        )
        layers = stage_layers(backbone_layers, construction)
        channels = tuple(backbone_channels)[: len(layers)] if backbone_channels is not None else None
        backbone = ResNet(**resnet, layers=layers, channels=channels)
        super().__init__(
            img_size=img_size, in_chans=in_chans, num_classes=num_classes, patch_size=patch_size,
            embed_dim=embed_dim, depth=depth, num_heads=num_heads, mlp_ratio=mlp_ratio, pool=pool,
            pos_embed=pos_embed, dropout=dropout, attn_dropout=attn_dropout, drop_path=drop_path,
            pos_placement=pos_placement, attention=attention, additive_dim=additive_dim,
            embed_layer=partial(HybridEmbed, backbone=backbone),
        )
        assert self.grid_size == (img_size // (cnn_stride * patch_size),) * 2, (self.grid_size, cnn_stride)
        self.construction = construction
        self.backbone_layers = tuple(backbone_layers)
        self.cnn_stride = cnn_stride

    @property
    def backbone(self) -> ResNet:
        """The CNN (a ``models.resnet.ResNet`` returning its feature map)."""
        return self.patch_embed.backbone

    @property
    def stride(self) -> int:
        """Input pixels per token side: the CNN's total stride x patch_size = img_size / grid side."""
        return self.cnn_stride * self.patch_size


#: the paper's hybrids by name (Table 6), at ImageNet scale: keywords for ``HybridViT``
_R50 = dict(
    img_size=224, in_chans=3, num_classes=1000, backbone_layers=(3, 4, 6, 3), backbone_channels=None,
    stem="imagenet", stem_chs=64, block="bottleneck", padding="same", zero_init_last=True, patch_size=1,
    pool="cls", pos_embed="learned_1d", mlp_ratio=4.0,
)
_B = dict(embed_dim=768, depth=12, num_heads=12)
_L = dict(embed_dim=1024, depth=24, num_heads=16)
HYBRIDS: dict[str, dict[str, Any]] = {
    "r50_vit_b16": {**_R50, **_B, "construction": "extend_previous"},  # timm vit_base_r50_s16_224
    "r50_vit_b32": {**_R50, **_B, "construction": "last_stage"},
    "r50_vit_l16": {**_R50, **_L, "construction": "extend_previous"},
    "r50_vit_l32": {**_R50, **_L, "construction": "last_stage"},  # timm vit_large_r50_s32_224
}


def create_hybrid(name: str, **overrides: Any) -> HybridViT:
    """The paper's hybrid ``name`` (one of ``HYBRIDS``), keywords overridable, e.g.
    ``create_hybrid('r50_vit_b16', img_size=384, num_classes=10)``."""
    if name not in HYBRIDS:
        raise ValueError(f"unknown hybrid {name!r}: use one of {list(HYBRIDS)}")
    return HybridViT(**{**HYBRIDS[name], **overrides})

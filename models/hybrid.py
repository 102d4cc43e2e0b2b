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

import inspect
import math
from collections.abc import Sequence
from functools import partial
from typing import Any, Literal, Optional

import torch
import torch.nn.functional as F
from timm.layers import ConvNormAct, HybridEmbed
from torch import nn

from utils.choices import check_choice, choices
from models.resnet import BlockKind, Padding, ResNet, STEM_STRIDE, StemKind, validate_resnet_config
from models.vit import ViT, validate_vit_config

Construction = Literal["last_stage", "extend_previous"]
CONSTRUCTIONS = choices(Construction)
StemDownsample = Literal["stride", "maxpool"]
STEM_DOWNSAMPLES = choices(StemDownsample)
StemBlock = Literal["conv", "group"]
STEM_BLOCKS = choices(StemBlock)


def _vit_keywords(cls: type, kwargs: dict[str, Any], **fixed: Any) -> dict[str, Any]:
    """Every keyword of ``ViT`` for a subclass ``cls`` that forwards ``**kwargs`` to it: the
    given ones, ``fixed`` (the subclass's own defaults for ViT keywords, e.g. ``patch_size``)
    and ViT's defaults for the rest, so the subclass can validate them before building
    anything. ``embed_layer`` is the subclass's to set; an unknown keyword is a TypeError."""
    if "embed_layer" in kwargs:
        raise TypeError(f"{cls.__name__} sets embed_layer itself; it is not a keyword of {cls.__name__}")
    bound = inspect.signature(ViT.__init__).bind_partial(None, **kwargs, **fixed)  # None: self
    bound.apply_defaults()
    return {k: v for k, v in bound.arguments.items() if k not in ("self", "embed_layer")}


def stage_layers(backbone_layers: Sequence[int], construction: Construction) -> tuple[int, ...]:
    """Blocks per stage actually built: (3, 4, 6, 3) -> itself (``last_stage``) or (3, 4, 9)
    (``extend_previous``: the last stage's blocks move into the one before it)."""
    layers = tuple(backbone_layers)
    if construction == "last_stage":
        return layers
    return layers[:-2] + (layers[-2] + layers[-1],)


def validate_hybrid_config(
    *, img_size: int, backbone_layers: Sequence[int], stem: StemKind, construction: Construction, patch_size: int
) -> int:
    """The checks only the hybrid needs, after the full ResNet's and the ViT's keywords passed
    theirs; returns the CNN's total stride."""
    check_choice("construction", construction, Construction)
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

    Transformer keywords: those of ``models.vit.ViT`` (``img_size``, ``in_chans``,
    ``num_classes``, ``embed_dim``, ``pool``, ...), passed through ``**kwargs`` with ViT's
    defaults; ``patch_size`` is in feature-map pixels and defaults to 1 (the paper's).

    Parameter names are timm's hybrid's: ``patch_embed.backbone.*`` (the ResNet, without its
    classifier), ``patch_embed.proj`` (the 1x1 token projection), then the ViT's.
    Shapes: (B, in_chans, img_size, img_size) -> CNN (B, C, img_size/cnn_stride, ...) ->
    tokens (B, grid^2 [+1 class token], embed_dim) -> logits (B, num_classes).
    """

    def __init__(
        self,
        *,
        backbone_layers: Sequence[int] = (1, 1, 1),
        backbone_channels: Optional[Sequence[int]] = (64, 128, 256),
        backbone_width: float = 1.0,
        stem: StemKind = "small",
        stem_chs: int = 32,
        block: BlockKind = "bottleneck",
        padding: Padding = "symmetric",
        gn_groups: int = 32,
        zero_init_last: bool = True,
        construction: Construction = "last_stage",
        patch_size: int = 1,
        **kwargs: Any,
    ) -> None:
        # Everything is validated before the (possibly large) CNN is built.
        vit = _vit_keywords(type(self), kwargs, patch_size=patch_size)
        validate_vit_config(**vit)
        img_size, in_chans = vit["img_size"], vit["in_chans"]
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
        # **kwargs straight into ViT: the CLI follows them there for ViT's parameters
        super().__init__(patch_size=patch_size, **kwargs, embed_layer=partial(HybridEmbed, backbone=backbone))
        assert self.grid_size == (img_size // (cnn_stride * patch_size),) * 2, (self.grid_size, cnn_stride)
        self.construction = construction
        self.backbone_layers = tuple(backbone_layers)
        self.cnn_stride = cnn_stride

    def shard_units(self) -> list[nn.Module]:
        """FSDP units (``lightning_modules.sharding``): each ResNet stage, then each transformer
        block; the CNN stem, token projection, position tables, norm and head are the root."""
        return [*self.backbone.stages, *self.blocks]

    @property
    def backbone(self) -> ResNet:
        """The CNN (a ``models.resnet.ResNet`` returning its feature map)."""
        return self.patch_embed.backbone

    @property
    def stride(self) -> int:
        """Input pixels per token side: the CNN's total stride x patch_size = img_size / grid side."""
        return self.cnn_stride * self.patch_size


def conv_stem_strides(patch_size: int, num_convs: int) -> tuple[int, ...]:
    """Default strides of a ``ConvStemViT`` stem: stride 2 on the first log2(patch_size) convs
    (Xiao et al.'s order), stride 1 on the rest."""
    halvings = patch_size.bit_length() - 1
    if patch_size != 2**halvings:
        raise ValueError(
            f"patch_size={patch_size} is not a power of 2: give stem_strides explicitly (their product must be "
            f"patch_size), or use patch_size in [2, 4, 8, 16]"
        )
    if num_convs < halvings:
        raise ValueError(
            f"stem_channels has {num_convs} conv(s), but patch_size={patch_size} needs {halvings} stride-2 convs: "
            f"give at least {halvings} widths"
        )
    return (2,) * halvings + (1,) * (num_convs - halvings)


def validate_conv_stem(*, patch_size: int, stem_channels: Sequence[int], stem_strides: Optional[Sequence[int]]) -> tuple[int, ...]:
    """Check the stem keywords of ``ConvStemViT``; returns the strides."""
    channels = list(stem_channels) if isinstance(stem_channels, (list, tuple)) else None
    if not channels or not all(isinstance(c, int) and c >= 1 for c in channels):
        raise ValueError(f"stem_channels={stem_channels!r} must be a non-empty list of positive integers (conv widths)")
    if stem_strides is None:
        return conv_stem_strides(patch_size, len(channels))
    strides = list(stem_strides) if isinstance(stem_strides, (list, tuple)) else None
    if strides is None or len(strides) != len(channels) or not all(s in (1, 2) for s in strides):
        raise ValueError(
            f"stem_strides={stem_strides!r} must give a stride of 1 or 2 for each of the {len(channels)} convs of "
            f"stem_channels={channels}"
        )
    if math.prod(strides) != patch_size:
        raise ValueError(
            f"stem_strides={strides} reduce the image by {math.prod(strides)}, but patch_size={patch_size}: "
            "their product must equal patch_size (the input pixels per token side)"
        )
    return tuple(strides)


class PatchWhitening(nn.Conv2d):
    """A frozen 2x2 convolution that whitens the image's 2x2 patches (K. Jordan's airbench): its
    filters are the eigenvectors of the training images' patch covariance, each divided by the
    square root of its eigenvalue (+ ``eps``), and each also negated, so the GELU after it passes
    both signs: ``2 * in_chans * 4`` output channels. The weight never trains (it is set from data
    by ``fit``); the bias does. The map keeps its size: the input is padded by one pixel on the
    right and bottom.

    ``fit(images)`` takes normalised training images (N, C, H, W); until it runs the filters are
    the default random init and ``fitted`` is False. The weight and ``fitted`` are in the
    state_dict, so a checkpoint carries the whitening it was trained with.
    """

    def __init__(self, in_chans: int, kernel_size: int = 2, eps: float = 5e-4) -> None:
        super().__init__(in_chans, 2 * in_chans * kernel_size**2, kernel_size, padding=0, bias=True)
        self.weight.requires_grad_(False)
        self.eps = eps
        self.register_buffer("fitted", torch.tensor(False))

    @torch.no_grad()
    def fit(self, images: torch.Tensor) -> None:
        """Set the filters from ``images`` (N, C, H, W), normalised as the net's input."""
        c, (h, w) = self.in_channels, self.kernel_size
        if images.dim() != 4 or images.shape[1] != c:
            raise ValueError(f"PatchWhitening.fit needs images (N, {c}, H, W), got shape {tuple(images.shape)}")
        covariance, count = torch.zeros(c * h * w, c * h * w, dtype=torch.float64), 0
        for chunk in images.split(256):  # the patches of a few hundred images at a time
            patches = chunk.double().unfold(2, h, 1).unfold(3, w, 1).transpose(1, 3).reshape(-1, c * h * w)
            covariance += patches.T @ patches
            count += len(patches)
        covariance /= count
        eigenvalues, eigenvectors = torch.linalg.eigh(covariance)  # ascending
        filters = (eigenvectors.T / torch.sqrt(eigenvalues.clamp_min(0) + self.eps)[:, None]).flip(0).float()
        filters = filters.reshape(c * h * w, c, h, w)
        self.weight.copy_(torch.cat((filters, -filters)).to(self.weight))
        self.fitted.fill_(True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = self.kernel_size
        return super().forward(F.pad(x, (0, w - 1, 0, h - 1)))


class ConvGroup(nn.Module):
    """airbench's conv group: 3x3 conv, [2x2 max-pool when ``stride`` is 2], BatchNorm, GELU, 3x3
    conv, BatchNorm, GELU. Its BatchNorms keep their scale at 1 (only the bias trains) and follow
    the batch fast (running-stat momentum 0.4); each conv starts with its first ``in_channels``
    filters as the identity (Dirac), the rest at PyTorch's default init."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False)
        self.pool = nn.MaxPool2d(2) if stride == 2 else nn.Identity()
        self.norm1 = self._norm(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.norm2 = self._norm(out_channels)
        self.act = nn.GELU()
        for conv in (self.conv1, self.conv2):
            nn.init.dirac_(conv.weight.data[: min(conv.in_channels, conv.out_channels)])

    @staticmethod
    def _norm(channels: int) -> nn.BatchNorm2d:
        norm = nn.BatchNorm2d(channels, eps=1e-12, momentum=0.4)
        norm.weight.requires_grad_(False)
        return norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.norm1(self.pool(self.conv1(x))))
        return self.act(self.norm2(self.conv2(x)))


class ConvStemViT(ViT):
    """ViT with a convolutional stem instead of the patch projection (Xiao et al. 2021, "Early
    Convolutions Help Transformers See Better", ViT_C): 3x3 convs, each with BatchNorm and ReLU,
    then a 1x1 conv to the token width; one token per pixel of the stem's output.

    ``patch_size`` keeps the ViT's meaning, the input pixels per token side, and is the stem's
    total stride: ``stem_strides`` (1 or 2 per conv; default stride 2 on the first log2(patch_size)
    convs, as Xiao et al., stride 1 after) must multiply to it. ``stem_channels`` are the convs'
    widths. ``downsample`` says how a stride-2 conv halves the map: ``stride`` (the conv itself
    steps by 2, as Xiao et al.) or ``maxpool`` (the conv runs at stride 1 and a 2x2 max-pool
    follows its ReLU, as in the fast CIFAR-10 CNNs, D. Page's ResNet-9 and K. Jordan's airbench:
    4x that conv's FLOPs, every position of the map goes through the conv). The 1x1 conv is
    timm's ``HybridEmbed`` projection (``patch_embed.proj``), the convs are
    ``patch_embed.backbone``, so every tool that reads a hybrid (attention distances in pixels,
    rollout) reads this model too. Everything else is ``models.vit.ViT``'s keywords
    (``img_size``, ``patch_size``, ``embed_dim``, ...), passed through ``**kwargs`` with ViT's
    defaults.

    ``stem_block`` chooses what each width of ``stem_channels`` is: ``conv`` (one 3x3 conv + BatchNorm +
    ReLU, Xiao et al.'s) or ``group`` (airbench's ``ConvGroup``: two 3x3 convs, a 2x2 max-pool after
    the first when that width's stride is 2, BatchNorm with a fixed scale, GELU). ``whiten`` puts a
    ``PatchWhitening`` conv + GELU before them (24 channels for RGB), fitted from training images by
    ``fit_to_images`` (``ImageClassifier`` calls it before training starts).

    Against the plain ViT at the same token grid this adds the stem's FLOPs (Xiao et al. remove
    one transformer block to pay for it). A wide stem can cost more than the encoder: in
    ``convstem_fashion_mnist.yaml`` (stride-1 convs at 28 and 7 px, 2 blocks of width 64) the
    stem does most of the 38 MFLOPs per image, and on a CPU those conv FLOPs run faster than
    the encoder's (``bench hybrid``). Its use here is the time-to-accuracy recipe
    (``reproductions/vit/sweeps/time_to_accuracy.yaml``).
    Shapes: (B, in_chans, img_size, img_size) -> stem (B, stem_channels[-1], img_size/patch_size, ...)
    -> tokens (B, (img_size/patch_size)^2 [+1], embed_dim) -> logits (B, num_classes).
    """

    def __init__(
        self,
        *,
        stem_channels: Sequence[int] = (32, 64),
        stem_strides: Optional[Sequence[int]] = None,
        downsample: StemDownsample = "stride",
        stem_block: StemBlock = "conv",
        whiten: bool = False,
        **kwargs: Any,
    ) -> None:
        vit = _vit_keywords(type(self), kwargs)
        validate_vit_config(**vit)
        check_choice("downsample", downsample, StemDownsample)
        check_choice("stem_block", stem_block, StemBlock)
        if stem_block == "group" and downsample != "maxpool":
            raise ValueError(
                f"stem_block='group' halves the map with a 2x2 max-pool (airbench's groups), but downsample="
                f"{downsample!r}: set downsample: maxpool"
            )
        img_size, patch_size = vit["img_size"], vit["patch_size"]
        strides = validate_conv_stem(patch_size=patch_size, stem_channels=stem_channels, stem_strides=stem_strides)
        # timm's anti-aliasing slot: with aa_layer a stride-2 conv runs at stride 1 and the layer
        # (here a 2x2 max-pool) follows BatchNorm + ReLU; the same parameter names either way
        pool = nn.MaxPool2d if downsample == "maxpool" else None
        convs, prev = [], vit["in_chans"]
        if whiten:
            convs += [PatchWhitening(prev), nn.GELU()]
            prev = convs[0].out_channels
        for width, stride in zip(stem_channels, strides):
            if stem_block == "group":
                convs.append(ConvGroup(prev, width, stride))
            else:
                convs.append(ConvNormAct(prev, width, kernel_size=3, stride=stride, padding=1, aa_layer=pool))
            prev = width
        stem = nn.Sequential(*convs)
        # the stem already reduces by patch_size: the projection is 1x1 on its output
        # **kwargs straight into ViT: the CLI follows them there for ViT's parameters
        super().__init__(**kwargs, embed_layer=lambda **kw: HybridEmbed(backbone=stem, **{**kw, "patch_size": 1}))
        assert self.grid_size == (img_size // patch_size,) * 2, self.grid_size
        self.stem_channels = tuple(stem_channels)
        self.stem_strides = strides
        self.downsample = downsample
        self.stem_block = stem_block
        self.whiten = whiten

    @property
    def whitening(self) -> Optional[PatchWhitening]:
        """The stem's ``PatchWhitening`` conv (``whiten=True``), else None."""
        first = self.stem[0]
        return first if isinstance(first, PatchWhitening) else None

    def needs_images(self) -> int:
        """How many training images ``fit_to_images`` wants before training (0: none, or already
        fitted, e.g. restored from a checkpoint)."""
        whitening = self.whitening
        return 5000 if whitening is not None and not bool(whitening.fitted) else 0

    def fit_to_images(self, images: torch.Tensor) -> None:
        """Fit the data-dependent layers (the patch whitening) to normalised training images."""
        if self.whitening is not None:
            self.whitening.fit(images)

    @property
    def stem(self) -> nn.Sequential:
        """The convolutions (``patch_embed.backbone``), before the 1x1 projection."""
        return self.patch_embed.backbone

    @property
    def stride(self) -> int:
        """Input pixels per token side: the stem's total stride (= patch_size)."""
        return self.patch_size


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

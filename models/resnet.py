"""CNN baselines: BiT-style ResNets (Kolesnikov et al., "Big Transfer", arXiv:1912.11370) and CBAM.

The ViT paper's CNNs (Sec. 4.1, Table 6) are BiT ResNets: every convolution is weight-
standardised (timm's ``StdConv2d``) and every normalisation is GroupNorm (timm's
``GroupNormAct``), so nothing depends on the batch (``norm='group'``, the default). ``norm='batch'``
gives the small-image ResNets of He et al. (2016, CIFAR) instead: plain convolutions and
BatchNorm (timm's ``BatchNormAct2d``), which train narrow nets at 28-32 px faster than GroupNorm
with weight standardisation (whose per-sample statistics BiT chose for large-batch transfer). The blocks, stages and head are timm's
(``timm.models.resnetv2``: ``Bottleneck``, ``PreActBottleneck``, ``PreActBasic``, ``ResNetStage``,
``ClassifierHead``), and the module names are ``ResNetV2``'s (``stem``, ``stages.i.blocks.j``,
``norm``, ``head``), so state dicts line up with timm's. What this file adds:

- ``stem``: ``imagenet`` is timm's (7x7/2 conv + 3x3/2 max-pool, stride 4; ``padding='same'``
  gives the TF 'SAME' padding of the original JAX hybrid and BiT code, for their weights);
  ``small`` is for 28-32 px images: one 3x3 stride-1 conv and no pooling (stride 1), so a
  28 px image keeps its resolution into stage 1.
- ``cbam``: the Convolutional Block Attention Module (Woo et al., ECCV 2018, arXiv:1807.06521)
  inside every residual block, so attention-augmented CNNs sit on the same axes as the plain
  ones (``CBAM`` below).
- keyword configuration validated up front, ``num_classes`` / ``input_shape`` for
  ``ImageClassifier``, and the total ``stride`` (input pixels per feature-map pixel).

Stages: stage 0 keeps the stem's resolution, every later stage halves it (stride on the 3x3
conv, timm's convention). Total stride = stem stride x 2 ** (len(layers) - 1): ``imagenet``
with 4 stages is the usual 32, ``small`` with 3 stages is 4 (28 px -> a 7x7 map).

Blocks (``block``):
- ``bottleneck``: post-activation bottleneck (1x1, 3x3, 1x1; GN after each; ReLU after the
  sum), timm's ``Bottleneck``: the ViT paper's hybrid stem (vit_jax ``ResidualUnit``).
- ``preact_bottleneck``: pre-activation bottleneck (GN+ReLU before each conv), the BiT
  ResNet-v2 block; the network ends with a GN+ReLU (``norm``).
- ``preact_basic``: pre-activation basic block (two 3x3 convs), for shallow small-image nets.

Shapes: images (B, in_chans, H, W) -> ``forward_features`` (B, num_features, H/stride, W/stride)
-> ``forward_head(x, pre_logits=True)`` (B, num_features) pooled features -> logits
(B, num_classes). With ``num_classes=0, pool='none'`` the forward returns the feature map
(the hybrid's backbone, as timm builds it).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from functools import partial
from typing import Callable, Literal, Optional

import torch
from torch import nn
from timm.layers import BatchNormAct2d, ClassifierHead, GroupNormAct, create_conv2d, StdConv2d, StdConv2dSame, calculate_drop_path_rates, make_divisible
from timm.models.resnetv2 import Bottleneck, PreActBasic, PreActBottleneck, ResNetStage, create_resnetv2_stem

from utils.choices import check_choice, choices

StemKind = Literal["imagenet", "small"]
BlockKind = Literal["bottleneck", "preact_bottleneck", "preact_basic"]
Padding = Literal["symmetric", "same"]
ResNetPool = Literal["avg", "none"]
NormKind = Literal["group", "batch"]
NORMS = choices(NormKind)
STEMS = choices(StemKind)
BLOCKS = choices(BlockKind)
PADDINGS = choices(Padding)
POOLS = choices(ResNetPool)
STEM_STRIDE = {"imagenet": 4, "small": 1}
#: stage widths (output channels at width 1) of the standard ResNets, per block family
DEFAULT_CHANNELS = {
    "bottleneck": (256, 512, 1024, 2048),
    "preact_bottleneck": (256, 512, 1024, 2048),
    "preact_basic": (64, 128, 256, 512),
}
#: weight-standardisation epsilon of the BiT and ViT-hybrid releases (timm uses the same)
STD_CONV_EPS = 1e-8


def _check_int_sequence(name: str, values, minimum: int) -> tuple[int, ...]:
    try:
        values = tuple(values)
    except TypeError:
        raise ValueError(f"{name}={values!r} must be a sequence of integers >= {minimum}") from None
    if not values or any(not isinstance(v, int) or isinstance(v, bool) or v < minimum for v in values):
        raise ValueError(f"{name}={values!r} must be a non-empty sequence of integers >= {minimum}")
    return values


def validate_resnet_config(
    *,
    img_size: int,
    in_chans: int,
    num_classes: int,
    layers: Sequence[int],
    channels: Optional[Sequence[int]],
    width_factor: float,
    stem: StemKind,
    stem_chs: int,
    block: BlockKind,
    padding: Padding,
    cbam: bool,
    cbam_reduction: int,
    cbam_kernel_size: int,
    gn_groups: int,
    dropout: float,
    drop_path: float,
    pool: ResNetPool,
    zero_init_last: bool = False,
    norm: NormKind = "group",
) -> None:
    """Raise ValueError naming the first invalid value; called before any module is built."""
    check_choice("stem", stem, StemKind)
    check_choice("norm", norm, NormKind)
    check_choice("block", block, BlockKind)
    check_choice("padding", padding, Padding)
    check_choice("pool", pool, ResNetPool)
    for name, value in (("img_size", img_size), ("in_chans", in_chans), ("stem_chs", stem_chs),
                        ("cbam_reduction", cbam_reduction), ("gn_groups", gn_groups)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive integer")
    if not isinstance(num_classes, int) or num_classes < 0:
        raise ValueError(f"num_classes={num_classes!r} must be a positive integer (0: no classifier, features only)")
    if pool == "none" and num_classes:
        raise ValueError(f"pool='none' returns the feature map and needs num_classes=0, got num_classes={num_classes}")
    layers = _check_int_sequence("layers", layers, 1)
    if channels is not None:
        channels = _check_int_sequence("channels", channels, 1)
        if len(channels) != len(layers):
            raise ValueError(
                f"channels={list(channels)} must give one width per stage of layers={list(layers)} "
                f"({len(layers)} values), or be None for {list(DEFAULT_CHANNELS[block][:len(layers)])}"
            )
    elif len(layers) > len(DEFAULT_CHANNELS[block]):
        raise ValueError(
            f"layers={list(layers)} has {len(layers)} stages; give channels for each, the default widths "
            f"{list(DEFAULT_CHANNELS[block])} cover {len(DEFAULT_CHANNELS[block])}"
        )
    if not width_factor > 0:
        raise ValueError(f"width_factor={width_factor!r} must be positive")
    if zero_init_last and (block != "bottleneck" or norm != "group"):
        raise ValueError(
            f"zero_init_last=True needs block='bottleneck' and norm='group' (it zeroes the last GroupNorm scale), "
            f"got block={block!r}, norm={norm!r}: "
            "in pre-activation blocks it would zero a weight-standardised conv, whose standardisation has a "
            "1/sqrt(eps) gradient at zero"
        )
    if cbam and (cbam_kernel_size < 1 or cbam_kernel_size % 2 == 0):
        raise ValueError(f"cbam_kernel_size={cbam_kernel_size!r} must be a positive odd integer (e.g. 7)")
    for name, value in (("dropout", dropout), ("drop_path", drop_path)):
        if not 0.0 <= value < 1.0:
            raise ValueError(f"{name}={value!r} must be in [0, 1)")


def group_norm_act(num_channels: int, *, num_groups: int = 32, **kwargs) -> GroupNormAct:
    """timm's ``GroupNormAct`` (GroupNorm then ReLU unless ``apply_act=False``) with
    gcd(num_groups, num_channels) groups: the BiT 32 groups where the width allows (every
    width of the standard ResNets), fewer for the narrow small-image nets."""
    return GroupNormAct(num_channels, num_groups=math.gcd(num_groups, num_channels), **kwargs)


def plain_conv(in_chs: int, out_chs: int, kernel_size: int, *, padding: str = "", bias: bool = False, **kwargs) -> nn.Module:
    """A convolution without weight standardisation or bias (a BatchNorm follows or precedes it),
    padded as ``StdConv2d`` pads (``padding='same'``: TF 'SAME'); timm's ``create_conv2d``."""
    return create_conv2d(in_chs, out_chs, kernel_size, padding=padding, bias=bias, **kwargs)


# --------------------------------------------------------------------------------------- CBAM


class ChannelAttention(nn.Module):
    """CBAM channel attention (Woo et al. 2018, Sec. 3, Eq. 2):
    M_c(F) = sigmoid(MLP(AvgPool(F)) + MLP(MaxPool(F))), one MLP (C -> C/r -> C, ReLU, no
    biases) shared by the two spatially pooled descriptors.

    F (B, C, H, W) -> the map M_c (B, C, 1, 1), values in (0, 1); the caller multiplies.
    """

    def __init__(self, channels: int, *, reduction: int = 16) -> None:
        super().__init__()
        hidden = max(1, channels // reduction)
        self.mlp = nn.Sequential(
            nn.Linear(channels, hidden, bias=False), nn.ReLU(inplace=True), nn.Linear(hidden, channels, bias=False)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.mlp(x.mean(dim=(2, 3))) + self.mlp(x.amax(dim=(2, 3)))  # (B, C)
        return torch.sigmoid(logits)[:, :, None, None]


class SpatialAttention(nn.Module):
    """CBAM spatial attention (Sec. 3, Eq. 3): M_s(F) = sigmoid(f7x7([AvgPool_c(F); MaxPool_c(F)])),
    the channel-wise mean and max stacked as 2 channels through one k x k convolution.

    A plain convolution with a bias, as in the equation (the reference code and timm add a
    BatchNorm, which would make these ResNets depend on the batch; BiT avoids that).
    F (B, C, H, W) -> the map M_s (B, 1, H, W), values in (0, 1).
    """

    def __init__(self, *, kernel_size: int = 7) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 1, kernel_size, padding=kernel_size // 2, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = torch.cat([x.mean(dim=1, keepdim=True), x.amax(dim=1, keepdim=True)], dim=1)  # (B, 2, H, W)
        return torch.sigmoid(self.conv(pooled))


class CBAM(nn.Module):
    """Convolutional Block Attention Module (Woo et al., ECCV 2018, Eq. 1): channel attention,
    then spatial attention on the channel-refined features, applied in sequence:
    F' = M_c(F) * F,  F'' = M_s(F') * F'. (B, C, H, W) -> (B, C, H, W).

    The maps are the outputs of ``channel`` (B, C, 1, 1) and ``spatial`` (B, 1, H, W); read
    them with forward hooks on those two modules.
    """

    def __init__(self, channels: int, *, reduction: int = 16, kernel_size: int = 7) -> None:
        super().__init__()
        self.channel = ChannelAttention(channels, reduction=reduction)
        self.spatial = SpatialAttention(kernel_size=kernel_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * self.channel(x)
        return x * self.spatial(x)


# Residual blocks with CBAM on the residual branch, before the sum with the shortcut
# (CBAM Fig. 3): timm's blocks, forward written out with the one added line.


class CBAMBottleneck(Bottleneck):
    """timm's post-activation ``Bottleneck`` with ``CBAM`` after its last norm."""

    def __init__(self, in_chs: int, out_chs: Optional[int] = None, *, cbam_reduction: int = 16,
                 cbam_kernel_size: int = 7, **kwargs) -> None:
        super().__init__(in_chs, out_chs, **kwargs)
        self.cbam = CBAM(out_chs or in_chs, reduction=cbam_reduction, kernel_size=cbam_kernel_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        x = self.norm1(self.conv1(x))
        x = self.norm2(self.conv2(x))
        x = self.norm3(self.conv3(x))
        x = self.cbam(x)
        return self.act3(self.drop_path(x) + shortcut)


class CBAMPreActBottleneck(PreActBottleneck):
    """timm's ``PreActBottleneck`` with ``CBAM`` after its last conv."""

    def __init__(self, in_chs: int, out_chs: Optional[int] = None, *, cbam_reduction: int = 16,
                 cbam_kernel_size: int = 7, **kwargs) -> None:
        super().__init__(in_chs, out_chs, **kwargs)
        self.cbam = CBAM(out_chs or in_chs, reduction=cbam_reduction, kernel_size=cbam_kernel_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_preact = self.norm1(x)
        shortcut = x if self.downsample is None else self.downsample(x_preact)
        x = self.conv1(x_preact)
        x = self.conv2(self.norm2(x))
        x = self.conv3(self.norm3(x))
        x = self.cbam(x)
        return self.drop_path(x) + shortcut


class CBAMPreActBasic(PreActBasic):
    """timm's ``PreActBasic`` with ``CBAM`` after its second conv."""

    def __init__(self, in_chs: int, out_chs: Optional[int] = None, *, cbam_reduction: int = 16,
                 cbam_kernel_size: int = 7, **kwargs) -> None:
        super().__init__(in_chs, out_chs, **kwargs)
        self.cbam = CBAM(out_chs or in_chs, reduction=cbam_reduction, kernel_size=cbam_kernel_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_preact = self.norm1(x)
        shortcut = x if self.downsample is None else self.downsample(x_preact)
        x = self.conv1(x_preact)
        x = self.conv2(self.norm2(x))
        x = self.cbam(x)
        return self.drop_path(x) + shortcut


_BLOCK_FNS = {
    ("bottleneck", False): Bottleneck,
    ("preact_bottleneck", False): PreActBottleneck,
    ("preact_basic", False): PreActBasic,
    ("bottleneck", True): CBAMBottleneck,
    ("preact_bottleneck", True): CBAMPreActBottleneck,
    ("preact_basic", True): CBAMPreActBasic,
}


def _small_stem(in_chs: int, out_chs: int, *, preact: bool, conv_layer: Callable, norm_layer: Callable) -> nn.Sequential:
    """One 3x3 stride-1 conv (+ GN+ReLU unless pre-activation blocks follow), no pooling."""
    stem = OrderedDict(conv=conv_layer(in_chs, out_chs, kernel_size=3, stride=1))
    if not preact:
        stem["norm"] = norm_layer(out_chs)
    return nn.Sequential(stem)


class ResNet(nn.Module):
    """BiT-style ResNet classifier (or feature backbone), configured by keyword.

    Args:
        img_size: input side in pixels (for ``input_shape``; the convolutions take any size).
        in_chans: input channels.
        num_classes: classes; 0 for no classifier (features only).
        layers: residual blocks per stage, e.g. (3, 4, 6, 3) for ResNet-50.
        channels: output width of each stage at width 1 (default: the standard ResNet widths,
            (256, 512, 1024, 2048) for bottlenecks, (64, 128, 256, 512) for basic blocks).
        width_factor: BiT's width multiplier (ResNet-50x3: 3); widths round to multiples of 8.
        stem: ``imagenet`` (7x7/2 conv + 3x3/2 max-pool) or ``small`` (3x3/1 conv, no pool).
        stem_chs: stem width at width 1.
        block: ``bottleneck`` | ``preact_bottleneck`` (BiT) | ``preact_basic``.
        padding: ``symmetric`` (PyTorch) or ``same`` (TF 'SAME', as the JAX releases).
        cbam: put a CBAM module in every block (see ``CBAM``).
        cbam_reduction: CBAM channel-MLP reduction ratio r.
        cbam_kernel_size: CBAM spatial-attention kernel.
        gn_groups: GroupNorm groups (32 in BiT; gcd with the width for narrow layers).
        norm: ``group`` (BiT: GroupNorm + weight-standardised convs) or ``batch`` (BatchNorm + plain
            convs, the CIFAR ResNets'; the outputs then depend on the batch while training).
        dropout: dropout on the pooled features, before the classifier.
        drop_path: stochastic depth, rising per block to this rate (timm's stage-wise rule).
        zero_init_last: zero the scale of each residual branch's last GroupNorm, so every block
            starts as the identity (vit_jax's hybrid ResNet and timm's hybrid do);
            ``bottleneck`` blocks only.
        pool: ``avg`` (global average pooling) or ``none`` (return the feature map; needs
            ``num_classes=0``).
    """

    def __init__(
        self,
        *,
        img_size: int = 32,
        in_chans: int = 3,
        num_classes: int = 10,
        layers: Sequence[int] = (2, 2, 2),
        channels: Optional[Sequence[int]] = None,
        width_factor: float = 1.0,
        stem: StemKind = "small",
        stem_chs: int = 64,
        block: BlockKind = "preact_bottleneck",
        padding: Padding = "symmetric",
        cbam: bool = False,
        cbam_reduction: int = 16,
        cbam_kernel_size: int = 7,
        gn_groups: int = 32,
        dropout: float = 0.0,
        drop_path: float = 0.0,
        zero_init_last: bool = False,
        pool: ResNetPool = "avg",
        norm: NormKind = "group",
    ) -> None:
        validate_resnet_config(
            img_size=img_size, in_chans=in_chans, num_classes=num_classes, layers=layers, channels=channels,
            width_factor=width_factor, stem=stem, stem_chs=stem_chs, block=block, padding=padding, cbam=cbam,
            cbam_reduction=cbam_reduction, cbam_kernel_size=cbam_kernel_size, gn_groups=gn_groups,
            dropout=dropout, drop_path=drop_path, pool=pool, zero_init_last=zero_init_last, norm=norm,
        )
        super().__init__()
        layers = tuple(layers)
        channels = tuple(channels) if channels is not None else DEFAULT_CHANNELS[block][: len(layers)]
        preact = block.startswith("preact")
        if norm == "batch":
            conv_layer = partial(plain_conv, padding="same" if padding == "same" else "")
            norm_layer = BatchNormAct2d
        else:
            conv_layer = partial(StdConv2dSame if padding == "same" else StdConv2d, eps=STD_CONV_EPS)
            norm_layer = partial(group_norm_act, num_groups=gn_groups)

        self.img_size = img_size
        self.in_chans = in_chans
        self.num_classes = num_classes
        self.layers = layers
        self.block = block
        self.stem_kind = stem
        self.cbam = cbam
        self.zero_init_last = zero_init_last
        self.norm_kind = norm

        stem_width = make_divisible(stem_chs * width_factor)
        if stem == "imagenet":
            self.stem = create_resnetv2_stem(
                in_chans, stem_width, "same" if padding == "same" else "", preact,
                conv_layer=conv_layer, norm_layer=norm_layer,
            )
        else:
            self.stem = _small_stem(in_chans, stem_width, preact=preact, conv_layer=conv_layer, norm_layer=norm_layer)
        stride = STEM_STRIDE[stem]
        self.feature_info = [dict(num_chs=stem_width, reduction=stride, module="stem")]

        block_fn = _BLOCK_FNS[(block, cbam)]
        if cbam:
            block_fn = partial(block_fn, cbam_reduction=cbam_reduction, cbam_kernel_size=cbam_kernel_size)
        block_dprs = calculate_drop_path_rates(drop_path, list(layers), stagewise=True)
        self.stages = nn.Sequential()
        prev = stem_width
        for i, (depth, width, dprs) in enumerate(zip(layers, channels, block_dprs)):
            out = make_divisible(width * width_factor)
            stage_stride = 1 if i == 0 else 2
            self.stages.add_module(str(i), ResNetStage(
                prev, out, stride=stage_stride, dilation=1, depth=depth,
                bottle_ratio=1.0 if block == "preact_basic" else 0.25,
                block_dpr=dprs, block_fn=block_fn,
                act_layer=nn.ReLU, conv_layer=conv_layer, norm_layer=norm_layer,
            ))  # fmt: skip
            prev = out
            stride *= stage_stride
            self.feature_info.append(dict(num_chs=out, reduction=stride, module=f"stages.{i}"))
        self.stride = stride
        self.num_features = self.head_hidden_size = prev
        self.norm = norm_layer(prev) if preact else nn.Identity()  # pre-activation nets end with GN+ReLU
        self.head = ClassifierHead(
            prev, num_classes, pool_type="avg" if pool == "avg" else "", drop_rate=dropout, use_conv=True
        )
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """BiT/timm ResNetV2 init: He-normal (fan-out) convolutions, N(0, 0.01) classifier,
        unit/zero norms, optionally zero-init last; CBAM keeps PyTorch's default init."""
        for name, m in self.named_modules():
            if ".cbam." in f".{name}.":  # inside CBAM: PyTorch's defaults
                if hasattr(m, "reset_parameters"):
                    m.reset_parameters()
            elif name == "head.fc" and isinstance(m, nn.Conv2d):
                nn.init.normal_(m.weight, std=0.01)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, (nn.GroupNorm, nn.BatchNorm2d)):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        if self.zero_init_last:  # validated: post-activation bottlenecks only
            for m in self.modules():
                if isinstance(m, Bottleneck):
                    m.zero_init_last()  # the last GroupNorm's scale

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, in_chans, H, W) -> feature map (B, num_features, H/stride, W/stride)."""
        return self.norm(self.stages(self.stem(x)))

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Feature map -> pooled features (B, num_features) if ``pre_logits``, else logits."""
        return self.head(x, pre_logits=True) if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        """Nothing beyond what ImageClassifier already exempts (norms and biases, < 2 dims)."""
        return set()

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """(channels, height, width) of one input image."""
        return (self.in_chans, self.img_size, self.img_size)

    @property
    def feature_size(self) -> tuple[int, int]:
        """Side of the final feature map for ``img_size`` inputs (ceil: stride-2 layers pad)."""
        side = math.ceil(self.img_size / self.stride)
        return (side, side)

"""models/hybrid.py: ResNet stem + ViT (timm's HybridEmbed), the paper's two constructions."""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.nn.functional as F
from timm.layers import HybridEmbed
from timm.models.vision_transformer import VisionTransformer
from timm.models.vision_transformer_hybrid import _resnetv2

from models.hybrid import CONSTRUCTIONS, HYBRIDS, HybridViT, create_hybrid, stage_layers
from models.resnet import Bottleneck
from models.vit import explicit_attention
from tests.helpers import assert_every_parameter_trains

TINY = dict(img_size=16, in_chans=1, num_classes=4, backbone_layers=(1, 1, 1), backbone_channels=(16, 32, 48),
            stem_chs=8, embed_dim=16, depth=2, num_heads=2, mlp_ratio=2.0)  # fmt: skip


def tiny(seed: int = 0, **overrides) -> HybridViT:
    torch.manual_seed(seed)
    return HybridViT(**{**TINY, **overrides})


def images(n: int = 2, size: int = 16, chans: int = 1, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, chans, size, size, generator=torch.Generator().manual_seed(seed))


def shapes(model) -> list[tuple[str, tuple[int, ...]]]:
    return [(k, tuple(v.shape)) for k, v in model.state_dict().items()]


# ------------------------------------------------------------------------------ the paper's models


def test_r50_vit_b16_is_timms_by_name_names_shapes_and_count():
    """Built on the meta device (no memory, no forward): the structure is what is compared."""
    import timm

    with torch.device("meta"):
        ours = create_hybrid("r50_vit_b16")
        theirs = timm.create_model("vit_base_r50_s16_224", num_classes=1000)
    assert shapes(ours) == shapes(theirs)
    n = sum(p.numel() for p in ours.parameters())
    assert n == sum(p.numel() for p in theirs.parameters()) == 98_659_112
    # timm's default 224 model (its in21k config) has no head: the 97,890,112 often quoted
    assert n - (768 * 1000 + 1000) == 97_890_112
    assert ours.backbone.layers == (3, 4, 9) and ours.stride == 16 and ours.grid_size == (14, 14)
    with torch.device("meta"):
        at384 = create_hybrid("r50_vit_b16", img_size=384)
    assert sum(p.numel() for p in at384.parameters()) == 98_950_952 and at384.grid_size == (24, 24)


def test_r50_vit_l32_is_timms_and_b32_takes_the_stage4_output():
    import timm

    with torch.device("meta"):
        large = create_hybrid("r50_vit_l32")
        theirs = timm.create_model("vit_large_r50_s32_224", num_classes=1000)
        b32 = create_hybrid("r50_vit_b32")
    assert shapes(large) == shapes(theirs)
    assert b32.backbone.layers == (3, 4, 6, 3) and b32.stride == 32 and b32.grid_size == (7, 7)
    assert set(HYBRIDS) >= {"r50_vit_b16", "r50_vit_b32", "r50_vit_l16"}
    with pytest.raises(ValueError, match=r"unknown hybrid 'r50_vit_h14': use one of \['r50_vit_b16'"):
        create_hybrid("r50_vit_h14")


def test_same_outputs_as_timms_hybrid_with_the_same_weights():
    """A small timm hybrid (ResNetV2 stem, SAME padding, non-pre-activation bottlenecks,
    HybridEmbed, VisionTransformer) computes the same function once given our weights."""
    torch.manual_seed(0)
    ours = HybridViT(img_size=32, in_chans=3, num_classes=5, backbone_layers=(1, 1, 1), backbone_channels=None,
                     stem="imagenet", stem_chs=64, padding="same", construction="extend_previous",
                     embed_dim=32, depth=2, num_heads=2).eval()  # fmt: skip
    backbone = _resnetv2((1, 2))  # timm's helper: (1, 1, 1) with stage 3 folded into stage 2
    theirs = VisionTransformer(img_size=32, patch_size=1, num_classes=5, embed_dim=32, depth=2, num_heads=2,
                               embed_layer=partial(HybridEmbed, backbone=backbone)).eval()  # fmt: skip
    assert shapes(ours) == shapes(theirs)
    theirs.load_state_dict(ours.state_dict())
    x = images(size=32, chans=3)
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-4, atol=1e-5)


def test_zero_init_last_as_timms_hybrid():
    model = tiny()
    norms = [m.norm3.weight for m in model.modules() if isinstance(m, Bottleneck)]
    assert len(norms) == 3 and all((w == 0).all() for w in norms)


# ------------------------------------------------------------------------------ constructions and grids


@pytest.mark.parametrize(
    "stem,layers,size",
    [("small", (1, 1, 1), 28), ("small", (1, 1, 1), 32), ("small", (2, 1), 16), ("imagenet", (1, 1, 1), 64)],
)
@pytest.mark.parametrize("construction", CONSTRUCTIONS)
def test_token_grid_matches_the_cnn_output_stride(stem, layers, size, construction):
    model = tiny(img_size=size, stem=stem, backbone_layers=layers, backbone_channels=(16, 32, 48)[: len(layers)],
                 construction=construction)  # fmt: skip
    built = stage_layers(layers, construction)
    assert model.backbone.layers == built
    assert built == (layers if construction == "last_stage" else layers[:-2] + (layers[-2] + layers[-1],))
    stem_stride = 4 if stem == "imagenet" else 1
    assert model.cnn_stride == model.backbone.stride == stem_stride * 2 ** (len(built) - 1)
    x = images(size=size)
    fmap = model.backbone(x)
    side = size // model.stride
    assert tuple(fmap.shape[-2:]) == model.grid_size == (side, side)
    assert model.stride == size // model.grid_size[0]  # the grid-to-pixel factor analysis uses
    assert model.patch_embed.feat_ratio() == model.stride
    tokens = model.forward_features(x)
    assert tuple(tokens.shape) == (2, side * side + 1, 16)


def test_extending_stage3_gives_a_4x_longer_sequence():
    last = tiny(img_size=32, construction="last_stage")
    extended = tiny(img_size=32, construction="extend_previous")
    assert extended.stride * 2 == last.stride
    assert extended.patch_embed.num_patches == 4 * last.patch_embed.num_patches
    assert sum(extended.backbone.layers) == sum(last.backbone.layers)  # the blocks are kept, not dropped


def test_patch_size_groups_feature_map_pixels():
    model = tiny(img_size=32, patch_size=2)
    assert model.cnn_stride == 4 and model.stride == 8 and model.grid_size == (4, 4)


# ------------------------------------------------------------------------------ every ViT axis


@pytest.mark.parametrize(
    "vit",
    [
        dict(),
        dict(pool="gap", pos_embed="learned_2d"),
        dict(pos_embed="sincos_2d", pos_placement="every_layer"),
        dict(pos_embed="learned_1d", pos_placement="every_layer_shared"),
        dict(pos_embed="relative"),
        dict(pos_embed="relative_2d", pool="gap"),
        dict(pos_embed="none", attention="additive"),
    ],
    ids=lambda d: "-".join(f"{v}" for v in d.values()) or "default",
)
def test_every_parameter_gets_a_gradient(vit):
    model = tiny(zero_init_last=False, **vit)
    model(images()).logsumexp(dim=1).sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing


def test_with_zero_init_every_parameter_trains_after_a_step():
    assert_every_parameter_trains(tiny(), images())


def test_explicit_attention_and_position_tables_use_the_feature_grid():
    model = tiny(img_size=28, pos_embed="learned_2d").eval()
    assert model.grid_size == (7, 7)
    assert tuple(model.absolute_pos_embed().shape) == (1, 50, 16)
    with explicit_attention(model) as weights:
        logits = model(images(size=28))
    assert tuple(weights[0].shape) == (2, 2, 50, 50)
    torch.testing.assert_close(logits, model(images(size=28)), rtol=1e-4, atol=1e-5)
    assert any(name.startswith("pos_stem") for name in model.no_weight_decay())


def test_classifier_module_and_flops():
    from lightning_modules.image_classifier import ImageClassifier
    from lightning_modules.model_stats import count_flops

    model = tiny(img_size=28)
    module = ImageClassifier(model)
    assert module.num_classes == 4 and model.input_shape == (1, 28, 28)
    assert count_flops(model, torch.zeros(1, 1, 28, 28)) > 0


# ------------------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    "overrides,match",
    [
        (dict(construction="stage5"), r"construction='stage5' is not one of \['last_stage', 'extend_previous'\]"),
        (dict(backbone_layers=(2,), backbone_channels=(16,), construction="extend_previous"),
         r"needs at least 2 stages, got backbone_layers=\[2\]"),
        (dict(img_size=18), r"img_size=18 is not a multiple of the token stride 4 .* image sizes that work: \[4, 8, 12, 16\]"),
        (dict(img_size=16, patch_size=3), r"patch_size=3 does not divide img_size=16"),
        (dict(backbone_channels=(16, 32)), r"channels=\[16, 32\] must give one width per stage"),
        (dict(stem="tiny"), r"stem='tiny' is not one of \['imagenet', 'small'\]"),
        (dict(block="preact_bottleneck"), r"zero_init_last=True needs block='bottleneck'"),
        (dict(pos_embed="rotary"), r"pos_embed='rotary' is not one of"),
        (dict(pool="max"), r"pool='max' is not one of \['cls', 'gap'\]"),
    ],
)
def test_bad_config_fails_before_building(overrides, match, monkeypatch):
    import models.hybrid

    def never(**_):
        raise AssertionError("the CNN was built before the config was validated")

    monkeypatch.setattr(models.hybrid, "ResNet", never)
    with pytest.raises(ValueError, match=match):
        tiny(**overrides)


# ------------------------------------------------------------------------------ ViT with a conv stem (ViT_C)

from models.hybrid import ConvStemViT, conv_stem_strides  # noqa: E402

CTINY = dict(img_size=16, in_chans=1, num_classes=4, patch_size=4, stem_channels=(8, 16), embed_dim=16, depth=2,
             num_heads=2, mlp_ratio=2.0)  # fmt: skip


def ctiny(seed: int = 0, **overrides) -> ConvStemViT:
    torch.manual_seed(seed)
    return ConvStemViT(**{**CTINY, **overrides})


@pytest.mark.parametrize(
    "patch,convs,expected", [(4, 2, (2, 2)), (4, 3, (2, 2, 1)), (16, 5, (2, 2, 2, 2, 1)), (1, 2, (1, 1))]
)
def test_conv_stem_default_strides_halve_first(patch, convs, expected):
    assert conv_stem_strides(patch, convs) == expected


def test_conv_stem_vit_is_convs_then_a_1x1_projection_then_the_vit():
    """The token embedding is exactly stem convs (3x3, BN, ReLU) followed by the 1x1 projection;
    the rest is the ViT's forward."""
    model = ctiny(img_size=28, stem_channels=(8, 16, 24), stem_strides=(1, 2, 2)).eval()
    x = images(size=28)
    assert model.grid_size == (7, 7) and model.stride == 4 and model.patch_embed.proj.kernel_size == (1, 1)
    convs = [m for m in model.stem.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.kernel_size, c.stride) for c in convs] == [
        (1, 8, (3, 3), (1, 1)), (8, 16, (3, 3), (2, 2)), (16, 24, (3, 3), (2, 2))]
    feats = model.stem(x)
    assert tuple(feats.shape) == (2, 24, 7, 7) and (feats >= 0).all()  # ReLU last
    tokens = model.patch_embed.proj(feats).flatten(2).transpose(1, 2)
    torch.testing.assert_close(model.patch_embed(x), tokens)
    torch.testing.assert_close(model(x), model.forward_head(model.forward_features(x)))
    assert any(isinstance(m, torch.nn.BatchNorm2d) for m in model.stem.modules())


def test_conv_stem_maxpool_downsample_is_a_stride_1_conv_then_a_2x2_max_pool():
    """``downsample='maxpool'``: each stride-2 conv runs at stride 1 and a 2x2 max-pool follows its
    ReLU; stride-1 convs are unchanged; the grid, the stride in pixels and the forward are the ViT's."""
    strided = ctiny(img_size=28, stem_channels=(8, 16, 24), stem_strides=(1, 2, 2)).eval()
    model = ctiny(img_size=28, stem_channels=(8, 16, 24), stem_strides=(1, 2, 2), downsample="maxpool").eval()
    convs = [m for m in model.stem.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.stride) for c in convs] == [(1, 8, (1, 1)), (8, 16, (1, 1)), (16, 24, (1, 1))]
    assert sum(isinstance(m, torch.nn.MaxPool2d) for m in model.stem.modules()) == 2
    assert model.grid_size == strided.grid_size == (7, 7) and model.stride == 4 and model.downsample == "maxpool"
    # the same parameter names as the strided stem: its weights load; each stride-2 stage is then
    # its conv at stride 1, BatchNorm + ReLU, and the max-pool
    model.load_state_dict(strided.state_dict())
    x = h = images(size=28)
    for stage, ref in zip(model.stem, strided.stem):
        expected = ref.bn(F.conv2d(h, ref.conv.weight, padding=1))  # bn: BatchNorm + ReLU
        if ref.conv.stride == (2, 2):
            expected = F.max_pool2d(expected, 2)
        torch.testing.assert_close(stage(h), expected)
        h = expected
    torch.testing.assert_close(model.stem(x), h)
    assert tuple(model(x).shape) == (2, 4)
    with pytest.raises(ValueError, match=r"downsample='avgpool' is not one of \['stride', 'maxpool'\]"):
        ctiny(downsample="avgpool")


def test_conv_stem_vit_trains_and_reads_like_a_hybrid():
    from analysis.attention import pixels_per_token

    model = ctiny(pos_embed="learned_2d")
    loss = torch.nn.functional.cross_entropy(model(images(n=4)), torch.tensor([0, 1, 2, 3]))
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    assert pixels_per_token(model.patch_embed) == (4.0, 4.0)
    with explicit_attention(model.eval()) as weights:
        model(images())
    assert tuple(weights[1].shape) == (2, 2, 17, 17)


@pytest.mark.parametrize(
    "overrides,match",
    [
        (dict(patch_size=4, stem_channels=(8,)), r"patch_size=4 needs 2 stride-2 convs: give at least 2 widths"),
        (dict(patch_size=2, img_size=18, stem_channels=(8,), stem_strides=(2, 2)),
         r"must give a stride of 1 or 2 for each of the 1 convs"),
        (dict(stem_strides=(2, 1)), r"stem_strides=\[2, 1\] reduce the image by 2, but patch_size=4"),
        (dict(stem_strides=(3, 1)), r"must give a stride of 1 or 2"),
        (dict(stem_channels=()), r"stem_channels=\(\) must be a non-empty list"),
        (dict(img_size=18, patch_size=6, stem_channels=(8, 8)), r"patch_size=6 does not divide img_size=18|patch_size=6 is not a power of 2"),
        (dict(img_size=24, patch_size=6, stem_channels=(8, 8)), r"patch_size=6 is not a power of 2: give stem_strides"),
        (dict(pool="max"), r"pool='max' is not one of"),
    ],
)
def test_conv_stem_bad_config_fails_with_the_value(overrides, match):
    with pytest.raises(ValueError, match=match):
        ctiny(**overrides)


# ------------------------------------------------------------------------------ airbench's stem: whitening + conv groups

from models.hybrid import ConvGroup, PatchWhitening  # noqa: E402


def test_patch_whitening_makes_the_patch_covariance_the_identity():
    """After ``fit``, the 2x2 patches of the images it saw come out decorrelated with unit
    variance (up to ``eps``) in the first half of the channels, negated in the second; the weight
    does not train, the map keeps its size and ``fitted`` flips."""
    torch.manual_seed(0)
    mixing = torch.tensor([[1.0, 0.8, 0.2], [0.0, 1.0, 0.5], [0.3, 0.0, 1.0]])
    x = torch.einsum("dc,nchw->ndhw", mixing, torch.randn(64, 3, 12, 12))  # correlated channels
    x = x + 0.5 * torch.roll(x, 1, dims=-1)  # and neighbouring pixels
    layer = PatchWhitening(3, eps=1e-6)
    assert layer.out_channels == 24 and not layer.weight.requires_grad and not bool(layer.fitted)
    layer.fit(x)
    assert bool(layer.fitted)
    out = F.conv2d(x, layer.weight[:12])  # valid 2x2 patches only, no bias
    flat = out.transpose(0, 1).reshape(12, -1)
    torch.testing.assert_close(flat @ flat.T / flat.shape[1], torch.eye(12), atol=2e-3, rtol=0)
    torch.testing.assert_close(layer.weight[12:], -layer.weight[:12])
    assert tuple(layer(x).shape) == (64, 24, 12, 12)
    restored = PatchWhitening(3)
    restored.load_state_dict(layer.state_dict())
    assert bool(restored.fitted) and torch.equal(restored.weight, layer.weight)
    with pytest.raises(ValueError, match=r"needs images \(N, 3, H, W\), got shape \(4, 1, 8, 8\)"):
        layer.fit(torch.zeros(4, 1, 8, 8))


def test_conv_group_is_airbench_s_two_convs_with_a_pool_after_the_first():
    """conv, [2x2 max-pool], BatchNorm (scale fixed at 1), GELU, conv, BatchNorm, GELU; each conv
    starts as the identity on its first input channels."""
    torch.manual_seed(0)
    group = ConvGroup(4, 6, stride=2).eval()
    assert not group.norm1.weight.requires_grad and not group.norm2.weight.requires_grad
    assert group.norm1.momentum == 0.4
    x = torch.randn(2, 4, 8, 8)
    torch.testing.assert_close(group.conv1(x)[:, :4], x)  # Dirac: identity on the first 4 filters
    h = F.gelu(group.norm1(F.max_pool2d(group.conv1(x), 2)))
    torch.testing.assert_close(group(x), F.gelu(group.norm2(group.conv2(h))))
    assert tuple(group(x).shape) == (2, 6, 4, 4)
    assert tuple(ConvGroup(4, 6, stride=1)(x).shape) == (2, 6, 8, 8)


def test_conv_stem_vit_with_whitening_and_groups():
    """``whiten=True`` + ``stem_block='group'``: whitening conv, GELU, one group per width; the
    grid is img_size / patch_size; ``needs_images`` asks for images until the whitening is fitted."""
    model = ctiny(in_chans=3, stem_channels=(8, 16), stem_block="group", whiten=True, downsample="maxpool")
    assert isinstance(model.whitening, PatchWhitening) and model.whitening.out_channels == 24
    assert [type(m).__name__ for m in model.stem] == ["PatchWhitening", "GELU", "ConvGroup", "ConvGroup"]
    assert model.grid_size == (4, 4) and model.needs_images() == 5000
    x = torch.randn(8, 3, 16, 16)
    model.fit_to_images(x)
    assert model.needs_images() == 0 and tuple(model(x).shape) == (8, 4)
    assert ctiny(stem_block="group", downsample="maxpool").whitening is None
    assert ctiny().needs_images() == 0
    with pytest.raises(ValueError, match=r"stem_block='group' halves the map with a 2x2 max-pool .* set downsample: maxpool"):
        ctiny(stem_block="group")
    with pytest.raises(ValueError, match=r"stem_block='resnet' is not one of \['conv', 'group'\]"):
        ctiny(stem_block="resnet")

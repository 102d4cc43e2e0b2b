"""models/resnet.py: BiT-style ResNets (timm's blocks, small-image stems) and the CBAM block."""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.nn.functional as F
from timm.layers import StdConv2d
from timm.models.resnetv2 import Bottleneck, ResNetV2

from models.resnet import BLOCKS, CBAM, ChannelAttention, ResNet, SpatialAttention
from tests.helpers import assert_every_parameter_trains

SMALL = dict(img_size=16, in_chans=1, num_classes=4, layers=(1, 1, 1), channels=(32, 48, 64), stem_chs=16)


def small(seed: int = 0, **overrides) -> ResNet:
    torch.manual_seed(seed)
    return ResNet(**{**SMALL, **overrides})


def images(n: int = 3, size: int = 16, chans: int = 1, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, chans, size, size, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("cbam", [False, True], ids=["plain", "cbam"])
@pytest.mark.parametrize("block", BLOCKS)
def test_every_parameter_gets_a_gradient(block, cbam):
    model = small(block=block, cbam=cbam, drop_path=0.1)
    model(images()).logsumexp(dim=1).sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing
    if cbam:
        assert sum(isinstance(m, CBAM) for m in model.modules()) == 3  # one per block


def test_zero_init_last_starts_blocks_as_identity_and_every_parameter_trains_after_a_step():
    model = small(block="bottleneck", zero_init_last=True)
    norms = [m.norm3.weight for m in model.modules() if isinstance(m, Bottleneck)]
    assert norms and all((w == 0).all() for w in norms)
    assert_every_parameter_trains(model, images())


def test_cbam_maps_are_in_0_1_with_the_documented_shapes():
    """Channel map (B, C, 1, 1), spatial map (B, 1, H, W) of the block's output, both sigmoids."""
    model = small(block="preact_bottleneck", cbam=True).eval()
    maps: dict[str, list[torch.Tensor]] = {"channel": [], "spatial": []}
    for m in model.modules():
        if isinstance(m, ChannelAttention):
            m.register_forward_hook(lambda mod, inp, out: maps["channel"].append(out))
        if isinstance(m, SpatialAttention):
            m.register_forward_hook(lambda mod, inp, out: maps["spatial"].append(out))
    x = images(n=2)
    model(x)
    # stages: widths 32, 48, 64 at 16, 8, 4 px (small stem: stride 1; then 1, 2, 2)
    assert [tuple(t.shape) for t in maps["channel"]] == [(2, 32, 1, 1), (2, 48, 1, 1), (2, 64, 1, 1)]
    assert [tuple(t.shape) for t in maps["spatial"]] == [(2, 1, 16, 16), (2, 1, 8, 8), (2, 1, 4, 4)]
    for t in maps["channel"] + maps["spatial"]:
        assert t.min() > 0 and t.max() < 1


def test_cbam_is_channel_then_spatial_attention_as_in_the_paper():
    """M_c = sigmoid(MLP(avg) + MLP(max)); M_s = sigmoid(conv7x7([mean_c; max_c])) of F' = M_c F;
    output M_s(F') F'."""
    torch.manual_seed(0)
    cbam = CBAM(32, reduction=4, kernel_size=7)
    x = torch.randn(2, 32, 6, 6)
    mlp = cbam.channel.mlp
    mc = torch.sigmoid(mlp(x.mean((2, 3))) + mlp(x.amax((2, 3))))[:, :, None, None]
    refined = x * mc
    pooled = torch.cat([refined.mean(1, keepdim=True), refined.amax(1, keepdim=True)], 1)
    ms = torch.sigmoid(F.conv2d(pooled, cbam.spatial.conv.weight, cbam.spatial.conv.bias, padding=3))
    torch.testing.assert_close(cbam(x), refined * ms)
    assert mlp[0].out_features == 8 and cbam.spatial.conv.kernel_size == (7, 7)


@pytest.mark.parametrize("cbam", [False, True])
def test_outputs_do_not_depend_on_the_rest_of_the_batch(cbam):
    """Weight standardisation + GroupNorm (and CBAM without BatchNorm): per-sample networks."""
    model = small(cbam=cbam).train()
    x = images(n=4)
    torch.testing.assert_close(model(x)[:1], model(x[:1]), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "stem,layers,size,stride",
    [("small", (1,), 28, 1), ("small", (1, 1), 28, 2), ("small", (1, 1, 1), 28, 4), ("small", (1, 1, 1), 32, 4),
     ("imagenet", (1, 1), 32, 8), ("imagenet", (1, 1, 1, 1), 64, 32)],
)
def test_total_stride_and_feature_map(stem, layers, size, stride):
    channels = (16, 32, 48, 64)[: len(layers)]
    model = ResNet(img_size=size, in_chans=3, num_classes=3, layers=layers, channels=channels, stem=stem, stem_chs=16)
    fmap = model.forward_features(images(n=1, size=size, chans=3))
    side = -(-size // stride)
    assert model.stride == stride and model.feature_size == (side, side)
    assert tuple(fmap.shape) == (1, channels[-1], side, side)
    assert [i["reduction"] for i in model.feature_info][-1] == stride
    assert model.input_shape == (3, size, size) and model.num_classes == 3
    assert tuple(model.forward_head(fmap, pre_logits=True).shape) == (1, channels[-1])


def test_r50_has_timms_bit_parameter_names_and_shapes():
    import timm

    with torch.device("meta"):
        ours = ResNet(img_size=224, num_classes=1000, layers=(3, 4, 6, 3), stem="imagenet", block="preact_bottleneck")
        bit = timm.create_model("resnetv2_50x1_bit", num_classes=1000)
    shapes = lambda m: [(k, tuple(v.shape)) for k, v in m.state_dict().items()]  # noqa: E731
    assert shapes(ours) == shapes(bit)
    assert sum(p.numel() for p in ours.parameters()) == 25_549_352


def test_same_outputs_as_timms_resnetv2_with_the_same_weights():
    """The stages, blocks, norms and head are timm's: load our weights into timm's ResNetV2."""
    ours = ResNet(img_size=32, in_chans=3, num_classes=5, layers=(1, 2), stem="imagenet", block="preact_bottleneck").eval()
    theirs = ResNetV2(layers=[1, 2], num_classes=5, conv_layer=partial(StdConv2d, eps=1e-8)).eval()
    theirs.load_state_dict(ours.state_dict())
    x = images(n=2, size=32, chans=3)
    torch.testing.assert_close(ours(x), theirs(x))


def test_a_classifier_module_accepts_it():
    from lightning_modules.image_classifier import ImageClassifier

    module = ImageClassifier(small())
    assert module.num_classes == 4 and module.net.input_shape == (1, 16, 16)


@pytest.mark.parametrize(
    "overrides,match",
    [
        (dict(stem="big"), r"stem='big' is not one of \['imagenet', 'small'\]"),
        (dict(block="resnext"), r"block='resnext' is not one of \['bottleneck', 'preact_bottleneck', 'preact_basic'\]"),
        (dict(padding="valid"), r"padding='valid' is not one of \['symmetric', 'same'\]"),
        (dict(pool="max"), r"pool='max' is not one of \['avg', 'none'\]"),
        (dict(layers=()), r"layers=\(\) must be a non-empty sequence"),
        (dict(layers=(1, 0)), r"layers=\(1, 0\)"),
        (dict(channels=(32, 64)), r"channels=\[32, 64\] must give one width per stage"),
        (dict(channels=None, layers=(1, 1, 1, 1, 1)), r"give channels for each"),
        (dict(zero_init_last=True, block="preact_bottleneck"), r"zero_init_last=True needs block='bottleneck'"),
        (dict(pool="none"), r"pool='none' .* needs num_classes=0"),
        (dict(cbam=True, cbam_kernel_size=4), r"cbam_kernel_size=4 must be a positive odd"),
        (dict(num_classes=-1), r"num_classes=-1"),
        (dict(drop_path=1.0), r"drop_path=1.0 must be in \[0, 1\)"),
        (dict(width_factor=0), r"width_factor=0 must be positive"),
        (dict(norm="layer"), r"norm='layer' is not one of \['group', 'batch'\]"),
        (dict(zero_init_last=True, block="bottleneck", norm="batch"), r"needs block='bottleneck' and norm='group'"),
    ],
)
def test_bad_config_fails_before_building(overrides, match):
    with pytest.raises(ValueError, match=match):
        small(**overrides)


@pytest.mark.parametrize("block", BLOCKS)
def test_batch_norm_uses_plain_convs_and_batchnorm_and_every_parameter_trains(block):
    """``norm='batch'``: no weight standardisation, BatchNorm everywhere (none of BiT's GroupNorm), every
    parameter gets a gradient, and in training mode an image's output depends on the rest of its batch."""
    model = small(block=block, norm="batch")
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d) and m is not model.head.fc]
    assert convs and not any(isinstance(m, StdConv2d) for m in convs) and all(m.bias is None for m in convs)
    assert not any(isinstance(m, torch.nn.GroupNorm) for m in model.modules())
    assert any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    model(images()).logsumexp(dim=1).sum().backward()
    assert not [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    x = images(4)
    alone, batched = model(x[:2]), model(torch.cat([x[:2], 10 * x[2:]]))[:2]
    assert not torch.allclose(alone, batched)
    model.eval()  # running statistics: per image again
    assert torch.allclose(model(x[:2]), model(torch.cat([x[:2], 10 * x[2:]]))[:2], atol=1e-5)


def test_the_cpu_resnet_config_matches_the_data_size_vits_flops():
    """configs/resnet_cpu_fashion_mnist.yaml: basic blocks, BatchNorm, a stride-1 stem, within 10% of
    the FLOPs per image of vit/data_size's ViT (fashion_mnist.yaml at embed_dim 32, 2 heads)."""
    import yaml

    from lightning_modules.model_stats import count_flops
    from models.vit import ViT

    def net_args(name: str) -> dict:
        text = open(f"reproductions/vit/configs/{name}").read()
        return yaml.safe_load(text)["model"]["init_args"]["net"]["init_args"]

    resnet = ResNet(**net_args("resnet_cpu_fashion_mnist.yaml"))
    vit = ViT(**{**net_args("fashion_mnist.yaml"), "embed_dim": 32, "num_heads": 2})
    assert resnet.block == "preact_basic" and resnet.norm_kind == "batch" and resnet.stride == 4
    x = torch.zeros(1, 1, 28, 28)
    ratio = count_flops(resnet, x) / count_flops(vit, x)
    assert 0.9 < ratio < 1.1, ratio

"""analysis/attention.py: attention capture on our ViT, a plain timm ViT and a timm hybrid."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from timm.models.vision_transformer import Block, VisionTransformer
from torch import nn

from analysis.attention import (
    attention_modules,
    attention_weights,
    capture_attention,
    pixels_per_token,
    token_layout,
)
from models.vit import ViTAttention
from tests.tiny_models import attention_vit as ours
from tests.tiny_models import timm_hybrid as hybrid


def timm_vit(**overrides) -> VisionTransformer:
    torch.manual_seed(0)
    kw = dict(img_size=8, patch_size=2, in_chans=3, num_classes=5, embed_dim=32, depth=2, num_heads=4,
              mlp_ratio=2.0, qkv_bias=True)
    return VisionTransformer(**{**kw, **overrides}).eval()


def images(n=3, size=8, seed=1) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


MODELS = {
    "ours": (ours, 8),
    "ours-gap-learned_2d": (lambda: ours(pool="gap", pos_embed="learned_2d"), 8),
    "ours-relative": (lambda: ours(pos_embed="relative"), 8),
    "timm": (timm_vit, 8),
    "timm-qk_norm": (lambda: timm_vit(qk_norm=True), 8),
    "hybrid-ours": (hybrid, 16),
    "hybrid-timm-blocks": (lambda: hybrid(block_fn=Block), 16),
}


def block_inputs(model, x) -> list[torch.Tensor]:
    """The input of every block, recorded with forward pre-hooks on the blocks."""
    seen = []
    handles = [b.register_forward_pre_hook(lambda m, args: seen.append(args[0].detach())) for b in model.blocks]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
    return seen


def reference_weights(block, x_in: torch.Tensor) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d)) from the block's own projections (no relative bias)."""
    attn = block.attn
    h = block.norm1(x_in)
    b, n, _ = h.shape
    q, k, _ = attn.qkv(h).reshape(b, n, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    q, k = attn.q_norm(q), attn.k_norm(k)
    return torch.softmax(q @ k.transpose(-2, -1) / attn.head_dim ** 0.5, dim=-1)


def block_output_from(block, x_in: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The block's output computed with given attention weights (pre-norm residual block)."""
    attn = block.attn
    h = block.norm1(x_in)
    b, n, _ = h.shape
    v = attn.qkv(h).reshape(b, n, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)[2]
    a = (weights @ v).transpose(1, 2).reshape(b, n, -1)
    x = x_in + block.ls1(attn.proj(attn.norm(a)))
    return x + block.ls2(block.mlp(block.norm2(x)))


@pytest.mark.parametrize("name", [n for n in MODELS if n != "ours-relative"])
def test_captured_weights_are_the_softmax_of_the_projections_and_give_the_fused_output(name):
    build, size = MODELS[name]
    model = build()
    x = images(size=size)
    inputs = block_inputs(model, x)
    w = attention_weights(model, x)
    assert w.shape[:3] == (len(model.blocks), len(x), 4) and w.shape[-1] == w.shape[-2]
    for i, block in enumerate(model.blocks):
        torch.testing.assert_close(w[i], reference_weights(block, inputs[i]), atol=1e-6, rtol=1e-5)
        with torch.no_grad():
            fused = block(inputs[i])  # the training path: fused attention
            assert block.attn.fused_attn
            torch.testing.assert_close(block_output_from(block, inputs[i], w[i]), fused, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)), atol=1e-6, rtol=0)


def test_relative_bias_is_in_the_captured_weights():
    model = ours(pos_embed="relative")
    x = images()
    inputs = block_inputs(model, x)
    w = attention_weights(model, x)
    block = model.blocks[0]
    with torch.no_grad():
        h = block.norm1(inputs[0])
        b, n, _ = h.shape
        q, k, _ = block.attn.qkv(h).reshape(b, n, 3, 4, 8).permute(2, 0, 3, 1, 4)
        expected = torch.softmax(q @ k.transpose(-2, -1) / 8 ** 0.5 + block.attn.rel_pos(q), dim=-1)
        torch.testing.assert_close(w[0], expected, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(block_output_from(block, inputs[0], w[0]), block(inputs[0]), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["ours", "timm", "hybrid-ours"])
def test_capture_changes_no_output_and_restores_the_model(name):
    build, size = MODELS[name]
    model = build()
    x = images(size=size)
    with torch.no_grad():
        before = model(x)
        with capture_attention(model) as weights:
            during = model(x)
            assert not any(m.fused_attn for m in attention_modules(model))
        after = model(x)
    torch.testing.assert_close(during, before, atol=1e-5, rtol=1e-5)
    assert torch.equal(after, before)
    assert len(weights) == len(model.blocks) and weights[0] is not None  # kept after exit
    for m in model.modules():
        assert not m._forward_hooks and not m._forward_pre_hooks, f"{type(m).__name__} kept a hook"
    for m in attention_modules(model):
        assert m.fused_attn
        if isinstance(m, ViTAttention):
            assert not m.return_weights and m.last_weights is None


def test_training_mode_is_restored_and_the_path_stays_fused():
    model = timm_vit().train()
    attention_weights(model, images())
    assert model.training and all(b.attn.fused_attn for b in model.blocks)


def test_attention_mask_passed_to_the_blocks_is_in_the_weights():
    model = timm_vit()
    x = images(1)
    t = 1 + 16
    mask = torch.zeros(t, t, dtype=torch.bool)
    mask[:, :9] = True  # keys 9.. are masked out
    with torch.no_grad(), capture_attention(model) as weights:
        model.forward_features(x, attn_mask=mask)
    assert torch.all(weights[0][..., 9:] == 0) and torch.allclose(weights[0].sum(-1), torch.ones(1, 4, t))


def test_unsupported_attention_is_refused():
    model = timm_vit()

    class Other(nn.Module):
        def forward(self, x, **kw):
            return x

    model.blocks[1].attn = Other()
    with pytest.raises(TypeError, match=r"blocks\[1\]\.attn is Other"):
        attention_weights(model, images())


def test_layout_and_pixels_per_token():
    assert pixels_per_token(ours().patch_embed) == (2.0, 2.0)
    layout = token_layout(ours(pool="gap"))
    assert layout.num_prefix_tokens == 0 and layout.grid_size == (4, 4) and layout.num_tokens == 16
    # the hybrid's grid step is the CNN's total stride (img_size / grid_size), not its patch size 1
    hy = hybrid()
    assert hy.patch_embed.patch_size == (1, 1)
    layout = token_layout(hy)
    assert layout.pixels_per_token == (4.0, 4.0) and layout.grid_size == (4, 4)
    assert layout.num_prefix_tokens == 1
    d = layout.pixel_distances()
    assert d[0, 1] == 4.0 and d[0, 4] == 4.0 and d[0, 5] == pytest.approx(4.0 * 2 ** 0.5)


def test_capture_works_on_a_registered_timm_model():
    import timm

    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32).eval()
    w = attention_weights(model, torch.randn(2, 3, 32, 32))
    assert w.shape == (12, 2, 3, 5, 5)
    torch.testing.assert_close(w.sum(-1), torch.ones(12, 2, 3, 5), atol=1e-6, rtol=0)
    assert F.mse_loss(w, w) == 0  # finite

"""Relative attention (ViT Appendix D.4) checked against independent implementations.

- The paper's definition written out directly: softmax((q_i . k_j + q_i . r_{p_i - p_j}) /
  sqrt(d_head)) @ V, with the offsets computed here from each patch's row and column, one
  (query, key) pair at a time, against ``ViTAttention`` (fused and explicit paths) on the same
  weights.
- timm's BEiT attention (relative position *bias*, a scalar per head and 2-D offset, three
  class-token buckets) against ``pos_embed='relative_2d', rel_logits='bias'`` on copied weights:
  the same index (timm's ``gen_relative_position_index``) and the same outputs.
- The options (``rel_max_offset``, ``rel_prefix``, ``rel_init_std``) and their validation.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from timm.models.beit import Attention as BeitAttention
from timm.models.beit import gen_relative_position_index

from models.position import RelativePositionLogits, relative_position_index
from models.vit import ViT, explicit_attention

DIM, HEADS = 16, 2
HEAD_DIM = DIM // HEADS


def attention_module(kind, grid, prefix, **options):
    torch.manual_seed(0)
    model = ViT(
        img_size=grid[0] * 2, in_chans=1, num_classes=3, patch_size=2, embed_dim=DIM, depth=1,
        num_heads=HEADS, pool="cls" if prefix else "gap", pos_embed=kind, **options,
    )
    assert model.grid_size == grid
    attn = model.blocks[0].attn.eval()
    with torch.no_grad():  # trained-looking weights, not the 0.02 init, so every term matters
        for p in attn.parameters():
            p.normal_(0, 0.5)
    return model, attn


def cells(grid):
    return [(r, c) for r in range(grid[0]) for c in range(grid[1])]  # raster order


def direct_attention(attn, x, offset_key):
    """The paper's relative attention with one loop per (query, key) pair; ``offset_key(i, j)``
    names the learned embedding r of that pair (a row of the table, found by the caller)."""
    b, t, _ = x.shape
    w_qkv, b_qkv = attn.qkv.weight, attn.qkv.bias
    qkv = x @ w_qkv.T + b_qkv
    q, k, v = (qkv[..., i * DIM:(i + 1) * DIM].reshape(b, t, HEADS, HEAD_DIM) for i in range(3))
    out = torch.zeros(b, t, HEADS, HEAD_DIM)
    for h in range(HEADS):
        logits = torch.empty(b, t, t)
        for i, j in itertools.product(range(t), repeat=2):
            r = offset_key(i, j, h)
            logits[:, i, j] = ((q[:, i, h] * k[:, j, h]).sum(-1) + (q[:, i, h] * r).sum(-1)) / HEAD_DIM ** 0.5
        out[:, :, h] = logits.softmax(-1) @ v[:, :, h]
    return attn.proj(out.reshape(b, t, DIM))


@pytest.mark.parametrize("grid", [(3, 3), (4, 4)])
@pytest.mark.parametrize("prefix", [0, 1])
@pytest.mark.parametrize("kind", ["relative", "relative_2d"])
def test_relative_attention_is_softmax_of_q_dot_k_plus_q_dot_r(kind, prefix, grid):
    _, attn = attention_module(kind, grid, prefix)
    table = attn.rel_pos.embed.detach()  # (buckets, heads, d_head)
    h_, w_ = grid
    n = h_ * w_
    pos = cells(grid)
    num_offsets = 2 * n - 1 if kind == "relative" else (2 * h_ - 1) * (2 * w_ - 1)

    def offset_key(i, j, h):
        if prefix and (i == 0 or j == 0):  # BEiT's three class-token buckets, in BEiT's order
            bucket = num_offsets + (2 if i == j == 0 else 0 if i == 0 else 1)
            return table[bucket, h]
        (ri, ci), (rj, cj) = pos[i - prefix], pos[j - prefix]
        if kind == "relative":  # raster offset p_q - p_k, shifted to start at 0
            bucket = (ri * w_ + ci) - (rj * w_ + cj) + n - 1
        else:
            bucket = (ri - rj + h_ - 1) * (2 * w_ - 1) + (ci - cj + w_ - 1)
        return table[bucket, h]

    x = torch.randn(2, prefix + n, DIM, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expect = direct_attention(attn, x, offset_key)
        fused = attn(x)
        attn.fused_attn = False
        explicit = attn(x)
    torch.testing.assert_close(fused, expect, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(explicit, expect, atol=1e-5, rtol=1e-5)
    # and the relative term matters: zeroing the table changes the output
    with torch.no_grad():
        attn.rel_pos.embed.zero_()
        assert (attn(x) - expect).abs().max() > 0.05 * expect.abs().max()


@pytest.mark.parametrize("grid", [(2, 3), (4, 4)])
def test_relative_2d_index_with_a_class_token_is_beits(grid):
    ours, buckets = relative_position_index(kind="relative_2d", grid_size=grid, num_prefix_tokens=1)
    assert torch.equal(ours, gen_relative_position_index(grid))
    assert buckets == (2 * grid[0] - 1) * (2 * grid[1] - 1) + 3  # BEiT's num_relative_distance


def test_relative_2d_bias_mode_equals_timm_beit_attention_on_copied_weights():
    grid = (4, 4)
    model, attn = attention_module("relative_2d", grid, prefix=1, rel_logits="bias")
    assert attn.rel_pos.embed.shape == (7 * 7 + 3, HEADS)
    beit = BeitAttention(DIM, num_heads=HEADS, qkv_bias=True, window_size=grid).eval()
    with torch.no_grad():
        beit.qkv.weight.copy_(attn.qkv.weight)
        beit.q_bias.copy_(attn.qkv.bias[:DIM])
        beit.v_bias.copy_(attn.qkv.bias[2 * DIM:])
        attn.qkv.bias[DIM:2 * DIM].zero_()  # BEiT has no key bias (it cannot change a softmax anyway)
        beit.proj.load_state_dict(attn.proj.state_dict())
        beit.relative_position_bias_table.copy_(attn.rel_pos.embed)
    x = torch.randn(3, 17, DIM, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expect = beit(x)
        torch.testing.assert_close(attn(x), expect, atol=1e-5, rtol=1e-5)
        beit.fused_attn = attn.fused_attn = False
        torch.testing.assert_close(attn(x), beit(x), atol=1e-5, rtol=1e-5)
    with torch.no_grad(), explicit_attention(model) as weights:  # the bias is in the weights too
        model(torch.randn(2, 1, 8, 8))
    assert weights[0].shape == (2, HEADS, 17, 17)


# ---- options --------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["relative", "relative_2d"])
def test_max_offset_clips_each_offset(kind):
    grid, k = (4, 4), 1
    full, _ = relative_position_index(kind=kind, grid_size=grid)
    index, buckets = relative_position_index(kind=kind, grid_size=grid, max_offset=k)
    assert buckets == (2 * k + 1 if kind == "relative" else (2 * k + 1) ** 2)
    assert set(index.flatten().tolist()) == set(range(buckets))
    pos = cells(grid)
    clip = lambda d: max(-k, min(k, d))  # noqa: E731
    seen: dict = {}
    for (i, (ri, ci)), (j, (rj, cj)) in itertools.product(enumerate(pos), repeat=2):
        if kind == "relative":
            key = clip((ri * 4 + ci) - (rj * 4 + cj))
        else:
            key = (clip(ri - rj), clip(ci - cj))
        seen.setdefault(key, set()).add(index[i, j].item())
    assert all(len(v) == 1 for v in seen.values())  # a function of the clipped offset
    assert len({next(iter(v)) for v in seen.values()}) == len(seen)  # distinct clipped offsets, distinct buckets
    # a larger reach than the grid has is the unclipped index
    same, _ = relative_position_index(kind=kind, grid_size=grid, max_offset=99)
    assert torch.equal(same, full)


@pytest.mark.parametrize("logits", ["contextual", "bias"])
def test_prefix_skip_gives_the_class_token_pairs_no_relative_term(logits):
    grid = (2, 3)
    m = RelativePositionLogits(
        kind="relative", grid_size=grid, num_heads=2, head_dim=4, num_prefix_tokens=1,
        logits=logits, prefix="skip", init_std=1.0,
    )
    assert m.num_buckets == 2 * 6 - 1  # no class-token buckets
    bias = m(torch.randn(2, 2, 7, 4)).expand(2, 2, 7, 7)
    assert (bias[:, :, 0, :] == 0).all() and (bias[:, :, :, 0] == 0).all()
    assert (bias[:, :, 1:, 1:] != 0).all()
    bias.sum().backward()
    assert m.embed.grad is not None and m.embed.grad.abs().sum() > 0


def test_init_std_sets_the_table_scale():
    zero = RelativePositionLogits(kind="relative", grid_size=(4, 4), num_heads=2, head_dim=4, init_std=0)
    assert (zero.embed == 0).all()
    torch.manual_seed(0)
    wide = RelativePositionLogits(kind="relative", grid_size=(8, 8), num_heads=4, head_dim=8, init_std=0.5)
    assert abs(wide.embed.std().item() - 0.5) < 0.03  # truncated at +-2 = 4 sd: about the std itself
    # timm's ViT init keeps the module's own scale
    model = ViT(img_size=8, in_chans=1, num_classes=3, patch_size=2, embed_dim=16, depth=1, num_heads=2,
                pos_embed="relative", rel_init_std=0)
    assert (model.blocks[0].attn.rel_pos.embed == 0).all()


def test_every_option_trains_end_to_end():
    for options in (
        dict(rel_logits="bias"), dict(rel_max_offset=2), dict(rel_prefix="skip"), dict(rel_init_std=0.0),
        dict(rel_absolute=True),
    ):
        model = ViT(img_size=8, in_chans=1, num_classes=3, patch_size=2, embed_dim=16, depth=2, num_heads=2,
                    pos_embed="relative_2d", **options).train()
        model(torch.randn(2, 1, 8, 8)).sum().backward()
        for name, p in model.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all(), (options, name)
        assert {f"blocks.{i}.attn.rel_pos.embed" for i in range(2)} <= model.no_weight_decay()


def test_rel_absolute_adds_the_learned_1d_stem_table_beside_the_relative_logits():
    kw = dict(img_size=8, in_chans=1, num_classes=3, patch_size=2, embed_dim=16, depth=1, num_heads=2)
    plain = ViT(**kw, pos_embed="relative")
    both = ViT(**kw, pos_embed="relative", rel_absolute=True)
    assert plain.absolute_pos_embed() is None and plain.pos_embed is None
    assert both.absolute_pos_embed().shape == (1, 17, 16)  # timm's own table, class token included
    assert both.blocks[0].attn.rel_pos is not None
    names = {n for n, _ in both.named_parameters()} - {n for n, _ in plain.named_parameters()}
    assert names == {"pos_embed"} and "pos_embed" in both.no_weight_decay()
    torch.manual_seed(0)
    x = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        both.pos_embed.zero_()
        both.load_state_dict({k: v for k, v in plain.state_dict().items()}, strict=False)
        torch.testing.assert_close(both(x), plain(x))  # a zero table: the same function
        both.pos_embed.normal_()
        assert not torch.allclose(both(x), plain(x))


@pytest.mark.parametrize(
    "options,match",
    [
        (dict(pos_embed="learned_1d", rel_max_offset=2), r"rel_max_offset=2 only apply to pos_embed in \['relative', 'relative_2d'\] \(got pos_embed='learned_1d'\)"),
        (dict(pos_embed="none", rel_logits="bias"), r"rel_logits='bias' only apply"),
        (dict(pos_embed="relative", rel_logits="scalar"), r"rel_logits='scalar' is not one of \['contextual', 'bias'\]"),
        (dict(pos_embed="relative", rel_prefix="none"), r"rel_prefix='none' is not one of \['buckets', 'skip'\]"),
        (dict(pos_embed="relative", rel_max_offset=0), r"rel_max_offset=0 must be an integer >= 1"),
        (dict(pos_embed="relative", rel_init_std=-0.1), r"rel_init_std=-0.1 must be a number >= 0"),
        (dict(pos_embed="learned_1d", rel_absolute=True), r"rel_absolute=True only apply to pos_embed in"),
        (dict(pos_embed="relative", rel_absolute="yes"), r"rel_absolute='yes' must be true or false"),
    ],
)
def test_bad_options_are_named_before_anything_is_built(options, match):
    with pytest.raises(ValueError, match=match):
        ViT(img_size=8, in_chans=1, num_classes=3, patch_size=2, embed_dim=16, depth=1, num_heads=2, **options)

"""analysis/rollout.py: attention rollout against known answers."""

from __future__ import annotations

import pytest
import torch

from analysis.attention import attention_weights, token_layout
from analysis.rollout import (
    HEAD_FUSIONS,
    attention_rollout,
    fuse_heads,
    residual_attention,
    rollout_maps,
    upsample_maps,
)
from models.vit import ViT


def test_rollout_of_identity_attention_is_the_identity():
    eye = torch.eye(5).expand(4, 2, 3, 5, 5)  # (L, B, heads, T, T)
    r = attention_rollout(eye)
    assert torch.equal(r, torch.eye(5, dtype=torch.float64).expand(2, 5, 5))


@pytest.mark.parametrize("head_fusion", HEAD_FUSIONS)
def test_rollout_rows_sum_to_one(head_fusion):
    w = torch.randn(6, 3, 4, 9, 9).softmax(dim=-1)
    r = attention_rollout(w, head_fusion=head_fusion)
    torch.testing.assert_close(r.sum(-1), torch.ones(3, 9, dtype=torch.float64))
    assert torch.all(r >= 0)


def test_hand_worked_two_layer_example():
    """One head, two tokens.
    A1 = [[.5, .5], [0, 1]] -> Â1 = (A1 + I) / 2 = [[.75, .25], [0, 1]]
    A2 = [[0, 1], [1, 0]]   -> Â2 = [[.5, .5], [.5, .5]]
    R = Â2 Â1 = [[.375, .625], [.375, .625]] (last layer back to the input);
    the other order, Â1 Â2, would give [[.5, .5], [.5, .5]]."""
    a1 = torch.tensor([[0.5, 0.5], [0.0, 1.0]])
    a2 = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    w = torch.stack([a1, a2])[:, None, None]  # (L=2, B=1, heads=1, 2, 2)
    r = attention_rollout(w)
    expected = torch.tensor([[[0.375, 0.625], [0.375, 0.625]]], dtype=torch.float64)
    torch.testing.assert_close(r, expected)
    torch.testing.assert_close(attention_rollout([a1[None, None], a2[None, None]]), expected)


def test_identity_is_added_and_rows_not_columns_are_renormalised():
    """A non-symmetric fused matrix whose rows (after + I) have different sums: renormalising
    the wrong axis (dividing by a row-sum vector without keepdim) would differ."""
    a = torch.tensor([[2.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    got = residual_attention(a)
    expected = torch.tensor([[1.0, 0.0, 0.0], [0.25, 0.5, 0.25], [0.0, 0.0, 1.0]])
    torch.testing.assert_close(got, expected)
    wrong = (a + torch.eye(3)) / (a + torch.eye(3)).sum(dim=-1)  # the widely copied bug
    assert not torch.allclose(wrong, expected)


def test_head_fusions():
    w = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [1.0, 0.0]]])  # (heads=2, 2, 2)
    torch.testing.assert_close(fuse_heads(w, "mean"), torch.full((2, 2), 0.5))
    torch.testing.assert_close(fuse_heads(w, "max"), torch.ones(2, 2))
    torch.testing.assert_close(fuse_heads(w, "min"), torch.zeros(2, 2))
    with pytest.raises(ValueError, match="head_fusion='sum'"):
        fuse_heads(w, "sum")


def test_maps_from_the_class_row_or_the_patch_rows():
    r = torch.zeros(1, 5, 5, dtype=torch.float64)
    r[0, 0, 1:] = torch.tensor([0.1, 0.2, 0.3, 0.4])  # class token's row over a 2x2 grid
    maps = rollout_maps(r, (2, 2), 1, normalize=False)
    torch.testing.assert_close(maps, torch.tensor([[[0.1, 0.2], [0.3, 0.4]]], dtype=torch.float64))
    torch.testing.assert_close(rollout_maps(r, (2, 2), 1)[0, 1, 1], torch.tensor(1.0, dtype=torch.float64))
    # no class token: the mean of the patch rows
    gap = torch.eye(4, dtype=torch.float64)[None]
    torch.testing.assert_close(rollout_maps(gap, (2, 2), 0, normalize=False), torch.full((1, 2, 2), 0.25, dtype=torch.float64))
    with pytest.raises(ValueError, match="expected 1 prefix"):
        rollout_maps(r, (3, 3), 1)


@pytest.mark.parametrize("pool", ["cls", "gap"])
def test_rollout_on_a_model(pool):
    torch.manual_seed(0)
    model = ViT(img_size=8, in_chans=1, num_classes=3, patch_size=2, embed_dim=16, depth=2, num_heads=2, pool=pool)
    x = torch.randn(3, 1, 8, 8)
    layout = token_layout(model)
    maps = rollout_maps(attention_rollout(attention_weights(model, x)), layout.grid_size, layout.num_prefix_tokens)
    assert maps.shape == (3, 4, 4) and torch.all(maps >= 0)
    torch.testing.assert_close(maps.amax(dim=(-2, -1)), torch.ones(3, dtype=torch.float64))
    assert upsample_maps(maps, (8, 8)).shape == (3, 8, 8)

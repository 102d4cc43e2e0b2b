"""models/position.py: the position-embedding kinds and placements of ViT Table 8."""

from __future__ import annotations

import itertools

import pytest
import torch
from timm.layers.pos_embed_sincos import build_sincos2d_pos_embed

from models.position import (
    NUM_PREFIX_BUCKETS,
    POS_EMBED_KINDS,
    POS_PLACEMENTS,
    VALID_PLACEMENTS,
    LearnedPosEmbed1d,
    LearnedPosEmbed2d,
    RelativePositionLogits,
    SinCosPosEmbed2d,
    build_absolute,
    relative_position_index,
    validate_position,
)

GRID = (2, 3)  # not square, so rows and columns cannot be confused
N = GRID[0] * GRID[1]


def _cells():
    return [(r, c) for r in range(GRID[0]) for c in range(GRID[1])]  # raster order


# ---- learned 1-D / 2-D, sin-cos -----------------------------------------------------------

@pytest.mark.parametrize("prefix", [0, 1])
def test_learned_1d_has_one_row_per_token_class_token_included(prefix):
    m = LearnedPosEmbed1d(grid_size=GRID, embed_dim=8, num_prefix_tokens=prefix)
    assert m.table().shape == (1, prefix + N, 8)
    assert [n for n, _ in m.named_parameters()] == ["weight"]
    x = torch.randn(2, prefix + N, 8)
    torch.testing.assert_close(m(x), x + m.weight)


@pytest.mark.parametrize("prefix", [0, 1])
def test_learned_2d_is_concat_of_x_at_col_and_y_at_row(prefix):
    m = LearnedPosEmbed2d(grid_size=GRID, embed_dim=8, num_prefix_tokens=prefix)
    assert m.x_embed.shape == (GRID[1], 4) and m.y_embed.shape == (GRID[0], 4)
    table = m.table()
    assert table.shape == (1, prefix + N, 8)
    for i, (r, c) in enumerate(_cells()):
        torch.testing.assert_close(table[0, prefix + i], torch.cat([m.x_embed[c], m.y_embed[r]]), rtol=0, atol=0)
    if prefix:  # the class token's own learned entry
        torch.testing.assert_close(table[0, 0], m.prefix_embed[0, 0], rtol=0, atol=0)
        assert sorted(n for n, _ in m.named_parameters()) == ["prefix_embed", "x_embed", "y_embed"]
    else:
        assert m.prefix_embed is None


def test_learned_2d_needs_an_even_width():
    with pytest.raises(ValueError, match="embed_dim=7"):
        LearnedPosEmbed2d(grid_size=GRID, embed_dim=7)


@pytest.mark.parametrize("prefix", [0, 1])
def test_sincos_2d_is_timms_fixed_table_with_a_zero_class_entry(prefix):
    d = 16
    m = SinCosPosEmbed2d(grid_size=GRID, embed_dim=d, num_prefix_tokens=prefix)
    assert list(m.parameters()) == [] and m.state_dict() == {}  # fixed, recomputed: nothing saved
    table = m.table()
    assert table.shape == (1, prefix + N, d) and not table.requires_grad
    torch.testing.assert_close(table[0, prefix:], build_sincos2d_pos_embed(list(GRID), dim=d))
    if prefix:
        assert torch.count_nonzero(table[0, 0]) == 0
    # layout: [sin(row w), sin(col w), cos(row w), cos(col w)], patches in raster order
    w = 1.0 / 10000.0 ** (torch.arange(d // 4) / (d // 4))
    for i, (r, c) in enumerate(_cells()):
        expect = torch.cat([torch.sin(r * w), torch.sin(c * w), torch.cos(r * w), torch.cos(c * w)])
        torch.testing.assert_close(table[0, prefix + i], expect)


def test_sincos_2d_needs_a_width_divisible_by_4():
    with pytest.raises(ValueError, match="embed_dim=10"):
        SinCosPosEmbed2d(grid_size=GRID, embed_dim=10)


def test_build_absolute_rejects_other_kinds():
    with pytest.raises(ValueError, match="'relative'"):
        build_absolute(kind="relative", grid_size=GRID, embed_dim=8)


# ---- relative ------------------------------------------------------------------------------

def _offset(kind, i, j):
    (ri, ci), (rj, cj) = _cells()[i], _cells()[j]
    return i - j if kind == "relative" else (ri - rj, ci - cj)


@pytest.mark.parametrize("kind", ["relative", "relative_2d"])
@pytest.mark.parametrize("prefix", [0, 1])
def test_relative_index_is_a_function_of_the_offset_and_tells_offsets_apart(kind, prefix):
    index, buckets = relative_position_index(kind=kind, grid_size=GRID, num_prefix_tokens=prefix)
    num_offsets = 2 * N - 1 if kind == "relative" else (2 * GRID[0] - 1) * (2 * GRID[1] - 1)
    assert buckets == num_offsets + (NUM_PREFIX_BUCKETS if prefix else 0)
    assert index.shape == (prefix + N, prefix + N)
    patches = index[prefix:, prefix:]
    pairs = list(itertools.product(range(N), repeat=2))
    for (i, j), (k, l) in itertools.product(pairs, repeat=2):
        same_offset = _offset(kind, i, j) == _offset(kind, k, l)
        assert (patches[i, j] == patches[k, l]).item() == same_offset
    assert set(patches.flatten().tolist()) == set(range(num_offsets))  # every offset occurs
    if prefix:  # class token: three dedicated buckets, distinct from every offset
        assert set(index[0, 1:].tolist()) == {num_offsets}
        assert set(index[1:, 0].tolist()) == {num_offsets + 1}
        assert index[0, 0].item() == num_offsets + 2


def test_relative_1d_conflates_what_relative_2d_keeps_apart():
    # (dr, dc) = (0, W-1) and (1, -1) are the same raster offset W-1
    w = GRID[1]
    i, j = 0 * w + (w - 1), 0  # (0, W-1) - (0, 0)
    k, l = 1 * w + 0, 0 * w + 1  # (1, 0) - (0, 1)
    one_d, _ = relative_position_index(kind="relative", grid_size=GRID)
    two_d, _ = relative_position_index(kind="relative_2d", grid_size=GRID)
    assert one_d[i, j] == one_d[k, l] and two_d[i, j] != two_d[k, l]


@pytest.mark.parametrize("kind", ["relative", "relative_2d"])
@pytest.mark.parametrize("prefix", [0, 1])
def test_relative_logits_are_query_dot_offset_embedding(kind, prefix):
    torch.manual_seed(0)
    heads, dh = 2, 4
    m = RelativePositionLogits(kind=kind, grid_size=GRID, num_heads=heads, head_dim=dh, num_prefix_tokens=prefix)
    assert m.embed.shape == (m.num_buckets, heads, dh)
    assert "index" not in m.state_dict()  # derived, not saved
    t = prefix + N
    q = torch.randn(3, heads, t, dh)
    bias = m(q)
    assert bias.shape == (3, heads, t, t)
    expect = torch.empty_like(bias)
    for i, j in itertools.product(range(t), repeat=2):
        r = m.embed[m.index[i, j]]  # (heads, dh)
        expect[:, :, i, j] = (q[:, :, i] * r).sum(-1) / dh ** 0.5
    torch.testing.assert_close(bias, expect)


@pytest.mark.parametrize("kind", ["relative", "relative_2d"])
def test_relative_bias_depends_only_on_the_offset(kind):
    """With the same query at every position, equal offsets give equal bias, and the class
    token's bias is the same to and from every patch."""
    torch.manual_seed(0)
    heads, dh, prefix = 2, 4, 1
    m = RelativePositionLogits(kind=kind, grid_size=GRID, num_heads=heads, head_dim=dh, num_prefix_tokens=prefix)
    q = torch.randn(1, heads, 1, dh).expand(1, heads, prefix + N, dh)
    bias = m(q)[0, :, prefix:, prefix:]
    by_offset: dict = {}
    for i, j in itertools.product(range(N), repeat=2):
        by_offset.setdefault(_offset(kind, i, j), []).append(bias[:, i, j])
    for values in by_offset.values():
        for v in values[1:]:
            torch.testing.assert_close(v, values[0], rtol=0, atol=0)
    assert len(by_offset) == (2 * N - 1 if kind == "relative" else (2 * GRID[0] - 1) * (2 * GRID[1] - 1))
    full = m(q)[0]
    assert torch.allclose(full[:, 0, 1:], full[:, 0, 1:2].expand(-1, N))  # class query -> any patch
    assert torch.allclose(full[:, 1:, 0], full[:, 1:2, 0].expand(-1, N))  # any patch -> class key


def test_relative_logits_get_gradients_for_every_bucket():
    m = RelativePositionLogits(kind="relative_2d", grid_size=GRID, num_heads=2, head_dim=4, num_prefix_tokens=1)
    m(torch.randn(2, 2, 1 + N, 4)).square().sum().backward()
    assert (m.embed.grad.abs().sum(dim=(1, 2)) > 0).all()


# ---- validation ----------------------------------------------------------------------------

def test_valid_placements_follow_table_8():
    assert VALID_PLACEMENTS["none"] == ("stem",)
    assert VALID_PLACEMENTS["relative"] == ("stem",) and VALID_PLACEMENTS["relative_2d"] == ("stem",)
    for kind in ("learned_1d", "learned_2d", "sincos_2d"):
        assert VALID_PLACEMENTS[kind] == POS_PLACEMENTS
    assert set(VALID_PLACEMENTS) == set(POS_EMBED_KINDS)


@pytest.mark.parametrize("kind,placement", list(itertools.product(POS_EMBED_KINDS, POS_PLACEMENTS)))
def test_every_kind_placement_pair_is_accepted_or_named_in_the_error(kind, placement):
    if placement in VALID_PLACEMENTS[kind]:
        validate_position(kind=kind, placement=placement, embed_dim=16, num_heads=2)
        return
    with pytest.raises(ValueError) as err:
        validate_position(kind=kind, placement=placement, embed_dim=16, num_heads=2)
    msg = str(err.value)
    assert repr(kind) in msg and repr(placement) in msg and str(list(VALID_PLACEMENTS[kind])) in msg


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(kind="learned_3d", placement="stem", embed_dim=16), "'learned_3d'"),
        (dict(kind="learned_1d", placement="every_other_layer", embed_dim=16), "'every_other_layer'"),
        (dict(kind="learned_2d", placement="stem", embed_dim=15), "embed_dim=15"),
        (dict(kind="sincos_2d", placement="stem", embed_dim=18), "embed_dim=18"),
    ],
)
def test_invalid_position_configs_name_the_bad_value(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        validate_position(**kwargs)

"""analysis/posemb.py: position-embedding similarity for every absolute kind and placement."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer

from analysis.posemb import cosine_similarity_grid, position_similarity, position_tables, row_column_contrast
from models.position import ABSOLUTE_KINDS, POS_PLACEMENTS
from models.vit import ViT

TINY = dict(img_size=12, in_chans=1, num_classes=3, patch_size=2, embed_dim=32, depth=3, num_heads=2)  # 6x6 grid


def check_grid(sim: torch.Tensor, grid=(6, 6)) -> None:
    h, w = grid
    assert sim.shape == (h, w, h, w)
    flat = sim.reshape(h * w, h * w)
    torch.testing.assert_close(flat.diagonal(), torch.ones(h * w, dtype=flat.dtype))
    torch.testing.assert_close(flat, flat.T)
    assert torch.all(flat <= 1 + 1e-9) and torch.all(flat >= -1 - 1e-9)


@pytest.mark.parametrize("pool", ["cls", "gap"])
@pytest.mark.parametrize("placement", POS_PLACEMENTS)
@pytest.mark.parametrize("kind", ABSOLUTE_KINDS)
def test_every_absolute_kind_and_placement(kind, placement, pool):
    torch.manual_seed(0)
    model = ViT(**TINY, pos_embed=kind, pos_placement=placement, pool=pool)
    sims = position_similarity(model)
    expected = {"stem": ["stem"], "every_layer": ["layer1", "layer2", "layer3"], "every_layer_shared": ["shared"]}
    assert list(sims) == expected[placement]
    for sim in sims.values():
        check_grid(sim)


def test_class_token_embedding_is_excluded():
    torch.manual_seed(0)
    model = ViT(**TINY)  # learned_1d at the stem: timm's pos_embed (1, 1 + 36, D)
    table = position_tables(model)["stem"]
    torch.testing.assert_close(table, model.pos_embed[0, 1:].detach())
    with torch.no_grad():
        model.pos_embed[0, 0] = 1e6
    torch.testing.assert_close(position_tables(model)["stem"], table)


def test_learned_2d_compares_the_concatenated_vectors():
    torch.manual_seed(0)
    model = ViT(**TINY, pos_embed="learned_2d")
    emb = model.pos_stem
    sim = position_similarity(model)["stem"]
    a = torch.cat([emb.x_embed[4], emb.y_embed[1]])  # patch (row 1, col 4)
    b = torch.cat([emb.x_embed[0], emb.y_embed[5]])  # patch (row 5, col 0)
    assert sim[1, 4, 5, 0].item() == pytest.approx(F.cosine_similarity(a, b, dim=0).item(), abs=1e-6)


def test_sincos_has_row_and_column_structure():
    model = ViT(**TINY, pos_embed="sincos_2d")
    contrast = row_column_contrast(position_similarity(model)["stem"])
    assert contrast["same_row_or_column"] > contrast["other"]


def test_plain_timm_vit_and_no_embed_class():
    torch.manual_seed(0)
    kw = dict(img_size=12, patch_size=2, in_chans=1, num_classes=3, embed_dim=32, depth=1, num_heads=2)
    for no_embed_class in (False, True):
        model = VisionTransformer(**kw, no_embed_class=no_embed_class)
        sims = position_similarity(model)
        check_grid(sims["stem"])
        torch.testing.assert_close(position_tables(model)["stem"], model.pos_embed[0, -36:].detach())


@pytest.mark.parametrize("kind", ["none", "relative", "relative_2d"])
def test_no_absolute_table_is_a_clear_error(kind):
    model = ViT(**TINY, pos_embed=kind)
    with pytest.raises(ValueError, match=f"no absolute position embedding \\(pos_embed='{kind}'\\)"):
        position_similarity(model)


def test_cosine_grid_of_a_known_table():
    table = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.0]])
    sim = cosine_similarity_grid(table, (2, 2))
    check_grid(sim, (2, 2))
    assert sim[0, 0, 0, 1] == 0 and sim[0, 0, 1, 1] == -1
    assert sim[0, 0, 1, 0].item() == pytest.approx(2 ** -0.5)

"""models/vit.py: the configurable ViT, its position embeddings, attention kinds and paths."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer

from models.position import POS_EMBED_KINDS, POS_PLACEMENTS, VALID_PLACEMENTS
from models.vit import (
    ATTENTIONS,
    POOLINGS,
    POSITION_MODULES,
    ViT,
    explicit_attention,
)

TINY = dict(img_size=8, in_chans=3, num_classes=5, patch_size=2, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2.0)
COMBOS = [(kind, placement) for kind in POS_EMBED_KINDS for placement in VALID_PLACEMENTS[kind]]
IDS = [f"{k}-{p}" for k, p in COMBOS]


def tiny(seed: int = 0, **overrides) -> ViT:
    torch.manual_seed(seed)
    return ViT(**{**TINY, **overrides})


def images(n: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, TINY["in_chans"], TINY["img_size"], TINY["img_size"], generator=torch.Generator().manual_seed(seed))


def position_parameters(model: ViT) -> dict[str, torch.nn.Parameter]:
    params = {n: p for n, p in model.named_parameters() if n == "pos_embed"}
    for prefix, module in model.named_modules():
        if isinstance(module, POSITION_MODULES):
            params |= {f"{prefix}.{n}": p for n, p in module.named_parameters()}
    return params


# ---- gradients -----------------------------------------------------------------------------

@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("pool", POOLINGS)
@pytest.mark.parametrize("kind,placement", COMBOS, ids=IDS)
def test_every_parameter_gets_a_finite_gradient(kind, placement, pool, attention):
    model = tiny(pos_embed=kind, pos_placement=placement, pool=pool, attention=attention).train()
    out = model(images())
    assert out.shape == (2, TINY["num_classes"]) and torch.isfinite(out).all()
    (out * torch.randn_like(out)).sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, f"{name} got no gradient"
        assert torch.isfinite(p.grad).all(), f"{name} has a non-finite gradient"
        assert p.grad.abs().sum() > 0, f"{name} got a zero gradient"


def test_gradient_with_dropouts_in_training_mode():
    model = tiny(pos_embed="relative", dropout=0.1, attn_dropout=0.1, drop_path=0.1).train()
    model(images()).sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


# ---- position matters ----------------------------------------------------------------------

def permute_patches(x: torch.Tensor, perm: torch.Tensor, patch: int) -> torch.Tensor:
    """Move whole patches in pixel space: output patch i is input patch perm[i] (raster order)."""
    b, c, h, w = x.shape
    gh, gw = h // patch, w // patch
    p = x.reshape(b, c, gh, patch, gw, patch).permute(0, 2, 4, 1, 3, 5).reshape(b, gh * gw, c, patch, patch)
    p = p[:, perm].reshape(b, gh, gw, c, patch, patch).permute(0, 3, 1, 4, 2, 5)
    return p.reshape(b, c, h, w)


def randomize(model: ViT) -> ViT:
    """Weights of unit-scale effect: at init (std 0.02) position tables and queries barely move
    the logits, so an order effect would sit too close to float noise to test."""
    positional = set(position_parameters(model).values())
    with torch.no_grad():
        for p in model.parameters():
            if p in positional:
                p.normal_()
            elif p.ndim >= 2:
                p.normal_(std=p[0].numel() ** -0.5)
    return model


@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("pool", POOLINGS)
def test_without_position_embedding_the_logits_ignore_patch_order(pool, attention):
    model = randomize(tiny(pos_embed="none", pool=pool, attention=attention)).eval()
    x = images()
    perm = torch.randperm(16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(permute_patches(x, perm, 2)), model(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("pool", POOLINGS)
@pytest.mark.parametrize("kind,placement", COMBOS[1:], ids=IDS[1:])
def test_with_a_position_embedding_the_logits_see_patch_order(kind, placement, pool, attention):
    model = randomize(tiny(pos_embed=kind, pos_placement=placement, pool=pool, attention=attention)).eval()
    x = images()
    perm = torch.randperm(16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(x)
        change = (model(permute_patches(x, perm, 2)) - logits).abs().max()
    assert change > 1e-2 * logits.abs().max()


def test_permute_patches_moves_whole_patches():
    x = torch.arange(64.0).reshape(1, 1, 8, 8)
    perm = torch.roll(torch.arange(16), 1)
    y = permute_patches(x, perm, 2)
    torch.testing.assert_close(y[..., 0:2, 2:4], x[..., 0:2, 0:2])  # patch 1 <- patch 0


# ---- placements and the tables -------------------------------------------------------------

@pytest.mark.parametrize("pool", POOLINGS)
def test_learned_2d_in_the_model_is_concat_of_x_at_col_and_y_at_row(pool):
    model = tiny(pos_embed="learned_2d", pool=pool)
    prefix = 1 if pool == "cls" else 0
    table = model.absolute_pos_embed()
    assert table.shape == (1, prefix + 16, 32)
    gh, gw = model.grid_size
    for r in range(gh):
        for c in range(gw):
            expect = torch.cat([model.pos_stem.x_embed[c], model.pos_stem.y_embed[r]])
            torch.testing.assert_close(table[0, prefix + r * gw + c], expect, rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["learned_1d", "learned_2d", "sincos_2d"])
def test_placements_add_the_embedding_where_table_8_says(kind):
    x = images()
    stem = tiny(pos_embed=kind)
    own = tiny(pos_embed=kind, pos_placement="every_layer")
    shared = tiny(pos_embed=kind, pos_placement="every_layer_shared")
    assert stem.absolute_pos_embed() is not None and stem.absolute_pos_embed(0) is None
    for m in (own, shared):
        assert m.absolute_pos_embed() is None and all(m.absolute_pos_embed(i) is not None for i in range(2))
    # a per-layer embedding is the one added at the input of its block, and nothing else
    with torch.no_grad():
        tokens = own._pos_embed(own.patch_embed(x))
        blk = own.blocks[0]
        expect = super(type(blk), blk).forward(tokens + own.absolute_pos_embed(0))
        torch.testing.assert_close(blk(tokens), expect)
    if kind != "sincos_2d":  # learned: separate tables per layer, or one shared
        own_params = position_parameters(own)
        assert sorted({n.split(".")[0] + "." + n.split(".")[1] for n in own_params}) == ["blocks.0", "blocks.1"]
        assert all(n.startswith("pos_shared.") for n in position_parameters(shared))
        assert all(n.startswith("pos_stem.") or n == "pos_embed" for n in position_parameters(stem))
        per_layer = sum(p.numel() for p in position_parameters(stem).values())
        assert sum(p.numel() for p in own_params.values()) == 2 * per_layer
        assert sum(p.numel() for p in position_parameters(shared).values()) == per_layer
        assert not torch.equal(own.absolute_pos_embed(0), own.absolute_pos_embed(1))
    assert shared.absolute_pos_embed(0) is not None
    torch.testing.assert_close(shared.absolute_pos_embed(0), shared.absolute_pos_embed(1), rtol=0, atol=0)


def test_shared_embedding_is_saved_once_and_stays_shared_when_copied():
    model = tiny(pos_embed="learned_1d", pos_placement="every_layer_shared")
    keys = [k for k in model.state_dict() if "pos" in k]
    assert keys == ["pos_shared.weight"]
    clone = copy.deepcopy(model)
    with torch.no_grad():
        clone.pos_shared.weight.add_(1.0)
    for blk in clone.blocks:
        assert blk._shared_pos[0] is clone.pos_shared
    assert not torch.equal(clone.pos_shared.weight, model.pos_shared.weight)
    fresh = tiny(seed=3, pos_embed="learned_1d", pos_placement="every_layer_shared")
    fresh.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(fresh(images()), model(images()))


def test_sincos_2d_has_no_parameters_and_no_gradient():
    model = tiny(pos_embed="sincos_2d")
    assert position_parameters(model) == {}
    assert not model.absolute_pos_embed().requires_grad
    assert not any("pos" in k for k in model.state_dict())


def test_every_layer_placement_reaches_timms_other_feature_paths():
    model = tiny(pos_embed="learned_2d", pos_placement="every_layer").eval()
    x = images()
    with torch.no_grad():
        final, inter = model.forward_intermediates(x, output_fmt="NLC")
        torch.testing.assert_close(final, model.forward_features(x))
        torch.testing.assert_close(model.forward_head(model.forward_features(x)), model(x))
    assert len(inter) == 2


@pytest.mark.parametrize("kind,placement", COMBOS, ids=IDS)
def test_no_weight_decay_names_every_position_parameter_and_the_class_token(kind, placement):
    model = tiny(pos_embed=kind, pos_placement=placement)
    names = model.no_weight_decay()
    params = dict(model.named_parameters())
    assert "cls_token" in names
    assert set(position_parameters(model)) <= names
    decayed_here = {n for n in names if n in params} - set(position_parameters(model)) - {"cls_token"}
    assert decayed_here == set()  # nothing else is exempted
    if kind in ("relative", "relative_2d"):
        assert {f"blocks.{i}.attn.rel_pos.embed" for i in range(2)} <= names


# ---- attention paths -----------------------------------------------------------------------

@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("pool", POOLINGS)
@pytest.mark.parametrize("kind,placement", COMBOS, ids=IDS)
def test_fused_and_explicit_paths_agree_and_weights_are_distributions(kind, placement, pool, attention):
    model = tiny(pos_embed=kind, pos_placement=placement, pool=pool, attention=attention).eval()
    x = images()
    tokens = 16 + (pool == "cls")
    with torch.no_grad():
        fused = model(x)
        with explicit_attention(model) as weights:
            explicit = model(x)
    torch.testing.assert_close(explicit, fused, atol=1e-5, rtol=1e-5)
    assert len(weights) == 2
    for w in weights:
        assert w.shape == (2, 4, tokens, tokens) and (w >= 0).all()
        torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, tokens))


def test_training_uses_the_fused_kernel_and_explicit_attention_does_not(monkeypatch):
    calls = []
    sdpa = F.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(kwargs.get("attn_mask"))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", counting)
    model = tiny(pos_embed="relative_2d").train()
    model(images()).sum().backward()
    assert len(calls) == 2 and all(m is not None and m.shape == (2, 4, 17, 17) for m in calls)
    calls.clear()
    with explicit_attention(model):
        model(images())
    assert calls == []
    tiny(attention="additive")(images())  # additive scoring never uses it
    assert calls == []


def test_explicit_attention_restores_the_modules_and_keeps_the_weights():
    model = tiny(pos_embed="relative")
    attn = [blk.attn for blk in model.blocks]
    with explicit_attention(model) as weights:
        assert list(weights) == [None, None]
        model(images(3))
        assert all(not a.fused_attn and a.return_weights for a in attn)
        inside = [w.clone() for w in weights]
    assert all(a.fused_attn and not a.return_weights and a.last_weights is None for a in attn)
    stacked = torch.stack(list(weights))
    assert stacked.shape == (2, 3, 4, 17, 17)
    torch.testing.assert_close(stacked, torch.stack(inside))
    assert not stacked.requires_grad
    with pytest.raises(TypeError, match="ViTAttention"):
        with explicit_attention(torch.nn.Linear(2, 2)):
            pass


def test_explicit_weights_are_the_softmax_of_the_attention_logits():
    model = tiny(pos_embed="relative_2d").eval()
    x = images()
    attn = model.blocks[0].attn
    with torch.no_grad():
        tokens = model.blocks[0].norm1(model._pos_embed(model.patch_embed(x)))
        with explicit_attention(model) as weights:
            model(x)
        b, t, _ = tokens.shape
        q, k, _ = attn.qkv(tokens).reshape(b, t, 3, 4, 8).permute(2, 0, 3, 1, 4)
        expect = (q @ k.transpose(-2, -1) / 8 ** 0.5 + attn.rel_pos(q)).softmax(-1)
    torch.testing.assert_close(weights[0], expect)


@pytest.mark.parametrize("additive_dim", [None, 3])
def test_additive_scoring_is_v_tanh_wq_q_plus_wk_k(additive_dim):
    model = tiny(attention="additive", additive_dim=additive_dim)
    attn = model.blocks[0].attn
    d_a = additive_dim or 8
    assert attn.additive_q.shape == (4, 8, d_a) and attn.additive_v.shape == (4, d_a)
    q, k = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 5, 8)
    s = attn.logits(q, k)
    h, i, j = 2, 3, 1
    expect = attn.additive_v[h] @ torch.tanh(q[0, h, i] @ attn.additive_q[h] + k[0, h, j] @ attn.additive_k[h])
    torch.testing.assert_close(s[0, h, i, j], expect)


# ---- the default is timm's ViT ---------------------------------------------------------------

@pytest.mark.parametrize("pool", POOLINGS)
def test_default_vit_is_timms_vision_transformer(pool):
    ours = tiny(pool=pool)
    torch.manual_seed(5)
    theirs = VisionTransformer(
        img_size=8, patch_size=2, in_chans=3, num_classes=5, embed_dim=32, depth=2, num_heads=4,
        mlp_ratio=2.0, global_pool="token" if pool == "cls" else "avg", class_token=pool == "cls",
        fc_norm=False,
    )
    assert [(n, p.shape) for n, p in ours.named_parameters()] == [(n, p.shape) for n, p in theirs.named_parameters()]
    assert list(ours.state_dict()) == list(theirs.state_dict())
    theirs.load_state_dict(ours.state_dict())
    ours.eval(), theirs.eval()
    x = images()
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=0)
        with explicit_attention(ours):
            for blk in theirs.blocks:
                blk.attn.fused_attn = False
            torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=0)
    assert ours.no_weight_decay() >= theirs.no_weight_decay()


def test_vit_b16_has_timms_parameter_count():
    model = ViT(img_size=224, patch_size=16, embed_dim=768, depth=12, num_heads=12, num_classes=1000)
    assert sum(p.numel() for p in model.parameters()) == 86_567_656
    assert model.pos_embed.shape == (1, 197, 768)
    assert model.grid_size == (14, 14) and model.input_shape == (3, 224, 224)


# ---- validation ------------------------------------------------------------------------------

@pytest.fixture
def nothing_built(monkeypatch):
    """Fail if a ViT gets as far as building timm's modules."""

    def boom(*args, **kwargs):
        raise AssertionError("modules were built before the config was validated")

    monkeypatch.setattr(VisionTransformer, "__init__", boom)


INVALID = [
    (dict(patch_size=3), ["patch_size=3", "img_size=8", "[1, 2, 4, 8]"]),
    (dict(num_heads=5), ["num_heads=5", "embed_dim=32", "[1, 2, 4, 8, 16, 32]"]),
    (dict(pool="mean"), ["pool='mean'", str(list(POOLINGS))]),
    (dict(pos_embed="rope"), ["pos_embed='rope'", str(list(POS_EMBED_KINDS))]),
    (dict(pos_placement="every_block"), ["pos_placement='every_block'", str(list(POS_PLACEMENTS))]),
    (dict(attention="cosine"), ["attention='cosine'", str(list(ATTENTIONS))]),
    (dict(embed_dim=30, num_heads=3, pos_embed="sincos_2d"), ["embed_dim=30", "'sincos_2d'"]),
    (dict(embed_dim=33, num_heads=3, pos_embed="learned_2d"), ["embed_dim=33", "'learned_2d'"]),
    (dict(additive_dim=4), ["additive_dim=4", "attention='dot'"]),
    (dict(attention="additive", additive_dim=0), ["additive_dim=0"]),
    (dict(dropout=1.0), ["dropout=1.0"]),
    (dict(depth=0), ["depth=0"]),
] + [
    (dict(pos_embed=kind, pos_placement=placement), [repr(kind), repr(placement), str(list(VALID_PLACEMENTS[kind]))])
    for kind in POS_EMBED_KINDS for placement in POS_PLACEMENTS if placement not in VALID_PLACEMENTS[kind]
]


@pytest.mark.parametrize("overrides,needles", INVALID, ids=[str(o) for o, _ in INVALID])
def test_invalid_config_raises_before_building_and_names_the_value(overrides, needles, nothing_built):
    with pytest.raises(ValueError) as err:
        ViT(**{**TINY, **overrides})
    for needle in needles:
        assert needle in str(err.value)


def test_a_valid_config_passes_validation_before_building(nothing_built):
    with pytest.raises(AssertionError, match="validated"):  # validation passed, then building began
        ViT(**TINY, pos_embed="relative_2d", attention="additive", additive_dim=4)


def test_set_input_size_refuses_tables_it_cannot_resample():
    with pytest.raises(NotImplementedError, match="learned_2d"):
        tiny(pos_embed="learned_2d").set_input_size(img_size=(16, 16))

"""models/ctr.py: BST, WDL, WDL(+Seq), DIN on hand-made batches (no data files, CPU, seconds)."""

from __future__ import annotations

import pytest
import torch

from models.ctr import BST, DIN, WDL, Dice, WDLSeq, masked_mean
from models.ctr_batch import PAD, ZERO_DELTA_BUCKET

N_ITEMS, N_CATS, N_USERS, PROFILE, N_BUCKETS = 50, 8, 20, (3, 5), 12
SIZES = dict(n_items=N_ITEMS, n_categories=N_CATS, n_users=N_USERS, profile_sizes=PROFILE)
SMALL = dict(item_dim=8, category_dim=4, user_dim=4, profile_dim=2)


def featured_bst(**kw) -> BST:
    """A small BST with users, profile fields and time-delta buckets (this file's batches)."""
    args = dict(SIZES, **SMALL, position_dim=4, num_heads=2, n_position_buckets=N_BUCKETS, seq_len=12,
                mlp_dims=(16, 8), dropout=0.1)
    args.update(kw)
    return BST(**args)


def tiny_din(**kw) -> DIN:
    return DIN(**SIZES, **SMALL, attention_dims=(8, 4), mlp_dims=(16, 8), **kw)


def tiny_wdl(cls=WDL, **kw):
    return cls(**SIZES, **SMALL, mlp_dims=(16, 8), wide_hash_size=1000, **kw)


def make_batch(lengths, seq_len: int, pad_side: str = "left", seed: int = 0) -> dict[str, torch.Tensor]:
    """Histories with the given real lengths, padded to seq_len on pad_side.

    The real items of row b depend only on (seed, b), never on seq_len or the side, so two
    calls with different padding describe the same samples.
    """
    g = torch.Generator().manual_seed(seed)
    B, max_len = len(lengths), max(max(lengths), 1)
    items = torch.randint(1, N_ITEMS, (B, max_len), generator=g)
    cats = torch.randint(1, N_CATS, (B, max_len), generator=g)
    # oldest first: larger buckets, then non-increasing towards the newest
    buckets = torch.sort(torch.randint(ZERO_DELTA_BUCKET, N_BUCKETS, (B, max_len), generator=g), dim=1, descending=True).values
    batch = {
        "user": torch.randint(1, N_USERS, (B,), generator=g),
        "user_features": torch.stack([torch.randint(1, k, (B,), generator=g) for k in PROFILE], 1),
        "target_item": torch.randint(1, N_ITEMS, (B,), generator=g),
        "target_category": torch.randint(1, N_CATS, (B,), generator=g),
        "label": torch.randint(0, 2, (B,), generator=g).float(),
    }
    hist = {k: torch.zeros(B, seq_len, dtype=torch.long) for k in ("hist_items", "hist_categories", "hist_positions")}
    for b, n in enumerate(lengths):
        cols = slice(seq_len - n, seq_len) if pad_side == "left" else slice(0, n)
        if n:
            hist["hist_items"][b, cols] = items[b, max_len - n:]
            hist["hist_categories"][b, cols] = cats[b, max_len - n:]
            hist["hist_positions"][b, cols] = buckets[b, max_len - n:]
    batch.update(hist)
    batch["hist_mask"] = batch["hist_items"] != PAD
    return batch


LENGTHS = [0, 1, 3, 6, 2, 6, 5, 0]

PADDED_NETS = {
    "bst_time_delta_target": lambda: featured_bst(),
    "bst_index_mean": lambda: featured_bst(position="index", seq_pooling="mean"),
    "bst_none_target_2blocks": lambda: featured_bst(position="none", num_blocks=2),
    "din_prelu": lambda: tiny_din(),
    "din_dice_softmax": lambda: tiny_din(activation="dice", attention_softmax=True),
    "wdl_seq": lambda: tiny_wdl(WDLSeq),
}


@pytest.mark.parametrize("name", sorted(PADDED_NETS))
def test_more_padding_on_either_side_leaves_outputs_unchanged(name):
    torch.manual_seed(0)
    net = PADDED_NETS[name]().eval()
    reference = net(make_batch(LENGTHS, seq_len=6, pad_side="left"))
    assert reference.shape == (len(LENGTHS),)
    for seq_len in (6, 9, 12):
        for side in ("left", "right"):
            out = net(make_batch(LENGTHS, seq_len=seq_len, pad_side=side))
            torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-5, msg=f"{name}, L={seq_len}, {side}")


def test_padding_values_are_ignored_not_just_zero():
    """Garbage under the mask changes nothing: padding is masked, never merely zero."""
    torch.manual_seed(0)
    batch = make_batch(LENGTHS, seq_len=10)
    noisy = dict(batch)
    pad = ~batch["hist_mask"]
    for key, high in (("hist_items", N_ITEMS), ("hist_categories", N_CATS), ("hist_positions", N_BUCKETS)):
        noisy[key] = torch.where(pad, torch.randint(1, high, pad.shape), batch[key])
    for net in (featured_bst().eval(), featured_bst(position="index").eval(), tiny_din().eval(), tiny_wdl(WDLSeq).eval()):
        torch.testing.assert_close(net(noisy), net(batch), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("position", ["time_delta", "index", "none"])
def test_bst_target_token_is_never_masked(position):
    net = featured_bst(position=position, num_blocks=2).eval()
    batch = make_batch([0, 0, 4], seq_len=5)
    tokens, mask = net.embed_sequence(batch)
    assert tokens.shape == (3, 6, net.dim)
    assert mask[:, -1].all(), "the target (last token) must always be a key"
    assert mask[:, :-1].eq(batch["hist_mask"]).all()
    for weights in net.attention_weights(batch):
        assert weights.shape == (3, 2, 6, 6)
        assert (weights[..., -1] > 0).all(), "every query attends to the target"
        assert (weights[:2, :, :, :-1] == 0).all(), "all-padding rows attend only to the target"
        torch.testing.assert_close(weights.sum(-1), torch.ones(3, 2, 6))
    # the target alone drives an all-padding row
    other = dict(batch, target_item=batch["target_item"] % (N_ITEMS - 1) + 1)
    assert not torch.allclose(net(batch)[:2], net(other)[:2])


@pytest.mark.parametrize("make", [lambda: featured_bst(), lambda: featured_bst(position="index", seq_pooling="mean"),
                                  lambda: tiny_din(activation="dice"), lambda: tiny_din(attention_softmax=True),
                                  lambda: tiny_wdl(WDLSeq)])
def test_all_padding_histories_give_finite_outputs_and_gradients(make):
    torch.manual_seed(0)
    net = make()
    batch = make_batch([0, 0, 0, 0], seq_len=5)
    for mode in (True, False):
        net.train(mode)
        out = net(batch)
        assert torch.isfinite(out).all()
    net.train()
    net.zero_grad()
    net(batch).sum().backward()
    for name, p in net.named_parameters():
        assert p.grad is None or torch.isfinite(p.grad).all(), name


ALL_NETS = {
    "bst_time_delta": lambda: featured_bst(),
    "bst_index_mean_3blocks": lambda: featured_bst(position="index", seq_pooling="mean", num_blocks=3),
    "bst_none": lambda: featured_bst(position="none"),
    "wdl": lambda: tiny_wdl(),
    "wdl_seq": lambda: tiny_wdl(WDLSeq),
    "din_prelu": lambda: tiny_din(),
    "din_dice": lambda: tiny_din(activation="dice"),
    "din_no_user_no_profile": lambda: DIN(n_items=N_ITEMS, n_categories=N_CATS, **SMALL, attention_dims=(8,), mlp_dims=(8,)),
}


@pytest.mark.parametrize("name", sorted(ALL_NETS))
def test_every_parameter_gets_a_gradient(name):
    torch.manual_seed(0)
    net = ALL_NETS[name]().train()
    batch = make_batch([6, 3, 1, 0, 5, 6, 2, 4] * 4, seq_len=6)
    logits = net(batch)
    assert logits.shape == (32,)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, batch["label"])
    loss.backward()
    for pname, p in net.named_parameters():
        assert p.grad is not None, f"{pname} got no gradient"
        assert p.grad.abs().sum() > 0, f"{pname} got an all-zero gradient"
    probs = net.predict_proba(batch)
    assert ((probs > 0) & (probs < 1)).all()


def full_sequence_bst_forward(net: BST, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """BST's forward computed the plain way: every block on every token, then the pooling."""
    x, mask = net.embed_sequence(batch)
    for block in net.blocks:
        x = block(x, mask)
    pooled = x[:, -1] if net.seq_pooling == "target" else masked_mean(x, mask)
    return net.head(torch.cat([pooled, net.features.other(batch)], dim=-1)).squeeze(-1)


@pytest.mark.parametrize("kw", [{}, dict(num_blocks=3), dict(position="index"), dict(position="none", num_blocks=2),
                                dict(position="index", seq_pooling="mean", num_blocks=2)])
@pytest.mark.parametrize("training", [False, True])
def test_bst_forward_equals_the_full_sequence_computation(kw, training):
    """With target pooling the last block computes the target token alone: the same outputs and gradients
    as computing every token (float64, so that rounding flips no LeakyReLU kink)."""
    torch.manual_seed(0)
    net = featured_bst(dropout=0.0, **kw).double().train(training)
    batch = make_batch(LENGTHS, seq_len=7)
    grads = []
    for forward in (net, lambda b: full_sequence_bst_forward(net, b)):
        net.zero_grad()
        out = forward(batch)
        out.sum().backward()
        grads.append((out.detach(), [p.grad.clone() for p in net.parameters()]))
    (out, g), (ref, g_ref) = grads
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    for name, a, b in zip([n for n, _ in net.named_parameters()], g, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10, msg=name)


def test_bst_block_last_only_is_the_last_row_of_the_full_output():
    torch.manual_seed(0)
    block = featured_bst(num_blocks=1).blocks[0].eval()
    x = torch.randn(5, 7, block.qkv.in_features)
    mask = torch.rand(5, 7) > 0.4
    mask[:, -1] = True
    last = block(x, mask, last_only=True)
    assert last.shape == (5, 1, x.shape[-1])
    torch.testing.assert_close(last, block(x, mask)[:, -1:], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("num_blocks", [1, 2])
def test_bst_every_token_switch_gives_the_same_outputs_and_gradients(num_blocks):
    """``last_block_target_only = False`` (what the benchmark measures as equal work) computes the
    last block on every token: the same logits and parameter gradients as the target-only default."""
    batch = make_batch([6, 3, 1, 0], seq_len=6)
    outputs = []
    for target_only in (True, False):
        torch.manual_seed(0)
        net = featured_bst(num_blocks=num_blocks, dropout=0.0)
        net.last_block_target_only = target_only
        logits = net(batch)
        logits.sum().backward()
        outputs.append((logits.detach(), {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}))
    (a, grads_a), (b, grads_b) = outputs
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=1e-4, atol=1e-6, msg=name)


def test_bst_without_position_is_permutation_invariant_and_positions_matter_otherwise():
    torch.manual_seed(0)
    batch = make_batch([6, 6, 6], seq_len=6)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    shuffled = dict(batch, **{k: batch[k][:, perm] for k in ("hist_items", "hist_categories", "hist_positions", "hist_mask")})
    none = featured_bst(position="none").eval()
    torch.testing.assert_close(none(shuffled), none(batch), rtol=1e-5, atol=1e-5)
    # a token's time delta travels with it (a set of (item, delta) pairs), its index does not
    net = featured_bst().eval()
    torch.testing.assert_close(net(shuffled), net(batch), rtol=1e-5, atol=1e-5)
    index = featured_bst(position="index").eval()
    assert not torch.allclose(index(shuffled), index(batch))
    # reordering the items under fixed time deltas changes the output, as do other deltas
    reordered = dict(shuffled, hist_positions=batch["hist_positions"])
    assert not torch.allclose(net(reordered), net(batch))
    later = dict(batch, hist_positions=(batch["hist_positions"] % (N_BUCKETS - 2)) + 1)
    assert not torch.allclose(net(later), net(batch))


def test_dice_handles_tiny_batches_and_uses_running_stats_in_eval():
    dice = Dice(4)
    for n in (0, 1, 5):
        assert dice(torch.randn(n, 4)).shape == (n, 4)
    dice.eval()
    x = torch.randn(3, 4)
    torch.testing.assert_close(dice(x)[:1], dice(x[:1]))


def test_feature_sizes_name_what_each_net_uses():
    assert featured_bst().feature_sizes == {"n_items": N_ITEMS, "n_categories": N_CATS, "n_users": N_USERS,
                                        "profile_sizes": list(PROFILE), "n_position_buckets": N_BUCKETS}
    assert featured_bst(position="index").feature_sizes["seq_len"] == 12
    assert "n_position_buckets" not in featured_bst(position="none").feature_sizes
    no_user = DIN(n_items=N_ITEMS, n_categories=N_CATS)
    assert no_user.feature_sizes == {"n_items": N_ITEMS, "n_categories": N_CATS}


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: featured_bst(position="sinusoid"), r"position='sinusoid' is not one of \['time_delta', 'index', 'none'\]"),
        (lambda: featured_bst(seq_pooling="cls"), r"seq_pooling='cls' is not one of"),
        (lambda: featured_bst(num_heads=5), r"num_heads=5 does not divide the token width 16"),
        (lambda: featured_bst(dropout=1.0), r"dropout=1.0 must be in \[0, 1\)"),
        (lambda: featured_bst(n_position_buckets=1), r"n_position_buckets=1 must be an int > 1"),
        (lambda: featured_bst(n_items=1), r"n_items=1 must be an int >= 2"),
        (lambda: featured_bst(mlp_dims=(16, 0)), r"mlp_dims=\[16, 0\]"),
        (lambda: tiny_din(activation="relu"), r"activation='relu' is not one of \['prelu', 'dice'\]"),
        (lambda: tiny_wdl(sequence_pooling="attention"), r"sequence_pooling='attention' is not one of \['none', 'mean'\]"),
    ],
)
def test_invalid_configs_fail_up_front_with_the_allowed_values(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_wide_part_hashes_crosses_into_range_and_wdl_ignores_the_sequence():
    wdl = tiny_wdl()
    batch = make_batch([3, 5], seq_len=5)
    ids = wdl.wide_ids(batch)
    # item, category, user, user x category, and per profile field: field, field x category
    assert ids.shape == (2, 4 + 2 * len(PROFILE))
    assert ((ids >= 0) & (ids < 1000)).all()
    wdl.eval()
    other = make_batch([1, 1], seq_len=5, seed=0)
    other = dict(batch, **{k: other[k] for k in ("hist_items", "hist_categories", "hist_positions", "hist_mask")})
    torch.testing.assert_close(wdl(other), wdl(batch))
    seq = tiny_wdl(WDLSeq).eval()
    assert seq.sequence_pooling == "mean"
    assert not torch.allclose(seq(other), seq(batch))

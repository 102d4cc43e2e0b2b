"""CTR models of the BST paper (Chen et al., DLP-KDD 2019, arXiv:1905.06874): BST, WDL, WDL(+Seq), DIN.

Every net maps a batch to one click logit per sample, shape (B,);
the sigmoid lives in the loss (``BCEWithLogits``) and in :meth:`CTRNet.predict_proba`.

A batch is a dict of tensors (``models.ctr_batch``: its keys, shapes and padding ids); a net reads
only the keys it needs. Padded tokens are masked, never merely zero, so a net gives the same output
for either padding side and any amount of padding (tested).

Models
------
- :class:`BST` (Sec. 3, Fig. 1): item and category embeddings concatenated with the embedding of
  the position feature; the target item appended as the last token; ``num_blocks`` post-LN
  transformer blocks; the target token's output (or the masked mean) concatenated with the
  other features into a LeakyReLU MLP.
- :class:`WDL` (Cheng et al. 2016; the paper's baseline, Sec. 4.1): a wide linear part over hashed
  raw and cross features plus a deep MLP over the embedded other features.
- :class:`WDLSeq` (WDL(+Seq), Sec. 4.1): WDL whose deep part also gets the masked mean of the
  behaviour sequence's embeddings.
- :class:`DIN` (Zhou et al., KDD 2018): the target-conditioned activation unit weights the
  sequence (masked), PReLU or Dice activations.

"Other features" (Fig. 1, left) here are: the user id embedding (``n_users > 0``), the profile
field embeddings (``profile_sizes``) and the target item's item and category embeddings. The
item and category tables are shared by the target and the sequence.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from utils.choices import check_choice, choices
from models.sdpa import scaled_dot_product_attention
from models.ctr_batch import PAD_BUCKET, ZERO_DELTA_BUCKET
from models.ctr_layers import (  # noqa: F401 - masked_mean stays importable from here
    FeatureEmbedding, check_dims, check_positive, check_rate, masked_mean, mlp_head,
)


PositionKind = Literal["time_delta", "index", "none"]
SeqPooling = Literal["target", "mean"]
SequencePooling = Literal["none", "mean"]
DINActivation = Literal["prelu", "dice"]
POSITIONS = choices(PositionKind)
SEQ_POOLINGS = choices(SeqPooling)
WDL_SEQUENCE = choices(SequencePooling)
DIN_ACTIVATIONS = choices(DINActivation)


class CTRNet(nn.Module):
    """Base of the CTR nets: ``forward(batch) -> logits (B,)``, ``predict_proba``, ``feature_sizes``."""

    features: FeatureEmbedding

    @property
    def feature_sizes(self) -> dict:
        """The vocabulary sizes (and sequence length) this net was built for, by the data's names.

        ``lightning_modules.ctr.CTRModule`` compares them with the DataModule's ``feature_sizes``
        before fitting; only the sizes the net uses are listed.
        """
        return self.features.feature_sizes()

    @torch.no_grad()
    def predict_proba(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Click probabilities (B,)."""
        return torch.sigmoid(self(batch))


# --------------------------------------------------------------------------- BST
class BSTBlock(nn.Module):
    """One post-LayerNorm transformer block of BST (Sec. 3.2: self-attention, point-wise feed-forward, stacking).

    S' = LN(S + Dropout(MH(S))), F = LN(S' + Dropout(LeakyReLU(S'W1 + b1)W2 + b2)).
    Attention is the fused ``scaled_dot_product_attention`` with a key-padding mask; the
    explicit softmax runs only when the weights are asked for (analysis).

    ``last_only=True`` computes the last token's output alone, (B, 1, D): the last row of the
    full output, for a fraction of the work. Its query still attends over every key, and every
    other step of the block acts on each token by itself, so nothing else is needed. BST's last
    block does this when only the target token (the last) is pooled.

    Shapes: x (B, T, D), key_mask (B, T) bool, True = a real token -> (B, T, D) ((B, 1, D) with
    ``last_only``).
    """

    def __init__(self, *, dim: int, num_heads: int, ffn_dim: int, dropout: float, attn_dropout: float,
                 negative_slope: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.attn_dropout = attn_dropout
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.ffn = nn.Sequential(nn.Linear(dim, ffn_dim), nn.LeakyReLU(negative_slope), nn.Linear(ffn_dim, dim))
        self.norm2 = nn.LayerNorm(dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor, need_weights: bool = False, last_only: bool = False):
        B, T, D = x.shape
        H = self.num_heads
        mask = key_mask[:, None, None, :]  # (B, 1, 1, T): broadcast over heads and queries
        weights = None
        if last_only and not need_weights:
            # qkv's output rows are [q | k | v]: keys and values of every token, the last token's query;
            # one projection each, so no gradient has to be stacked and copied back into a joint layout
            w, b = self.qkv.weight, self.qkv.bias
            k = F.linear(x, w[D:2 * D], b[D:2 * D]).view(B, T, H, D // H).transpose(1, 2)
            v = F.linear(x, w[2 * D:], b[2 * D:]).view(B, T, H, D // H).transpose(1, 2)
            x = x[:, -1:]
            q = F.linear(x, w[:D], b[:D]).view(B, 1, H, D // H).transpose(1, 2)
            T = 1
        else:
            q, k, v = self.qkv(x).view(B, T, 3, H, D // H).permute(2, 0, 3, 1, 4)
        if need_weights:
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
            weights = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            attn = F.dropout(weights, self.attn_dropout, self.training) @ v
        else:
            attn = scaled_dot_product_attention(  # models.sdpa: fp32 kernel for CPU bf16
                q, k, v, attn_mask=mask, dropout_p=self.attn_dropout if self.training else 0.0
            )
        attn = attn.transpose(1, 2).reshape(B, T, D)
        x = self.norm1(x + self.dropout(self.proj(attn)))
        x = self.norm2(x + self.dropout(self.ffn(x)))
        return (x, weights) if need_weights else x


class BST(CTRNet):
    """Behavior Sequence Transformer (Chen et al. 2019, Sec. 3, Fig. 1).

    Embedding layer (Sec. 3.1): each sequence item and the target is the concatenation
    [item_id embedding | category_id embedding | position embedding]; the target item is
    appended as the last token, so the sequence has L + 1 tokens. Position (Sec. 3.1, positional embedding), by
    ``position``:

    - ``time_delta`` (the paper): pos(v_i) = t(v_t) - t(v_i), bucketised by the data
      (``hist_positions``, 0 = padding); the target's own delta is 0, bucket
      ``ZERO_DELTA_BUCKET``. The table has ``n_position_buckets`` rows.
    - ``index``: a learned embedding per distance in steps from the target (target 1, most
      recent item 2, ...), so it does not depend on the padding; ``seq_len + 2`` rows.
    - ``none``: no position information (the tokens are a set).

    Transformer (Sec. 3.2): ``num_blocks`` :class:`BSTBlock` with a key-padding mask; the
    target token is never masked, so a history that is all padding still attends to the
    target and stays finite. Output: the target token's output (``seq_pooling='target'``) or
    the mean over the unmasked tokens (``'mean'``), concatenated with the other features
    (user, profile, target embeddings) and fed to an MLP with LeakyReLU (Sec. 3.3;
    1024-512-256 in the paper) with one logit.

    Width d = item_dim + category_dim (+ position_dim unless ``position='none'``); ``num_heads``
    must divide d. Paper hyper-parameters (Sec. 4.1 settings, unverified): 8 heads, 1 block, dropout 0.2,
    L = 20, embedding sizes 4 to 64.

    Shapes: batch (see module docstring) -> logits (B,); tokens (B, L + 1, d).
    """

    #: with target pooling the last block computes the target token alone (the same outputs);
    #: ``False`` computes every token there too, as implementations without that shortcut do
    #: (``repro bench bst`` measures both to separate equal work from the shortcut).
    last_block_target_only: bool = True

    def __init__(
        self,
        *,
        n_items: int,
        n_categories: int,
        n_users: int = 0,
        profile_sizes: Sequence[int] = (),
        n_position_buckets: int = 24,
        seq_len: int = 20,
        position: PositionKind = "time_delta",
        item_dim: int = 32,
        category_dim: int = 16,
        position_dim: int = 16,
        user_dim: int = 16,
        profile_dim: int = 8,
        num_blocks: int = 1,
        num_heads: int = 8,
        ffn_dim: int | None = None,
        dropout: float = 0.2,
        attn_dropout: float = 0.0,
        seq_pooling: SeqPooling = "target",
        mlp_dims: Sequence[int] = (1024, 512, 256),
        mlp_dropout: float = 0.0,
        negative_slope: float = 0.01,
    ) -> None:
        """
        Args:
            n_items, n_categories, n_users: vocabulary sizes (id 0 = padding); ``n_users=0``
                leaves out the user id embedding.
            profile_sizes: vocabulary size of each user-profile field (empty: none used).
            n_position_buckets: rows of the time-delta table (``position='time_delta'``).
            seq_len: the longest sequence L (rows of the index table for ``position='index'``).
            position: ``time_delta`` | ``index`` | ``none``.
            item_dim, category_dim, position_dim, user_dim, profile_dim: embedding widths.
            num_blocks: transformer blocks b (the paper: 1 best of 1, 2, 3).
            num_heads: attention heads; must divide the token width.
            ffn_dim: feed-forward width; default 4 x the token width.
            dropout: dropout after attention and the feed-forward (the paper: 0.2).
            attn_dropout: dropout on the attention weights.
            seq_pooling: ``target`` (the target token's output) | ``mean`` (unmasked tokens).
            mlp_dims: hidden widths of the final MLP.
            mlp_dropout: dropout after each MLP layer.
            negative_slope: LeakyReLU slope (feed-forward and MLP).
        """
        super().__init__()
        check_choice("position", position, PositionKind)
        check_choice("seq_pooling", seq_pooling, SeqPooling)
        check_positive(num_blocks=num_blocks, num_heads=num_heads, seq_len=seq_len)
        check_rate(dropout=dropout, attn_dropout=attn_dropout, mlp_dropout=mlp_dropout)
        mlp_dims = check_dims("mlp_dims", mlp_dims)
        if position == "time_delta":
            if not isinstance(n_position_buckets, int) or n_position_buckets <= ZERO_DELTA_BUCKET:
                raise ValueError(
                    f"n_position_buckets={n_position_buckets!r} must be an int > {ZERO_DELTA_BUCKET} "
                    f"(bucket {PAD_BUCKET} is padding, {ZERO_DELTA_BUCKET} is a delta of 0)"
                )
        if position != "none":
            check_positive(position_dim=position_dim)
        self.features = FeatureEmbedding(
            n_items=n_items, n_categories=n_categories, n_users=n_users, profile_sizes=profile_sizes,
            item_dim=item_dim, category_dim=category_dim, user_dim=user_dim, profile_dim=profile_dim,
        )
        dim = self.features.token_dim + (position_dim if position != "none" else 0)
        if dim % num_heads:
            heads = [h for h in range(1, dim + 1) if dim % h == 0]
            raise ValueError(f"num_heads={num_heads} does not divide the token width {dim}; head counts that do: {heads}")
        ffn_dim = 4 * dim if ffn_dim is None else ffn_dim
        check_positive(ffn_dim=ffn_dim)
        self.position = position
        self.seq_pooling = seq_pooling
        self.seq_len = seq_len
        self.n_position_buckets = n_position_buckets
        self.dim = dim
        if position == "time_delta":
            self.position_embedding = nn.Embedding(n_position_buckets, position_dim, padding_idx=PAD_BUCKET)
        elif position == "index":
            self.position_embedding = nn.Embedding(seq_len + 2, position_dim, padding_idx=0)
        else:
            self.position_embedding = None
        self.blocks = nn.ModuleList(
            BSTBlock(dim=dim, num_heads=num_heads, ffn_dim=ffn_dim, dropout=dropout,
                     attn_dropout=attn_dropout, negative_slope=negative_slope)
            for _ in range(num_blocks)
        )
        self.head = mlp_head(dim + self.features.other_dim, mlp_dims,
                             make_activation=lambda _: nn.LeakyReLU(negative_slope), dropout=mlp_dropout)

    @property
    def feature_sizes(self) -> dict:
        sizes = self.features.feature_sizes()
        if self.position == "time_delta":
            sizes["n_position_buckets"] = self.n_position_buckets
        if self.position == "index":
            sizes["seq_len"] = self.seq_len
        return sizes

    def embed_sequence(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens (B, L + 1, d) with the target last, and the key mask (B, L + 1), True = real."""
        hist_mask = batch["hist_mask"].bool()
        B = hist_mask.shape[0]
        items = torch.cat([batch["hist_items"], batch["target_item"][:, None]], dim=1)
        categories = torch.cat([batch["hist_categories"], batch["target_category"][:, None]], dim=1)
        mask = torch.cat([hist_mask, hist_mask.new_ones(B, 1)], dim=1)  # the target is never masked
        parts = [self.features.tokens(items, categories)]
        if self.position == "time_delta":
            target = torch.full((B, 1), ZERO_DELTA_BUCKET, dtype=torch.long, device=hist_mask.device)
            positions = torch.cat([batch["hist_positions"].long() * hist_mask, target], dim=1)
            parts.append(self.position_embedding(positions))
        elif self.position == "index":
            # steps back from the target, counted over real tokens only: target 1, newest item 2,
            # ...; padding 0. Independent of the padding side and amount.
            steps = mask.flip(1).cumsum(1).flip(1) * mask
            parts.append(self.position_embedding(steps.clamp_max(self.seq_len + 1)))
        return torch.cat(parts, dim=-1), mask

    def encode(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The transformer's sequence representation (B, d).

        Target pooling reads the last token's output alone, so the last block computes that token
        only (``BSTBlock(last_only=True)``): the same values as running it on every token.
        """
        x, mask = self.embed_sequence(batch)
        target = self.seq_pooling == "target" and self.last_block_target_only
        for i, block in enumerate(self.blocks):
            x = block(x, mask, last_only=target and i == len(self.blocks) - 1)
        return x[:, -1] if self.seq_pooling == "target" else masked_mean(x, mask)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        h = torch.cat([self.encode(batch), self.features.other(batch)], dim=-1)
        return self.head(h).squeeze(-1)

    @torch.no_grad()
    def attention_weights(self, batch: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """Per block, the attention weights (B, heads, L + 1, L + 1) (explicit softmax path)."""
        x, mask = self.embed_sequence(batch)
        weights = []
        for block in self.blocks:
            x, w = block(x, mask, need_weights=True)
            weights.append(w)
        return weights


# --------------------------------------------------------------------------- WDL, WDL(+Seq)
_HASH_A, _HASH_B = 10_000_019, 131


class WDL(CTRNet):
    """Wide & Deep (Cheng et al. 2016), the BST paper's baseline (Sec. 4.1); WDL(+Seq) by config.

    Wide part: a linear model (one weight per hashed feature, summed, plus a bias) over the raw
    ids (target item, target category, user, profile fields) and the cross features
    profile field x target category and user x target category, hashed into
    ``wide_hash_size`` buckets. Deep part: an MLP (ReLU) over the other features (user, profile,
    target embeddings); with ``sequence_pooling='mean'`` (WDL(+Seq)) also over the mean of the
    behaviour sequence's item|category embeddings, over the unmasked items only (zeros for an
    empty history). Logit = wide + deep.

    Shapes: batch -> logits (B,).
    """

    def __init__(
        self,
        *,
        n_items: int,
        n_categories: int,
        n_users: int = 0,
        profile_sizes: Sequence[int] = (),
        item_dim: int = 32,
        category_dim: int = 16,
        user_dim: int = 16,
        profile_dim: int = 8,
        mlp_dims: Sequence[int] = (1024, 512, 256),
        mlp_dropout: float = 0.0,
        wide_hash_size: int = 2**20,
        sequence_pooling: SequencePooling = "none",
    ) -> None:
        """
        Args:
            n_items, n_categories, n_users, profile_sizes: vocabulary sizes (see :class:`BST`).
            item_dim, category_dim, user_dim, profile_dim: embedding widths.
            mlp_dims: hidden widths of the deep part.
            mlp_dropout: dropout after each deep layer.
            wide_hash_size: buckets of the hashed wide features.
            sequence_pooling: ``none`` (WDL) | ``mean`` (WDL(+Seq)).
        """
        super().__init__()
        check_choice("sequence_pooling", sequence_pooling, SequencePooling)
        check_positive(wide_hash_size=wide_hash_size)
        check_rate(mlp_dropout=mlp_dropout)
        mlp_dims = check_dims("mlp_dims", mlp_dims)
        self.features = FeatureEmbedding(
            n_items=n_items, n_categories=n_categories, n_users=n_users, profile_sizes=profile_sizes,
            item_dim=item_dim, category_dim=category_dim, user_dim=user_dim, profile_dim=profile_dim,
        )
        self.sequence_pooling = sequence_pooling
        self.wide_hash_size = wide_hash_size
        self.wide = nn.Embedding(wide_hash_size, 1)
        nn.init.zeros_(self.wide.weight)
        self.wide_bias = nn.Parameter(torch.zeros(()))
        deep_in = self.features.other_dim + (self.features.token_dim if sequence_pooling == "mean" else 0)
        self.deep = mlp_head(deep_in, mlp_dims, make_activation=lambda _: nn.ReLU(), dropout=mlp_dropout)

    def wide_ids(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Hashed ids (B, n_wide) of the raw and cross features of the wide part."""
        item, category = batch["target_item"].long(), batch["target_category"].long()
        pairs = [(item, torch.zeros_like(item)), (category, torch.zeros_like(category))]
        if self.features.n_users:
            user = batch["user"].long()
            pairs += [(user, torch.zeros_like(user)), (user, category)]
        if self.features.profile_sizes:
            profile = batch["user_features"].long()
            for f in range(len(self.features.profile_sizes)):
                pairs += [(profile[:, f], torch.zeros_like(category)), (profile[:, f], category)]
        ids = [((a * _HASH_A + b) * _HASH_B + field) % self.wide_hash_size for field, (a, b) in enumerate(pairs)]
        return torch.stack(ids, dim=1)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        wide = self.wide(self.wide_ids(batch)).sum(dim=(1, 2)) + self.wide_bias
        deep_in = [self.features.other(batch)]
        if self.sequence_pooling == "mean":
            tokens = self.features.tokens(batch["hist_items"], batch["hist_categories"])
            deep_in.append(masked_mean(tokens, batch["hist_mask"].bool()))
        return wide + self.deep(torch.cat(deep_in, dim=-1)).squeeze(-1)


class WDLSeq(WDL):
    """WDL(+Seq) (Sec. 4.1): :class:`WDL` with the masked mean of the sequence in the deep part."""

    def __init__(self, *, sequence_pooling: SequencePooling = "mean", **kwargs: Any) -> None:
        """:class:`WDL`'s arguments (``**kwargs``, followed there by the CLI); ``sequence_pooling``
        defaults to ``mean``."""
        super().__init__(sequence_pooling=sequence_pooling, **kwargs)


# --------------------------------------------------------------------------- DIN
class Dice(nn.Module):
    """Dice activation (DIN, Zhou et al. 2018, Eq. 9): p(x) * x + (1 - p(x)) * alpha * x,
    p(x) = sigmoid((x - E[x]) / sqrt(Var[x] + eps)).

    E and Var are the batch statistics in training (kept as running averages, like BatchNorm,
    and used in eval). Written out rather than on BatchNorm1d so a batch of 0 or 1 rows (few
    real tokens) is fine: with fewer than 2 rows the running statistics are used.
    Shapes: (N, D) -> (N, D).
    """

    def __init__(self, dim: int, *, eps: float = 1e-8, momentum: float = 0.01) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(dim))
        self.eps, self.momentum = eps, momentum
        self.register_buffer("running_mean", torch.zeros(dim))
        self.register_buffer("running_var", torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and x.shape[0] > 1:
            mean, var = x.mean(0), x.var(0, unbiased=False)
            with torch.no_grad():
                self.running_mean.lerp_(mean.detach(), self.momentum)
                self.running_var.lerp_(var.detach(), self.momentum)
        else:
            mean, var = self.running_mean, self.running_var
        p = torch.sigmoid((x - mean) / torch.sqrt(var + self.eps))
        return p * x + (1 - p) * self.alpha * x


class DIN(CTRNet):
    """Deep Interest Network (Zhou et al., KDD 2018), the BST paper's strongest baseline (Sec. 4.1).

    Each real sequence item h_i (item|category embedding) gets the weight
    w_i = a(h_i, t) from the activation unit a = MLP([h_i, t, h_i - t, h_i * t]) -> scalar
    (``attention_dims`` hidden, PReLU or Dice), where t is the target's embedding. The user
    interest is sum_i w_i h_i over the unmasked items (DIN leaves the weights unnormalised;
    ``attention_softmax=True`` normalises them over the real items). The activation unit runs
    only on the real tokens, so padding never enters Dice's statistics. Interest, target and
    other features go to an MLP (``mlp_dims``, same activation) with one logit.

    Shapes: batch -> logits (B,); tokens (B, L, item_dim + category_dim).
    """

    def __init__(
        self,
        *,
        n_items: int,
        n_categories: int,
        n_users: int = 0,
        profile_sizes: Sequence[int] = (),
        item_dim: int = 32,
        category_dim: int = 16,
        user_dim: int = 16,
        profile_dim: int = 8,
        attention_dims: Sequence[int] = (80, 40),
        mlp_dims: Sequence[int] = (200, 80),
        activation: DINActivation = "prelu",
        attention_softmax: bool = False,
        mlp_dropout: float = 0.0,
    ) -> None:
        """
        Args:
            n_items, n_categories, n_users, profile_sizes: vocabulary sizes (see :class:`BST`).
            item_dim, category_dim, user_dim, profile_dim: embedding widths.
            attention_dims: hidden widths of the activation unit (DIN: 80-40).
            mlp_dims: hidden widths of the final MLP (DIN: 200-80).
            activation: ``prelu`` | ``dice`` (both in the activation unit and the MLP).
            attention_softmax: normalise the weights with a softmax over the real items.
            mlp_dropout: dropout after each MLP layer.
        """
        super().__init__()
        check_choice("activation", activation, DINActivation)
        check_rate(mlp_dropout=mlp_dropout)
        attention_dims = check_dims("attention_dims", attention_dims)
        mlp_dims = check_dims("mlp_dims", mlp_dims)
        self.features = FeatureEmbedding(
            n_items=n_items, n_categories=n_categories, n_users=n_users, profile_sizes=profile_sizes,
            item_dim=item_dim, category_dim=category_dim, user_dim=user_dim, profile_dim=profile_dim,
        )
        self.activation = activation
        self.attention_softmax = attention_softmax
        make = (lambda width: Dice(width)) if activation == "dice" else (lambda width: nn.PReLU(width))
        d = self.features.token_dim
        self.attention = mlp_head(4 * d, attention_dims, make_activation=make)
        self.head = mlp_head(self.features.other_dim + d, mlp_dims, make_activation=make, dropout=mlp_dropout)

    def interest(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The target-weighted sum of the sequence (B, d)."""
        mask = batch["hist_mask"].bool()
        hist = self.features.tokens(batch["hist_items"], batch["hist_categories"])  # (B, L, d)
        target = self.features.target(batch)  # (B, d)
        t = target[:, None, :].expand_as(hist)
        unit_in = torch.cat([hist, t, hist - t, hist * t], dim=-1)[mask]  # (n_real, 4d)
        scores = hist.new_zeros(mask.shape)
        scores = scores.masked_scatter(mask, self.attention(unit_in).squeeze(-1).to(scores.dtype))
        if self.attention_softmax:
            # finite fill, then re-mask: a row without real items gets all-zero weights, not NaN
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min).softmax(dim=1) * mask
        return (scores.unsqueeze(-1) * hist).sum(1)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        h = torch.cat([self.interest(batch), self.features.other(batch)], dim=-1)
        return self.head(h).squeeze(-1)


NETS = {"bst": BST, "wdl": WDL, "wdl_seq": WDLSeq, "din": DIN}

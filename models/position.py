"""Position embeddings of ViT Table 8 (Dosovitskiy et al., ICLR 2021, Appendix D.4), plus two extensions.

The paper compares *kinds* of position embedding and *placements* (where they enter the
encoder). Names here, and what they mean (N = H * W patches in raster order, D = width,
P = number of prefix tokens: 1 with a class token, else 0, T = P + N tokens):

Kinds (``POS_EMBED_KINDS``)
    ``none``         no position information: the encoder sees a bag of patches.
    ``learned_1d``   a learned vector per token in raster order; E_pos has P + N rows (Eq. 1):
                     the class token has its own learned entry. (At the stem this is timm's
                     own ``pos_embed`` parameter; see ``models/vit.py``.)
    ``learned_2d``   two learned tables X (W, D/2) and Y (H, D/2); the patch at (row, col) gets
                     concat(X[col], Y[row]). D must be even. Class token: its own learned
                     D-vector (``prefix_embed``), as learned_1d gives it its own row.
    ``sincos_2d``    fixed 2-D sin-cos table (timm's ``build_sincos2d_pos_embed``; half the
                     width encodes the row, half the column); no parameters, a non-persistent
                     buffer. D must be divisible by 4. Class token: a zero vector (as MAE and
                     MoCo v3 do); the class token's own learned value already plays that role.
                     (Not in Table 8; the small-data contrast in PAPERS.md has a sinusoidal row.)
    ``relative``     the paper's relative attention: each 1-D offset p_q - p_k in raster order,
                     in [-(N-1), N-1], indexes a learned embedding r of width D (split into
                     heads like keys are); an extra attention uses the *original* query with
                     these embeddings as keys: logits_rel[h, q, k] = q^h_q . r^h_{p_q - p_k} /
                     sqrt(d_head), added as a bias to the main attention logits before the
                     softmax. Each block's attention has its own table.
    ``relative_2d``  extension: as ``relative`` but the offset is (dr, dc) = (row_q - row_k,
                     col_q - col_k), with one *joint* learned table of (2H - 1)(2W - 1) entries
                     (not a sum of a row and a column table: the joint table can express
                     everything the sum can, and 1-D raster offsets conflate e.g. (0, W-1)
                     with (1, -1), which the joint table keeps apart).
    Class token for both relative kinds: three dedicated learned buckets after the offset
    buckets, as BEiT does: class query -> patch key, patch query -> class key, class ->
    class. So a class token has no offset to a patch; it is "elsewhere", the same for all
    patches.

Relative-attention options (``RelativeOptions``; the defaults are the paper's definition above;
the others are what published relative-attention vision transformers use, for ablations):
    ``logits``     ``contextual`` (default): the paper's q . r term, which depends on the query.
                   ``bias``: one learned scalar per head and bucket, independent of the
                   content (BEiT, Swin; timm's ``beit.Attention``); the table is
                   (buckets, heads) instead of (buckets, heads, d_head).
    ``init_std``   std of the truncated-normal init of the table (default 0.02, as timm's
                   absolute tables); 0 starts every bucket at zero (BEiT's bias table).
    ``max_offset`` clip each offset to [-k, k] (Shaw et al., NAACL 2018): 1-D raster offsets
                   become 2k + 1 buckets, 2-D offsets clip the row and column offsets each,
                   (2k + 1)^2 buckets. None (default): every offset has its own bucket.
    ``prefix``     ``buckets`` (default): the three class-token buckets above (BEiT).
                   ``skip``: no relative term on any pair with a prefix token (its logit gets
                   0; iRPE's ``skip``, Wu et al., ICCV 2021).
    ``absolute``   (``ViT(rel_absolute=True)``) also add the learned 1-D embedding at the stem,
                   as BEiT's ``use_abs_pos_emb`` and Swin's ``ape`` can: relative attention
                   alone gives no token its absolute position. Default False (the paper's
                   relative row has no absolute embedding).
    Note on the class query: a bias that is the same for every patch key does not change a
    softmax, so with either ``prefix`` the class token attends to the patches by content
    alone; its only spatial signal is what the patch tokens carry.

Placements (``POS_PLACEMENTS``)
    ``stem``                added once, after the patch embedding and class token (default).
    ``every_layer``         a separate learned embedding added at the input of every block
                            (block 0 included, nothing at the stem).
    ``every_layer_shared``  one embedding added at the input of every block.
    Valid pairs follow Table 8 (``VALID_PLACEMENTS``): ``none`` only with ``stem`` (nothing to
    place); the relative kinds live inside every block's attention, so the placement axis does
    not apply to them and only ``stem`` (the default, meaning "the paper's relative
    attention") is accepted; learned and sin-cos kinds take all three. For ``sincos_2d`` the
    two every-layer placements are the same function (the table is fixed).

Absolute modules (``LearnedPosEmbed1d``, ``LearnedPosEmbed2d``, ``SinCosPosEmbed2d``) share one
interface: ``table()`` -> (1, T, D) and ``forward(x)`` -> x + table() for x (B, T, D).
``RelativePositionLogits`` maps the per-head queries (B, heads, T, d_head) to the bias
(B, heads, T, T). Everything is keyword-only; ``build_absolute`` / ``build_relative`` make them.
"""

from __future__ import annotations

from typing import Literal, Optional

import torch
from torch import nn
from timm.layers import trunc_normal_
from timm.layers.pos_embed_sincos import build_sincos2d_pos_embed

from utils.choices import check_choice, choices

AbsoluteKind = Literal["learned_1d", "learned_2d", "sincos_2d"]
RelativeKind = Literal["relative", "relative_2d"]
PosEmbedKind = Literal["none", AbsoluteKind, RelativeKind]  # flattened: none, the absolute, the relative kinds
PosPlacement = Literal["stem", "every_layer", "every_layer_shared"]
RelativeLogits = Literal["contextual", "bias"]
RelativePrefix = Literal["buckets", "skip"]

POS_EMBED_KINDS = choices(PosEmbedKind)
POS_PLACEMENTS = choices(PosPlacement)
ABSOLUTE_KINDS = choices(AbsoluteKind)
RELATIVE_KINDS = choices(RelativeKind)
VALID_PLACEMENTS: dict[str, tuple[str, ...]] = {
    "none": ("stem",),
    "learned_1d": POS_PLACEMENTS,
    "learned_2d": POS_PLACEMENTS,
    "sincos_2d": POS_PLACEMENTS,
    "relative": ("stem",),
    "relative_2d": ("stem",),
}
NUM_PREFIX_BUCKETS = 3  # class -> patch, patch -> class, class -> class (relative kinds)
RELATIVE_LOGITS = choices(RelativeLogits)
RELATIVE_PREFIXES = choices(RelativePrefix)
DEFAULT_REL_INIT_STD = 0.02


def validate_relative_options(
    *,
    kind: PosEmbedKind,
    rel_logits: RelativeLogits = "contextual",
    rel_init_std: float = DEFAULT_REL_INIT_STD,
    rel_max_offset: Optional[int] = None,
    rel_prefix: RelativePrefix = "buckets",
    rel_absolute: bool = False,
) -> None:
    """Raise ValueError naming the bad relative-attention option; builds nothing.

    The options only mean something with a relative ``kind``: given with another kind at a
    value other than the default, they are rejected rather than silently ignored.
    """
    check_choice("rel_logits", rel_logits, RelativeLogits)
    check_choice("rel_prefix", rel_prefix, RelativePrefix)
    if isinstance(rel_init_std, bool) or not isinstance(rel_init_std, (int, float)) or not rel_init_std >= 0:
        raise ValueError(f"rel_init_std={rel_init_std!r} must be a number >= 0 (0: a zero-initialised table)")
    if rel_max_offset is not None and (
        isinstance(rel_max_offset, bool) or not isinstance(rel_max_offset, int) or rel_max_offset < 1
    ):
        raise ValueError(f"rel_max_offset={rel_max_offset!r} must be an integer >= 1, or None (no clipping)")
    if not isinstance(rel_absolute, bool):
        raise ValueError(f"rel_absolute={rel_absolute!r} must be true or false")
    if kind not in RELATIVE_KINDS:
        given = {
            name: value for name, value, default in (
                ("rel_logits", rel_logits, "contextual"),
                ("rel_init_std", rel_init_std, DEFAULT_REL_INIT_STD),
                ("rel_max_offset", rel_max_offset, None),
                ("rel_prefix", rel_prefix, "buckets"),
                ("rel_absolute", rel_absolute, False),
            ) if value != default
        }
        if given:
            raise ValueError(
                f"{', '.join(f'{k}={v!r}' for k, v in given.items())} only apply to "
                f"pos_embed in {list(RELATIVE_KINDS)} (got pos_embed={kind!r}); leave them at their defaults"
            )


def validate_position(*, kind: PosEmbedKind, placement: PosPlacement, embed_dim: int, num_heads: int = 1) -> None:
    """Raise ValueError naming the bad value and the allowed ones; builds nothing."""
    check_choice("pos_embed", kind, PosEmbedKind)
    check_choice("pos_placement", placement, PosPlacement)
    allowed = VALID_PLACEMENTS[kind]
    if placement not in allowed:
        raise ValueError(
            f"pos_placement={placement!r} is not valid with pos_embed={kind!r} "
            f"(ViT Table 8); pos_embed={kind!r} allows pos_placement in {list(allowed)}"
        )
    if kind == "learned_2d" and embed_dim % 2:
        raise ValueError(
            f"embed_dim={embed_dim} must be even for pos_embed='learned_2d' "
            "(X and Y tables of width embed_dim / 2 each)"
        )
    if kind == "sincos_2d" and embed_dim % 4:
        raise ValueError(
            f"embed_dim={embed_dim} must be divisible by 4 for pos_embed='sincos_2d' "
            "(sin and cos of the row and of the column, embed_dim / 4 frequencies each)"
        )
    if kind in RELATIVE_KINDS and embed_dim % num_heads:
        raise ValueError(f"num_heads={num_heads} does not divide embed_dim={embed_dim}")


def _grid(grid_size: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and column of every patch in raster order: two (N,) long tensors."""
    h, w = grid_size
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    return rows.flatten(), cols.flatten()


class LearnedPosEmbed1d(nn.Module):
    """Learned 1-D embedding (ViT Eq. 1, Appendix D.4 "1-D"): ``weight`` (1, P + N, D).

    Row i is the embedding of token i: the class token (if any) first, then the patches in
    raster order. Initialised like timm's ``pos_embed`` (truncated normal, std 0.02).
    """

    def __init__(self, *, grid_size: tuple[int, int], embed_dim: int, num_prefix_tokens: int = 0) -> None:
        super().__init__()
        self.grid_size = tuple(grid_size)
        self.num_prefix_tokens = num_prefix_tokens
        n = self.grid_size[0] * self.grid_size[1]
        self.weight = nn.Parameter(torch.empty(1, num_prefix_tokens + n, embed_dim))
        self.init_weights()

    def init_weights(self) -> None:
        trunc_normal_(self.weight, std=0.02)

    def table(self) -> torch.Tensor:
        """(1, P + N, D)."""
        return self.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, P + N, D) -> x + table()."""
        return x + self.table()


class LearnedPosEmbed2d(nn.Module):
    """Learned 2-D embedding (ViT Appendix D.4 "2-D"): patch (row, col) -> concat(X[col], Y[row]).

    Parameters: ``x_embed`` X (W, D/2), indexed by the column; ``y_embed`` Y (H, D/2), indexed
    by the row; ``prefix_embed`` (1, P, D), the class token's own learned entry (absent when
    P = 0). ``table()`` is (1, P + N, D), patches in raster order.
    """

    def __init__(self, *, grid_size: tuple[int, int], embed_dim: int, num_prefix_tokens: int = 0) -> None:
        super().__init__()
        if embed_dim % 2:
            raise ValueError(f"embed_dim={embed_dim} must be even for pos_embed='learned_2d'")
        self.grid_size = tuple(grid_size)
        self.num_prefix_tokens = num_prefix_tokens
        h, w = self.grid_size
        self.x_embed = nn.Parameter(torch.empty(w, embed_dim // 2))
        self.y_embed = nn.Parameter(torch.empty(h, embed_dim // 2))
        self.prefix_embed = (
            nn.Parameter(torch.empty(1, num_prefix_tokens, embed_dim)) if num_prefix_tokens else None
        )
        rows, cols = _grid(self.grid_size)
        self.register_buffer("rows", rows, persistent=False)
        self.register_buffer("cols", cols, persistent=False)
        self.init_weights()

    def init_weights(self) -> None:
        for p in (self.x_embed, self.y_embed, self.prefix_embed):
            if p is not None:
                trunc_normal_(p, std=0.02)

    def table(self) -> torch.Tensor:
        """(1, P + N, D): the prefix entries, then concat(X[col], Y[row]) per patch."""
        patches = torch.cat([self.x_embed[self.cols], self.y_embed[self.rows]], dim=-1)[None]
        if self.prefix_embed is None:
            return patches
        return torch.cat([self.prefix_embed, patches], dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, P + N, D) -> x + table()."""
        return x + self.table()


class SinCosPosEmbed2d(nn.Module):
    """Fixed 2-D sin-cos embedding (timm ``build_sincos2d_pos_embed``, temperature 10^4).

    Buffer ``patch_table`` (N, D), non-persistent (recomputed, not saved): for the patch at
    (row, col), [sin(row w), sin(col w), cos(row w), cos(col w)] with D/4 frequencies w.
    The class token gets a zero vector. No parameters, so no gradient.
    """

    def __init__(self, *, grid_size: tuple[int, int], embed_dim: int, num_prefix_tokens: int = 0) -> None:
        super().__init__()
        if embed_dim % 4:
            raise ValueError(f"embed_dim={embed_dim} must be divisible by 4 for pos_embed='sincos_2d'")
        self.grid_size = tuple(grid_size)
        self.num_prefix_tokens = num_prefix_tokens
        table = build_sincos2d_pos_embed(list(self.grid_size), dim=embed_dim)  # (N, D), rows major
        self.register_buffer("patch_table", table, persistent=False)

    def table(self) -> torch.Tensor:
        """(1, P + N, D): zeros for the prefix tokens, then the sin-cos rows."""
        t = self.patch_table
        if self.num_prefix_tokens:
            t = torch.cat([t.new_zeros(self.num_prefix_tokens, t.shape[1]), t], dim=0)
        return t[None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, P + N, D) -> x + table()."""
        return x + self.table().to(x.dtype)


_ABSOLUTE_CLASSES: dict[str, type[nn.Module]] = {
    "learned_1d": LearnedPosEmbed1d,
    "learned_2d": LearnedPosEmbed2d,
    "sincos_2d": SinCosPosEmbed2d,
}


def build_absolute(
    *, kind: AbsoluteKind, grid_size: tuple[int, int], embed_dim: int, num_prefix_tokens: int = 0
) -> nn.Module:
    """The absolute embedding module of ``kind`` (one of ``ABSOLUTE_KINDS``)."""
    check_choice("pos_embed", kind, AbsoluteKind)
    return _ABSOLUTE_CLASSES[kind](
        grid_size=grid_size, embed_dim=embed_dim, num_prefix_tokens=num_prefix_tokens
    )


def relative_position_index(
    *,
    kind: RelativeKind,
    grid_size: tuple[int, int],
    num_prefix_tokens: int = 0,
    max_offset: Optional[int] = None,
    prefix: RelativePrefix = "buckets",
) -> tuple[torch.Tensor, int]:
    """Bucket of every (query, key) pair: a (T, T) long tensor, and the number of buckets.

    ``relative``: bucket p_q - p_k + (N - 1) in [0, 2N - 2] (raster positions p).
    ``relative_2d``: bucket (dr + H - 1) * (2W - 1) + (dc + W - 1) in [0, (2H-1)(2W-1) - 1].
    ``max_offset`` k: each offset (the raster offset; dr and dc for 2-D) is clipped to [-k, k]
    first, and the buckets are counted over the clipped range (2k + 1, or the clipped rows
    times the clipped columns for 2-D).
    With prefix tokens and ``prefix='buckets'``, three more buckets follow the offset buckets:
    B (prefix query -> patch key), B + 1 (patch query -> prefix key), B + 2 (prefix -> prefix).
    With ``prefix='skip'``, pairs with a prefix token get -1 (no bucket: their logit gets 0).
    """
    check_choice("pos_embed", kind, RelativeKind)
    check_choice("rel_prefix", prefix, RelativePrefix)
    h, w = grid_size
    n = h * w
    rows, cols = _grid((h, w))

    def clipped(offset: torch.Tensor, largest: int) -> tuple[torch.Tensor, int]:
        """Offsets in [-largest, largest], clipped to max_offset -> (bucket from 0, reach)."""
        reach = largest if max_offset is None else min(largest, max_offset)
        return offset.clamp(-reach, reach) + reach, reach

    if kind == "relative":
        pos = torch.arange(n)
        index, reach = clipped(pos[:, None] - pos[None, :], n - 1)
        num_offsets = 2 * reach + 1
    else:  # relative_2d
        dr, reach_r = clipped(rows[:, None] - rows[None, :], h - 1)
        dc, reach_c = clipped(cols[:, None] - cols[None, :], w - 1)
        index = dr * (2 * reach_c + 1) + dc
        num_offsets = (2 * reach_r + 1) * (2 * reach_c + 1)
    if not num_prefix_tokens:
        return index, num_offsets
    t = num_prefix_tokens + n
    full = torch.empty(t, t, dtype=torch.long)
    full[num_prefix_tokens:, num_prefix_tokens:] = index
    if prefix == "skip":
        full[:num_prefix_tokens, :] = -1
        full[:, :num_prefix_tokens] = -1
        return full, num_offsets
    full[:num_prefix_tokens, num_prefix_tokens:] = num_offsets  # class query -> patch key
    full[num_prefix_tokens:, :num_prefix_tokens] = num_offsets + 1  # patch query -> class key
    full[:num_prefix_tokens, :num_prefix_tokens] = num_offsets + 2  # class -> class
    return full, num_offsets + NUM_PREFIX_BUCKETS


class RelativePositionLogits(nn.Module):
    """Relative attention logits (ViT Appendix D.4 "relative"; ``relative_2d``: 2-D offsets).

    ``embed``: the learned table, one entry per offset bucket (see ``relative_position_index``):
    (num_buckets, heads, d_head) for ``logits='contextual'``, an embedding of width
    D = heads * d_head split into heads as keys are; (num_buckets, heads) for ``logits='bias'``.
    ``index`` (T, T): non-persistent buffer, bucket of each (query, key) pair (-1: none).

    forward(q): q (B, heads, T, d_head), the original per-head queries (before any scaling)
    -> bias added to the main attention logits before the softmax:
    ``contextual``: (B, heads, T, T), bias[b, h, i, j] = q[b, h, i] . embed[index[i, j], h] / sqrt(d_head);
    ``bias``: (1, heads, T, T), bias[0, h, i, j] = embed[index[i, j], h] (no query term).
    Pairs with index -1 (``prefix='skip'``) get 0.
    Memory (contextual): the gathered embeddings are (T, T, D), independent of the batch; the
    bias is (B, heads, T, T), as large as the attention matrix the fused kernel otherwise avoids.
    """

    def __init__(
        self,
        *,
        kind: RelativeKind,
        grid_size: tuple[int, int],
        num_heads: int,
        head_dim: int,
        num_prefix_tokens: int = 0,
        logits: RelativeLogits = "contextual",
        init_std: float = DEFAULT_REL_INIT_STD,
        max_offset: Optional[int] = None,
        prefix: RelativePrefix = "buckets",
    ) -> None:
        super().__init__()
        validate_relative_options(
            kind=kind, rel_logits=logits, rel_init_std=init_std, rel_max_offset=max_offset, rel_prefix=prefix
        )
        self.kind = kind
        self.grid_size = tuple(grid_size)
        self.num_prefix_tokens = num_prefix_tokens
        self.logits = logits
        self.init_std = float(init_std)
        self.max_offset = max_offset
        self.prefix = prefix
        self.scale = head_dim ** -0.5
        index, num_buckets = relative_position_index(
            kind=kind, grid_size=self.grid_size, num_prefix_tokens=num_prefix_tokens,
            max_offset=max_offset, prefix=prefix,
        )
        self.num_buckets = num_buckets
        self.skips = bool((index < 0).any())
        # skipped pairs look up an extra all-zero row (not a parameter), so the gather stays one op
        self.register_buffer("index", torch.where(index < 0, num_buckets, index), persistent=False)
        shape = (num_buckets, num_heads, head_dim) if logits == "contextual" else (num_buckets, num_heads)
        self.embed = nn.Parameter(torch.empty(shape))
        self.init_weights()

    def init_weights(self) -> None:
        if self.init_std > 0:
            trunc_normal_(self.embed, std=self.init_std)
        else:
            nn.init.zeros_(self.embed)

    def table(self) -> torch.Tensor:
        """``embed``, plus a zero row for the skipped pairs when ``prefix='skip'`` has any."""
        if not self.skips:
            return self.embed
        return torch.cat([self.embed, self.embed.new_zeros(1, *self.embed.shape[1:])])

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        r = self.table()[self.index].to(q.dtype)  # (T, T, heads[, d_head]): the entry of each pair
        if self.logits == "bias":
            return r.permute(2, 0, 1)[None]
        return torch.einsum("bhqd,qkhd->bhqk", q, r) * self.scale


def build_relative(**kwargs) -> RelativePositionLogits:
    """The relative-logits module: ``RelativePositionLogits(**kwargs)`` (keyword-only; ``kind`` one
    of ``RELATIVE_KINDS``; options: the module docstring's "Relative-attention options")."""
    return RelativePositionLogits(**kwargs)

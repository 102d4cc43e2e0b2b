"""Vision Transformer (Dosovitskiy et al., ICLR 2021, arXiv:2010.11929) on timm's VisionTransformer.

Every ablation axis of the paper is a keyword with a closed set of values, a ``typing.Literal``
in the signature (``utils/choices.py``): the CLI rejects a bad value while parsing the config,
and the constructor checks it again before anything is built, so a ViT made in Python fails
with the bad value and the allowed ones too:

- ``patch_size``: side of the square patches; must divide ``img_size``. Tokens = (img_size / patch_size)^2.
- ``pool``: how the image representation is read off the encoder (Sec. 3.1, Appendix D.3).
    * ``cls``: a learned class token is prepended; the final LayerNorm is applied to every
      token and the class token's output is the representation (the paper's default).
    * ``gap``: no class token; the final LayerNorm is applied to every patch token and the
      normalised tokens are averaged (global average pooling). This is the paper's placement
      (the original code normalises in the encoder, then pools), not timm's default for
      ``avg`` (which pools first and normalises after, ``fc_norm``).
- ``pos_embed``: the position embedding kind (Appendix D.4, Table 8; ``models/position.py``
  defines each, including what the class token gets):
  ``none`` | ``learned_1d`` (default) | ``learned_2d`` | ``sincos_2d`` | ``relative`` | ``relative_2d``.
- ``pos_placement``: where an absolute embedding enters (Table 8's columns):
  ``stem`` (default) | ``every_layer`` | ``every_layer_shared``. ``none`` and the relative
  kinds take only ``stem``.
  With ``learned_1d`` + ``stem`` the model is exactly timm's ViT (timm's ``pos_embed``
  parameter, same names and parameter count). Other stem kinds live in ``pos_stem``; a shared
  every-layer embedding in ``pos_shared``; per-layer ones in ``blocks[i].pos``; relative
  tables in ``blocks[i].attn.rel_pos``. ``absolute_pos_embed(block)`` returns any of them as a
  (1, T, D) table.
- ``rel_logits``, ``rel_init_std``, ``rel_max_offset``, ``rel_prefix``, ``rel_absolute``: the
  relative-attention options of published relative ViTs (``models/position.py``, "Relative-
  attention options"); only with a relative ``pos_embed``, whose defaults are the paper's.
- ``attention``: how a query scores a key, per head.
    * ``dot``: softmax(q k^T / sqrt(d_head) + bias) (the paper's).
    * ``additive``: Bahdanau-style score(q, k) = v^T tanh(W_q q + W_k k), with W_q, W_k
      (d_head -> d_a) and v (d_a) per head, d_a = ``additive_dim`` (default d_head). It cannot
      use the fused kernel: the (B, heads, T, T, d_a) tanh activations are materialised and
      kept for the backward pass, O(B * heads * T^2 * d_a) memory, d_a times the attention
      matrix. Meant for small models; lower ``additive_dim`` to save memory.
- ``dropout`` (after the stem, i.e. after adding the position embedding, for every kind, and
  after every dense layer but the qkv projection, as in Appendix B.1), ``attn_dropout`` (on
  the attention weights) and ``drop_path`` (stochastic depth, linearly increasing with depth
  as in timm).

Attention paths. Training uses timm's fused attention (``F.scaled_dot_product_attention``);
relative position logits go in as its additive float ``attn_mask`` (B, heads, T, T). The
explicit path computes softmax(logits + bias) @ V by hand and can keep the weights: use
``with explicit_attention(model) as weights: model(x)``; then ``weights[i]`` is block i's
(B, heads, T, T) softmax (rows sum to 1). Per module: ``blocks[i].attn.fused_attn = False``
(timm's switch) selects the explicit path and ``blocks[i].attn.return_weights = True`` stores
``blocks[i].attn.last_weights``. Additive scoring always takes the explicit path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Literal, Optional

import torch
import torch.nn.functional as F
from torch import nn
from timm.layers import LayerNorm
from timm.layers.attention import Attention, maybe_add_mask, resolve_self_attn_mask
from timm.models.vision_transformer import Block, VisionTransformer

from models.sdpa import scaled_dot_product_attention
from utils.choices import check_choice, choices
from models.position import (
    POS_EMBED_KINDS,
    RELATIVE_KINDS,
    DEFAULT_REL_INIT_STD,
    AbsoluteKind,
    LearnedPosEmbed1d,
    LearnedPosEmbed2d,
    PosEmbedKind,
    PosPlacement,
    RelativeLogits,
    RelativePrefix,
    RelativeKind,
    RelativePositionLogits,
    SinCosPosEmbed2d,
    build_absolute,
    build_relative,
    validate_position,
    validate_relative_options,
)

Pooling = Literal["cls", "gap"]
AttentionScoring = Literal["dot", "additive"]
POOLINGS = choices(Pooling)
POS_EMBEDS = POS_EMBED_KINDS
ATTENTIONS = choices(AttentionScoring)
POSITION_MODULES = (LearnedPosEmbed1d, LearnedPosEmbed2d, SinCosPosEmbed2d, RelativePositionLogits)


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if value <= 0:
            raise ValueError(f"{name}={value!r} must be positive")


def _check_rate(**values: float) -> None:
    for name, value in values.items():
        if not 0.0 <= value < 1.0:
            raise ValueError(f"{name}={value!r} must be in [0, 1)")


def validate_vit_config(
    *,
    img_size: int,
    in_chans: int,
    num_classes: int,
    patch_size: int,
    embed_dim: int,
    depth: int,
    num_heads: int,
    mlp_ratio: float,
    pool: Pooling,
    pos_embed: PosEmbedKind,
    dropout: float,
    attn_dropout: float,
    drop_path: float,
    pos_placement: PosPlacement = "stem",
    attention: AttentionScoring = "dot",
    additive_dim: Optional[int] = None,
    rel_logits: RelativeLogits = "contextual",
    rel_init_std: float = DEFAULT_REL_INIT_STD,
    rel_max_offset: Optional[int] = None,
    rel_prefix: RelativePrefix = "buckets",
    rel_absolute: bool = False,
) -> None:
    """Raise ValueError naming the first invalid value; called before any module is built."""
    _check_positive(
        img_size=img_size, in_chans=in_chans, num_classes=num_classes, patch_size=patch_size,
        embed_dim=embed_dim, depth=depth, num_heads=num_heads, mlp_ratio=mlp_ratio,
    )
    check_choice("pool", pool, Pooling)
    check_choice("pos_embed", pos_embed, PosEmbedKind)
    check_choice("pos_placement", pos_placement, PosPlacement)
    check_choice("attention", attention, AttentionScoring)
    if additive_dim is not None:
        if attention != "additive":
            raise ValueError(
                f"additive_dim={additive_dim!r} is only used with attention='additive' "
                f"(got attention={attention!r}); leave it None"
            )
        _check_positive(additive_dim=additive_dim)
    _check_rate(dropout=dropout, attn_dropout=attn_dropout, drop_path=drop_path)
    if img_size % patch_size:
        divisors = [p for p in range(1, img_size + 1) if img_size % p == 0]
        raise ValueError(
            f"patch_size={patch_size} does not divide img_size={img_size}; "
            f"patch sizes that do: {divisors}"
        )
    if embed_dim % num_heads:
        heads = [h for h in range(1, embed_dim + 1) if embed_dim % h == 0 and h <= 64]
        raise ValueError(
            f"num_heads={num_heads} does not divide embed_dim={embed_dim}; "
            f"head counts that do: {heads}"
        )
    validate_position(kind=pos_embed, placement=pos_placement, embed_dim=embed_dim, num_heads=num_heads)
    validate_relative_options(
        kind=pos_embed, rel_logits=rel_logits, rel_init_std=rel_init_std,
        rel_max_offset=rel_max_offset, rel_prefix=rel_prefix, rel_absolute=rel_absolute,
    )


class ViTAttention(Attention):
    """timm's multi-head self-attention plus relative position logits, additive scoring and
    an explicit path that can return the attention weights.

    Parameter names are timm's (``qkv``, ``q_norm``, ``k_norm``, ``norm``, ``proj``, ``gate``),
    plus ``rel_pos.embed`` (relative kinds) and ``additive_q`` (heads, d_head, d_a),
    ``additive_k`` (heads, d_head, d_a), ``additive_v`` (heads, d_a) (additive scoring).

    x (B, T, D) -> (B, T, D). Paths:
    - fused (``fused_attn`` True, ``scoring='dot'``, ``return_weights`` False): timm's
      ``F.scaled_dot_product_attention`` call; the relative bias (B, heads, T, T) is its
      float ``attn_mask``. Without a relative bias this is exactly timm's ``Attention``.
    - explicit (otherwise): logits = (q / sqrt(d_head)) k^T (timm's unfused order) or the
      additive scores, + bias, softmax, dropout, @ V. With ``return_weights`` the softmax
      (B, heads, T, T), before dropout and detached, is kept in ``last_weights``.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        scoring: AttentionScoring = "dot",
        additive_dim: Optional[int] = None,
        rel_pos: Optional[RelativePositionLogits] = None,
        **kwargs,
    ) -> None:
        check_choice("attention", scoring, AttentionScoring)
        super().__init__(dim, num_heads=num_heads, **kwargs)
        self.scoring = scoring
        self.rel_pos = rel_pos
        self.return_weights = False
        self.last_weights: Optional[torch.Tensor] = None
        self.additive_dim = (additive_dim or self.head_dim) if scoring == "additive" else None
        if scoring == "additive":
            dd = {"device": kwargs.get("device"), "dtype": kwargs.get("dtype")}
            d_a = self.additive_dim
            self.additive_q = nn.Parameter(torch.empty(num_heads, self.head_dim, d_a, **dd))
            self.additive_k = nn.Parameter(torch.empty(num_heads, self.head_dim, d_a, **dd))
            self.additive_v = nn.Parameter(torch.empty(num_heads, d_a, **dd))
        else:
            self.additive_q = self.additive_k = self.additive_v = None
        self.init_weights()

    def init_weights(self) -> None:
        """Additive-scoring weights like ``nn.Linear``'s default: U(+-1/sqrt(fan_in)).

        Only this module's own parameters; timm's init handles qkv/proj and ``rel_pos``.
        """
        if self.scoring == "additive":
            for p, fan_in in (
                (self.additive_q, self.head_dim),
                (self.additive_k, self.head_dim),
                (self.additive_v, self.additive_dim),
            ):
                nn.init.uniform_(p, -fan_in ** -0.5, fan_in ** -0.5)

    def logits(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """Attention logits before any bias: q, k (B, heads, T, d_head) -> (B, heads, T, T)."""
        if self.scoring == "dot":
            return (q * self.scale) @ k.transpose(-2, -1)
        qa = torch.einsum("bhnd,hda->bhna", q, self.additive_q)
        ka = torch.einsum("bhnd,hda->bhna", k, self.additive_k)
        hidden = torch.tanh(qa.unsqueeze(3) + ka.unsqueeze(2))  # (B, heads, T, T, d_a): the memory cost
        return torch.einsum("bhqka,ha->bhqk", hidden, self.additive_v)

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: Optional[torch.Tensor] = None,
        is_causal: bool = False,
    ) -> torch.Tensor:
        B, N, C = x.shape
        gate = self.gate(x).sigmoid() if self.gate is not None else None
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)

        if self.rel_pos is not None:
            # The paper's relative attention: the original query against the offset embeddings.
            bias = self.rel_pos(q).to(q.dtype)
            if attn_mask is not None or is_causal:
                bias = bias + resolve_self_attn_mask(N, bias, attn_mask, is_causal)
            attn_mask, is_causal = bias, False

        if self.fused_attn and self.scoring == "dot" and not self.return_weights:
            x = scaled_dot_product_attention(  # models.sdpa: fp32 kernel for CPU bf16 (several times faster)
                q, k, v,
                attn_mask=attn_mask,
                dropout_p=self.attn_drop.p if self.training else 0.0,
                is_causal=is_causal,
            )
        else:
            attn = self.logits(q, k)
            attn = maybe_add_mask(attn, resolve_self_attn_mask(N, attn, attn_mask, is_causal))
            attn = attn.softmax(dim=-1)
            if self.return_weights:
                self.last_weights = attn.detach()
            attn = self.attn_drop(attn)
            x = attn @ v

        x = x.transpose(1, 2).reshape(B, N, self.attn_dim)
        x = self.norm(x)
        if gate is not None:
            x = x * gate
        x = self.proj(x)
        x = self.proj_drop(x)
        return x


class ViTBlock(Block):
    """timm's pre-norm ``Block`` with a ``ViTAttention`` and an optional position embedding
    added at its input (placements ``every_layer``: its own ``pos``; ``every_layer_shared``:
    a module owned by the ViT as ``pos_shared``, referenced here without registering it, so
    it is saved and counted once). Parameter names are timm's; x (B, T, D) -> (B, T, D).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        scale_attn_norm: bool = False,
        proj_bias: bool = True,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        norm_layer: type[nn.Module] = LayerNorm,
        attn_layer=None,  # replaced by ViTAttention
        scoring: AttentionScoring = "dot",
        additive_dim: Optional[int] = None,
        relative: Optional[RelativeKind] = None,
        relative_options: Optional[dict] = None,
        layer_pos: Optional[AbsoluteKind] = None,
        shared_pos: Optional[nn.Module] = None,
        grid_size: tuple[int, int] = (1, 1),
        num_prefix_tokens: int = 0,
        device=None,
        dtype=None,
        **kwargs,
    ) -> None:
        # nn.Identity swallows timm's attention arguments; the real attention is built below.
        super().__init__(
            dim, num_heads, qkv_bias=qkv_bias, qk_norm=qk_norm, scale_attn_norm=scale_attn_norm,
            proj_bias=proj_bias, proj_drop=proj_drop, attn_drop=attn_drop, norm_layer=norm_layer,
            attn_layer=nn.Identity, device=device, dtype=dtype, **kwargs,
        )
        head_dim = dim // num_heads
        self.attn = ViTAttention(  # same slot in _modules as timm's, so the same parameter order
            dim, num_heads=num_heads, qkv_bias=qkv_bias, qk_norm=qk_norm,
            scale_norm=scale_attn_norm, proj_bias=proj_bias, attn_drop=attn_drop,
            proj_drop=proj_drop, norm_layer=norm_layer, device=device, dtype=dtype,
            scoring=scoring, additive_dim=additive_dim,
            rel_pos=build_relative(
                kind=relative, grid_size=grid_size, num_heads=num_heads, head_dim=head_dim,
                num_prefix_tokens=num_prefix_tokens, **(relative_options or {}),
            ) if relative else None,
        )
        self.pos = build_absolute(
            kind=layer_pos, grid_size=grid_size, embed_dim=dim, num_prefix_tokens=num_prefix_tokens
        ) if layer_pos else None
        self._shared_pos = (shared_pos,) if shared_pos is not None else ()  # a tuple: not registered

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: Optional[torch.Tensor] = None,
        is_causal: bool = False,
    ) -> torch.Tensor:
        if self.pos is not None:
            x = self.pos(x)
        for pos in self._shared_pos:
            x = pos(x)
        return super().forward(x, attn_mask=attn_mask, is_causal=is_causal)


class AttentionWeights(Sequence):
    """Per-block attention weights collected by ``explicit_attention``: item i is block i's
    softmax (B, heads, T, T) from the latest forward (None before one). Live inside the
    ``with`` block, frozen when it exits. ``torch.stack(list(w))`` gives (L, B, heads, T, T).
    """

    def __init__(self, modules: list[ViTAttention]) -> None:
        self._modules = modules
        self._frozen: Optional[list[Optional[torch.Tensor]]] = None

    def _items(self) -> list[Optional[torch.Tensor]]:
        if self._frozen is not None:
            return self._frozen
        return [m.last_weights for m in self._modules]

    def __getitem__(self, i):
        return self._items()[i]

    def __len__(self) -> int:
        return len(self._modules)

    def freeze(self) -> None:
        self._frozen = self._items()


@contextmanager
def explicit_attention(model: nn.Module, *, store_weights: bool = True) -> Iterator[AttentionWeights]:
    """Run every ``ViTAttention`` in ``model`` on the explicit softmax path, for analysis.

    Yields an ``AttentionWeights`` (one (B, heads, T, T) tensor per block, in block order,
    filled by each forward; detached). On exit the previous paths are restored and the
    modules drop their stored weights (the yielded object keeps the last ones).

        with explicit_attention(model) as weights:
            logits = model(images)
        maps = torch.stack(list(weights))  # (depth, B, heads, T, T)
    """
    modules = [m for m in model.modules() if isinstance(m, ViTAttention)]
    if not modules:
        raise TypeError(
            f"{type(model).__name__} has no ViTAttention module; build the model with models.vit.ViT"
        )
    saved = [(m.fused_attn, m.return_weights) for m in modules]
    weights = AttentionWeights(modules)
    try:
        for m in modules:
            m.fused_attn, m.return_weights, m.last_weights = False, store_weights, None
        yield weights
    finally:
        weights.freeze()
        for m, (fused, ret) in zip(modules, saved):
            m.fused_attn, m.return_weights, m.last_weights = fused, ret, None


class ViT(VisionTransformer):
    """ViT classifier configured by keyword; a timm ``VisionTransformer`` underneath.

    Being a timm VisionTransformer, it keeps timm's ``forward_features`` / ``forward_head``
    split, ``no_weight_decay()``, checkpoint-compatible parameter names, and works with every
    tool in this repository that accepts a timm ViT (analysis/). Blocks are ``ViTBlock`` with
    ``ViTAttention`` for every configuration (numerically timm's on the fused path), so
    ``explicit_attention`` works on all of them.

    Shapes: input (B, in_chans, img_size, img_size) -> logits (B, num_classes);
    tokens (B, N + [1 if pool == 'cls'], embed_dim) with N = (img_size // patch_size) ** 2.

    ``embed_layer`` (default None: timm's ``PatchEmbed``, patches of the image) swaps the
    token embedding, as timm's own ``embed_layer`` does: a callable taking timm's keywords
    (``img_size, patch_size, in_chans, embed_dim, bias, dynamic_img_pad``) and returning a
    module with a ``grid_size``. The hybrid (``models/hybrid.py``) passes
    ``partial(HybridEmbed, backbone=cnn)``: then ``patch_size`` is counted in feature-map
    pixels and N is the CNN's grid. The layer is built first (its grid sizes the position
    embeddings), then handed to timm.
    """

    def __init__(
        self,
        *,
        img_size: int = 32,
        in_chans: int = 3,
        num_classes: int = 10,
        patch_size: int = 4,
        embed_dim: int = 192,
        depth: int = 6,
        num_heads: int = 3,
        mlp_ratio: float = 4.0,
        pool: Pooling = "cls",
        pos_embed: PosEmbedKind = "learned_1d",
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        drop_path: float = 0.0,
        pos_placement: PosPlacement = "stem",
        attention: AttentionScoring = "dot",
        additive_dim: Optional[int] = None,
        rel_logits: RelativeLogits = "contextual",
        rel_init_std: float = DEFAULT_REL_INIT_STD,
        rel_max_offset: Optional[int] = None,
        rel_prefix: RelativePrefix = "buckets",
        rel_absolute: bool = False,
        embed_layer: Optional[Callable[..., nn.Module]] = None,
    ) -> None:
        validate_vit_config(
            img_size=img_size, in_chans=in_chans, num_classes=num_classes, patch_size=patch_size,
            embed_dim=embed_dim, depth=depth, num_heads=num_heads, mlp_ratio=mlp_ratio,
            pool=pool, pos_embed=pos_embed, dropout=dropout, attn_dropout=attn_dropout,
            drop_path=drop_path, pos_placement=pos_placement, attention=attention,
            additive_dim=additive_dim, rel_logits=rel_logits, rel_init_std=rel_init_std,
            rel_max_offset=rel_max_offset, rel_prefix=rel_prefix, rel_absolute=rel_absolute,
        )
        timm_embed_layer = {}  # timm's PatchEmbed unless a layer is given
        if embed_layer is None:
            grid_size = (img_size // patch_size, img_size // patch_size)
        else:
            embed = embed_layer(
                img_size=img_size, patch_size=patch_size, in_chans=in_chans, embed_dim=embed_dim,
                bias=True, dynamic_img_pad=False,
            )
            grid_size = tuple(int(g) for g in embed.grid_size)
            timm_embed_layer = dict(embed_layer=lambda **_: embed)  # hand timm the built layer
        num_prefix_tokens = 1 if pool == "cls" else 0
        absolute = dict(grid_size=grid_size, embed_dim=embed_dim, num_prefix_tokens=num_prefix_tokens)
        shared = (
            build_absolute(kind=pos_embed, **absolute) if pos_placement == "every_layer_shared" else None
        )
        block_fn = partial(
            ViTBlock,
            scoring=attention,
            additive_dim=additive_dim,
            relative=pos_embed if pos_embed in RELATIVE_KINDS else None,
            relative_options=dict(
                logits=rel_logits, init_std=rel_init_std, max_offset=rel_max_offset, prefix=rel_prefix
            ),
            layer_pos=pos_embed if pos_placement == "every_layer" else None,
            shared_pos=shared,
            grid_size=grid_size,
            num_prefix_tokens=num_prefix_tokens,
        )
        super().__init__(
            img_size=img_size,
            patch_size=patch_size,
            in_chans=in_chans,
            num_classes=num_classes,
            global_pool="token" if pool == "cls" else "avg",
            class_token=pool == "cls",
            # timm's own table for the paper's default, so it stays exactly timm's ViT (and
            # beside relative attention with rel_absolute)
            pos_embed="learn" if (pos_embed, pos_placement) == ("learned_1d", "stem") or rel_absolute else "none",
            fc_norm=False,  # LayerNorm before pooling for both heads (see module docstring)
            final_norm=True,
            embed_dim=embed_dim,
            depth=depth,
            num_heads=num_heads,
            mlp_ratio=mlp_ratio,
            pos_drop_rate=dropout,
            proj_drop_rate=dropout,
            attn_drop_rate=attn_dropout,
            drop_path_rate=drop_path,
            block_fn=block_fn,
            **timm_embed_layer,
        )
        stem_kind = pos_embed if pos_placement == "stem" and pos_embed in ("learned_2d", "sincos_2d") else None
        self.pos_stem = build_absolute(kind=stem_kind, **absolute) if stem_kind else None
        self.pos_shared = shared
        self.img_size = img_size
        self.in_chans = in_chans
        self.patch_size = patch_size
        self.pool_kind = pool  # (timm uses `self.pool` for its pooling method)
        self.pos_embed_kind = pos_embed
        self.pos_placement = pos_placement
        self.rel_absolute = rel_absolute
        self.attention_kind = attention

    def _pos_embed(self, x: torch.Tensor) -> torch.Tensor:
        """Patch tokens (B, H, W, D) or (B, N, D) -> (B, T, D): class token, stem embedding, dropout."""
        if self.pos_embed is not None:  # learned_1d at the stem: timm's code, dropout included
            return super()._pos_embed(x)
        x = super()._pos_embed(x)  # without timm's table: only the class token is prepended
        if self.pos_stem is not None:
            x = self.pos_stem(x)
        return self.pos_drop(x)

    def absolute_pos_embed(self, block: Optional[int] = None) -> Optional[torch.Tensor]:
        """The absolute position table (1, T, D) added at the stem (``block=None``) or at the
        input of block ``block``; None where nothing is added (e.g. none, relative kinds)."""
        if block is None:
            if self.pos_embed is not None:
                return self.pos_embed
            return self.pos_stem.table() if self.pos_stem is not None else None
        blk = self.blocks[block]
        if blk.pos is not None:
            return blk.pos.table()
        return self.pos_shared.table() if self.pos_shared is not None else None

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        """timm's set plus the full name of every position-embedding parameter."""
        names = set(super().no_weight_decay())
        for prefix, module in self.named_modules():
            if isinstance(module, POSITION_MODULES):
                names |= {f"{prefix}.{n}" for n, _ in module.named_parameters()}
        return names

    def shard_units(self) -> list[nn.Module]:
        """The modules to shard as separate FSDP units (``lightning_modules.sharding``): the
        transformer blocks. The rest (stem, position tables, class token, final norm, head) is
        the root unit."""
        return list(self.blocks)

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        """timm's groups (for layer-wise learning-rate decay), stem tables included in the stem."""
        groups = super().group_matcher(coarse)
        groups["stem"] = r"^cls_token|reg_token|pos_embed|pos_stem|pos_shared|patch_embed|norm_pre"
        return groups

    def set_input_size(self, img_size=None, patch_size=None) -> None:
        if self.pos_embed_kind != "none" and self.pos_embed is None:
            raise NotImplementedError(
                f"set_input_size supports pos_embed in ['none', 'learned_1d' at the stem], "
                f"not pos_embed={self.pos_embed_kind!r} with pos_placement={self.pos_placement!r}"
            )
        super().set_input_size(img_size=img_size, patch_size=patch_size)

    @property
    def grid_size(self) -> tuple[int, int]:
        """Patch grid (rows, cols)."""
        return tuple(self.patch_embed.grid_size)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """(channels, height, width) of one input image."""
        return (self.in_chans, self.img_size, self.img_size)

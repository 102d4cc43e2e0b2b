"""Vision Transformer (Dosovitskiy et al., ICLR 2021, arXiv:2010.11929) on timm's VisionTransformer.

Every ablation axis of the paper is a keyword with a closed set of values, validated before
anything is built, so a bad config fails with the bad value and the allowed ones:

- ``patch_size``: side of the square patches; must divide ``img_size``. Tokens = (img_size / patch_size)^2.
- ``pool``: how the image representation is read off the encoder (Sec. 3.1, Appendix D.3).
    * ``cls``: a learned class token is prepended; the final LayerNorm is applied to every
      token and the class token's output is the representation (the paper's default).
    * ``gap``: no class token; the final LayerNorm is applied to every patch token and the
      normalised tokens are averaged (global average pooling). This is the paper's placement
      (the original code normalises in the encoder, then pools), not timm's default for
      ``avg`` (which pools first and normalises after, ``fc_norm``).
- ``pos_embed``: the position embedding (Appendix D.4).
    * ``none``: no position information; the encoder sees a bag of patches.
    * ``learned_1d``: one learned vector per token in raster order, added once after the patch
      embedding. With ``pool='cls'`` the class token has its own entry (E_pos has N+1 rows, Eq. 1).
- ``dropout`` (after the position embedding and after every dense layer but the qkv
  projection, as in Appendix B.1), ``attn_dropout`` (on the attention weights) and
  ``drop_path`` (stochastic depth, linearly increasing with depth as in timm).

Training uses timm's fused attention (``F.scaled_dot_product_attention``).
"""

from __future__ import annotations

from timm.models.vision_transformer import VisionTransformer

POOLINGS = ("cls", "gap")
POS_EMBEDS = ("none", "learned_1d")


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not one of {list(allowed)}")


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
    pool: str,
    pos_embed: str,
    dropout: float,
    attn_dropout: float,
    drop_path: float,
) -> None:
    """Raise ValueError naming the first invalid value; called before any module is built."""
    _check_positive(
        img_size=img_size, in_chans=in_chans, num_classes=num_classes, patch_size=patch_size,
        embed_dim=embed_dim, depth=depth, num_heads=num_heads, mlp_ratio=mlp_ratio,
    )
    _check_choice("pool", pool, POOLINGS)
    _check_choice("pos_embed", pos_embed, POS_EMBEDS)
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


class ViT(VisionTransformer):
    """ViT classifier configured by keyword; a timm ``VisionTransformer`` underneath.

    Being a timm VisionTransformer, it keeps timm's ``forward_features`` / ``forward_head``
    split, ``no_weight_decay()``, checkpoint-compatible parameter names, and works with every
    tool in this repository that accepts a timm ViT (analysis/).

    Shapes: input (B, in_chans, img_size, img_size) -> logits (B, num_classes);
    tokens (B, N + [1 if pool == 'cls'], embed_dim) with N = (img_size // patch_size) ** 2.
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
        pool: str = "cls",
        pos_embed: str = "learned_1d",
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        drop_path: float = 0.0,
    ) -> None:
        validate_vit_config(
            img_size=img_size, in_chans=in_chans, num_classes=num_classes, patch_size=patch_size,
            embed_dim=embed_dim, depth=depth, num_heads=num_heads, mlp_ratio=mlp_ratio,
            pool=pool, pos_embed=pos_embed, dropout=dropout, attn_dropout=attn_dropout,
            drop_path=drop_path,
        )
        super().__init__(
            img_size=img_size,
            patch_size=patch_size,
            in_chans=in_chans,
            num_classes=num_classes,
            global_pool="token" if pool == "cls" else "avg",
            class_token=pool == "cls",
            pos_embed="learn" if pos_embed == "learned_1d" else "none",
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
        )
        self.img_size = img_size
        self.in_chans = in_chans
        self.patch_size = patch_size
        self.pool_kind = pool  # (timm uses `self.pool` for its pooling method)
        self.pos_embed_kind = pos_embed

    @property
    def grid_size(self) -> tuple[int, int]:
        """Patch grid (rows, cols)."""
        return tuple(self.patch_embed.grid_size)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """(channels, height, width) of one input image."""
        return (self.in_chans, self.img_size, self.img_size)

"""Attention capture: per-layer attention weights (B, heads, T, T) from any timm ViT.

Works on our ``models.vit.ViT`` (and anything else built from ``ViTAttention`` blocks, e.g. a
hybrid), and on any plain timm ``VisionTransformer`` whose blocks use timm's ``Attention``.
Training is never affected: capture happens only inside ``capture_attention`` and everything
is restored when it exits.

Why not hooks on ``attn.attn_drop``? A common public recipe registers a forward hook on the
attention dropout to grab its input, the softmax. Under fused attention
(``F.scaled_dot_product_attention``, timm's default) that module is never called, so such a
hook silently captures nothing. Here:

- ``ViTAttention`` (ours): its explicit softmax path keeps the weights (``explicit_attention``
  in ``models/vit.py``; relative-position bias and additive scoring included).
- timm's ``Attention``: the weights are recomputed from what the block really computes: a
  forward hook on ``attn.qkv`` (always called, fused or not) takes the projection's output,
  applies the block's ``q_norm`` / ``k_norm``, and forms softmax(q k^T / sqrt(d_head) + mask),
  with the mask the block was called with (a forward pre-hook on the attention module records
  it). ``fused_attn`` is switched off meanwhile, so the block itself computes the same
  explicit softmax whose weights we report. Other attention classes (rotary, pooling heads,
  ...) are refused with a clear error rather than reported wrongly.

Token layout. ``token_layout(model, image_size)`` gives the prefix tokens (class and register
tokens, first in the sequence), the patch grid and the pixels per grid step: the patch size for
a plain ViT; for a hybrid (timm ``HybridEmbed`` over a CNN) the CNN's total stride, i.e.
img_size / grid_size.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Optional

import torch
from timm.layers.attention import Attention, maybe_add_mask, resolve_self_attn_mask
from torch import nn

from models.vit import ViTAttention, explicit_attention


# ----------------------------------------------------------------------------------- layout


def _pair(value) -> tuple[int, int]:
    if isinstance(value, (tuple, list)):
        return int(value[0]), int(value[-1])
    return int(value), int(value)


def pixels_per_token(patch_embed: nn.Module) -> tuple[float, float]:
    """Pixels per grid step (rows, cols) of a patch embedding.

    Plain ``PatchEmbed``: the patch size. A hybrid's ``HybridEmbed``: the CNN's total stride
    times the projection's patch size, which is img_size / grid_size (timm's
    ``feat_ratio(as_scalar=False)``). Anything else with ``img_size`` and ``grid_size``:
    img_size / grid_size.
    """
    if getattr(patch_embed, "backbone", None) is None and hasattr(patch_embed, "patch_size"):
        return tuple(float(p) for p in _pair(patch_embed.patch_size))  # type: ignore[return-value]
    img, grid = getattr(patch_embed, "img_size", None), getattr(patch_embed, "grid_size", None)
    if img is None or grid is None:
        raise TypeError(
            f"cannot tell the pixels per token of {type(patch_embed).__name__}: it needs "
            "patch_size (a plain patch embedding) or img_size and grid_size (a hybrid)"
        )
    img, grid = _pair(img), _pair(grid)
    return img[0] / grid[0], img[1] / grid[1]


@dataclass(frozen=True)
class TokenLayout:
    """Where the tokens of a ViT sit: ``num_prefix_tokens`` (class/register tokens, first),
    then ``grid_size`` = (rows, cols) patches in raster order, each grid step
    ``pixels_per_token`` = (rows, cols) pixels apart."""

    num_prefix_tokens: int
    grid_size: tuple[int, int]
    pixels_per_token: tuple[float, float]

    @property
    def num_patches(self) -> int:
        return self.grid_size[0] * self.grid_size[1]

    @property
    def num_tokens(self) -> int:
        return self.num_prefix_tokens + self.num_patches

    def patch_positions(self) -> torch.Tensor:
        """(N, 2) float64: the (row, col) position of every patch, in pixels, raster order."""
        h, w = self.grid_size
        rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        scale = torch.tensor(self.pixels_per_token, dtype=torch.float64)
        return torch.stack([rows.flatten(), cols.flatten()], dim=1).to(torch.float64) * scale

    def pixel_distances(self) -> torch.Tensor:
        """(N, N) float64: Euclidean pixel distance between the patches q and k,
        ||P * (g(q) - g(k))||_2 with g the grid position (docs/papers.md, Fig. 11)."""
        pos = self.patch_positions()
        return torch.cdist(pos, pos)


def token_layout(model: nn.Module, image_size: Optional[Sequence[int] | int] = None) -> TokenLayout:
    """The ``TokenLayout`` of a timm ViT (ours, a hybrid, or timm's) for images of
    ``image_size`` (H, W) (default: the patch embedding's ``img_size``)."""
    patch_embed = getattr(model, "patch_embed", None)
    if patch_embed is None:
        raise TypeError(f"{type(model).__name__} has no patch_embed: not a timm VisionTransformer")
    fy, fx = pixels_per_token(patch_embed)
    grid = _pair(patch_embed.grid_size)
    if image_size is not None:
        h, w = _pair(image_size)
        if (h, w) != _pair(getattr(patch_embed, "img_size", (h, w))):
            grid = (int(h // fy), int(w // fx))
    return TokenLayout(int(getattr(model, "num_prefix_tokens", 0)), grid, (fy, fx))


# ----------------------------------------------------------------------------------- capture


def attention_modules(model: nn.Module) -> list[Attention]:
    """The attention module of every block, in depth order (``model.blocks[i].attn``)."""
    blocks = getattr(model, "blocks", None)
    if blocks is None:
        raise TypeError(f"{type(model).__name__} has no blocks: not a timm VisionTransformer")
    modules = []
    for i, block in enumerate(blocks):
        attn = getattr(block, "attn", None)
        if not _supported(attn):
            raise TypeError(
                f"blocks[{i}].attn is {type(attn).__name__}: attention capture supports "
                "models.vit.ViTAttention and timm.layers.Attention (and subclasses that keep "
                "its forward); other attention classes would be reported wrongly"
            )
        modules.append(attn)
    return modules


def _supported(attn) -> bool:
    if isinstance(attn, ViTAttention):
        return True
    return isinstance(attn, Attention) and type(attn).forward is Attention.forward


def _recompute_hooks(attn: Attention, store: list, i: int) -> list:
    """Hooks that put timm ``Attention``'s softmax weights into ``store[i]`` on each forward."""
    call: dict = {}

    def record_mask(module, args, kwargs):
        call["attn_mask"] = kwargs.get("attn_mask", args[1] if len(args) > 1 else None)
        call["is_causal"] = kwargs.get("is_causal", args[2] if len(args) > 2 else False)

    def recompute(module, args, qkv):
        b, n, _ = qkv.shape
        q, k, _v = qkv.reshape(b, n, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        q, k = attn.q_norm(q), attn.k_norm(k)
        logits = (q * attn.scale) @ k.transpose(-2, -1)  # timm's unfused order
        mask = resolve_self_attn_mask(n, logits, call.get("attn_mask"), call.get("is_causal", False))
        store[i] = maybe_add_mask(logits, mask).softmax(dim=-1).detach()

    return [
        attn.register_forward_pre_hook(record_mask, with_kwargs=True),
        attn.qkv.register_forward_hook(recompute),
    ]


class CapturedAttention(Sequence):
    """Item i: block i's attention weights (B, heads, T, T) from the latest forward (None
    before one); rows sum to 1, detached. ``stack()`` gives (L, B, heads, T, T)."""

    def __init__(self, num_layers: int) -> None:
        self._store: list[Optional[torch.Tensor]] = [None] * num_layers

    def __getitem__(self, i):
        return self._store[i]

    def __len__(self) -> int:
        return len(self._store)

    def stack(self) -> torch.Tensor:
        if any(w is None for w in self._store):
            raise RuntimeError("no forward pass was captured yet")
        return torch.stack(list(self._store))


@contextmanager
def capture_attention(model: nn.Module) -> Iterator[CapturedAttention]:
    """Capture every block's attention weights on each forward of ``model``.

        with capture_attention(model) as weights:
            model(images)
        maps = weights.stack()  # (depth, B, heads, T, T)

    Inside the block the attention runs on the explicit softmax path; on exit the fused
    switches, hooks and stored weights are restored (the yielded object keeps the last ones).
    """
    modules = attention_modules(model)
    captured = CapturedAttention(len(modules))
    store = captured._store
    handles: list = []
    saved_fused = [(m, m.fused_attn) for m in modules if not isinstance(m, ViTAttention)]
    with ExitStack() as stack:
        if any(isinstance(m, ViTAttention) for m in modules):
            stack.enter_context(explicit_attention(model))
        try:
            for i, m in enumerate(modules):
                if isinstance(m, ViTAttention):
                    def keep(module, args, out, i=i):
                        store[i] = module.last_weights
                    handles.append(m.register_forward_hook(keep))
                else:
                    m.fused_attn = False
                    handles += _recompute_hooks(m, store, i)
            yield captured
        finally:
            for h in handles:
                h.remove()
            for m, fused in saved_fused:
                m.fused_attn = fused


@torch.no_grad()
def attention_weights(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """One forward in eval mode: (L, B, heads, T, T) attention weights (training mode restored)."""
    was_training = model.training
    model.eval()
    try:
        with capture_attention(model) as weights:
            model(images)
        return weights.stack()
    finally:
        model.train(was_training)


def iter_attention(
    model: nn.Module, images: torch.Tensor, *, batch_size: int = 32
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield (images[i:i+batch_size], their (L, b, heads, T, T) weights), batch by batch, so
    that many images can be analysed without holding all their attention maps at once."""
    device = next(model.parameters()).device
    for start in range(0, len(images), batch_size):
        batch = images[start : start + batch_size]
        yield batch, attention_weights(model, batch.to(device)).cpu()

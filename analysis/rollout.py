"""Attention rollout (Abnar & Zuidema, ACL 2020; ViT paper Fig. 6 and 14, Appendix D.8).

For each layer l with weights A_l (B, heads, T, T):

1. fuse the heads: mean (the paper's), or max / min, over the head axis -> (B, T, T);
2. add the identity for the residual path and renormalise every row to sum to 1:
   Â_l = (A_l + I) / rowsum(A_l + I), rowsum taken over the *key* axis (the last), keeping
   the dimension. With mean fusion the rows of A_l sum to 1, so Â_l = (A_l + I) / 2 exactly
   as Abnar & Zuidema write it. (A widely copied implementation divides by a row-sum vector
   without keeping the dimension, so it broadcasts over the wrong axis and the matrices are
   no longer row-stochastic.)
3. multiply the layers from the first to the last: R_1 = Â_1, R_l = Â_l R_{l-1}, so

       R = Â_L Â_{L-1} ... Â_1,

   the joint attention from the last layer's tokens back to the input tokens: row i of R
   says how much of token i's final representation comes from each input token. Every R is
   row-stochastic (a product of row-stochastic matrices).

The map: the class token's row of R over the patches, R[cls, P:], reshaped to the patch grid.
Models without a class token (global average pooling) have no such row; their map is the
mean of the patch rows (how much each input patch feeds the pooled representation).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

HEAD_FUSIONS = ("mean", "max", "min")


def fuse_heads(weights: torch.Tensor, head_fusion: str = "mean") -> torch.Tensor:
    """(..., heads, T, T) -> (..., T, T) by mean, max or min over the heads."""
    if head_fusion == "mean":
        return weights.mean(dim=-3)
    if head_fusion == "max":
        return weights.amax(dim=-3)
    if head_fusion == "min":
        return weights.amin(dim=-3)
    raise ValueError(f"head_fusion={head_fusion!r} is not one of {list(HEAD_FUSIONS)}")


def residual_attention(fused: torch.Tensor) -> torch.Tensor:
    """Â = (A + I) / rowsum(A + I) for (..., T, T): identity for the residual path, rows
    (the last axis) renormalised to 1."""
    eye = torch.eye(fused.shape[-1], dtype=fused.dtype, device=fused.device)
    a = fused + eye
    return a / a.sum(dim=-1, keepdim=True)


def attention_rollout(
    weights: torch.Tensor | Sequence[torch.Tensor], *, head_fusion: str = "mean"
) -> torch.Tensor:
    """Rollout R = Â_L ... Â_1 from per-layer weights (L, B, heads, T, T) (or a list of
    (B, heads, T, T), first layer first) -> (B, T, T), rows summing to 1."""
    layers = list(weights) if not isinstance(weights, torch.Tensor) else list(weights.unbind(0))
    if not layers:
        raise ValueError("no layers given")
    rollout = None
    for w in layers:  # first to last: R <- Â_l R
        a = residual_attention(fuse_heads(w.to(torch.float64), head_fusion))
        rollout = a if rollout is None else a @ rollout
    return rollout


def rollout_maps(
    rollout: torch.Tensor, grid_size: Sequence[int], num_prefix_tokens: int, *, normalize: bool = True
) -> torch.Tensor:
    """The per-image map over the patch grid (B, rows, cols) from a rollout (B, T, T).

    With a class token: its row over the patches; without: the mean of the patch rows. With
    ``normalize`` each map is divided by its maximum (for display; the raw row sums to the
    rollout mass on patches)."""
    h, w = int(grid_size[0]), int(grid_size[1])
    p = num_prefix_tokens
    if rollout.shape[-1] != p + h * w:
        raise ValueError(f"rollout over {rollout.shape[-1]} tokens, expected {p} prefix + {h}x{w} patches")
    row = rollout[:, 0, p:] if p else rollout[:, p:, p:].mean(dim=1)
    maps = row.reshape(-1, h, w)
    if normalize:
        maps = maps / maps.amax(dim=(-2, -1), keepdim=True).clamp_min(torch.finfo(maps.dtype).tiny)
    return maps


def upsample_maps(maps: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
    """(B, rows, cols) -> (B, H, W), bilinear, for overlaying on the input images."""
    return F.interpolate(maps[:, None].float(), size=tuple(int(s) for s in size), mode="bilinear",
                         align_corners=False)[:, 0]

"""Principal components of the patch-embedding filters (ViT paper, Fig. 7 left: the first 28).

The patch projection is a linear map from a flattened patch (C * p * p pixels) to D features,
i.e. D filters of shape (C, p, p) (timm's ``patch_embed.proj``, a p x p conv with stride p).
PCA over the D filters: centre them (subtract the mean filter), SVD W_c = U S V^T; the rows
of V^T are the principal directions in pixel space, drawn as (C, p, p) images; S^2 / sum S^2
is each one's share of the variance. Each component's sign is fixed so that its largest
entry in magnitude is positive (a component is defined up to sign).

A hybrid's projection acts on CNN feature maps, not on pixels, so it has no pixel filters to
draw; it is refused with a clear error.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

DEFAULT_NUM_COMPONENTS = 28


@dataclass
class FilterPCA:
    """``components`` (k, C, p, p), unit norm each; ``explained_variance_ratio`` (k,);
    ``mean`` (C, p, p), the mean filter removed before the SVD."""

    components: torch.Tensor
    explained_variance_ratio: torch.Tensor
    mean: torch.Tensor


def patch_filters(model_or_weight: nn.Module | torch.Tensor) -> torch.Tensor:
    """The (D, C, p, p) pixel filters of a ViT's patch embedding (or a conv weight as given)."""
    if isinstance(model_or_weight, torch.Tensor):
        weight = model_or_weight
    else:
        pe = getattr(model_or_weight, "patch_embed", model_or_weight)
        if getattr(pe, "backbone", None) is not None:
            raise ValueError(
                f"{type(pe).__name__} projects CNN features, not pixels (a hybrid): its "
                "projection has no pixel filters to draw; use a plain ViT"
            )
        proj = getattr(pe, "proj", pe)
        if not isinstance(proj, nn.Conv2d):
            raise TypeError(f"expected a Conv2d patch projection, got {type(proj).__name__}")
        weight = proj.weight
    if weight.dim() != 4:
        raise ValueError(f"filters must be (D, C, p, p), got shape {tuple(weight.shape)}")
    return weight.detach().float().cpu()


def filter_pca(filters: torch.Tensor, num_components: int = DEFAULT_NUM_COMPONENTS, *, center: bool = True) -> FilterPCA:
    """PCA of (D, C, p, p) filters: the first ``num_components`` (at most min(D, C*p*p))."""
    d, c, ph, pw = filters.shape
    flat = filters.reshape(d, -1).to(torch.float64)
    mean = flat.mean(dim=0, keepdim=True) if center else torch.zeros_like(flat[:1])
    _, s, vt = torch.linalg.svd(flat - mean, full_matrices=False)
    k = min(num_components, vt.shape[0])
    comps = vt[:k]
    signs = torch.sign(comps.gather(1, comps.abs().argmax(dim=1, keepdim=True)))
    comps = comps * torch.where(signs == 0, torch.ones_like(signs), signs)
    var = s.square()
    ratio = var[:k] / var.sum().clamp_min(torch.finfo(var.dtype).tiny)
    return FilterPCA(comps.reshape(k, c, ph, pw).float(), ratio.float(), mean.reshape(c, ph, pw).float())

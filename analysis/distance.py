"""Mean attention distance (ViT paper, Fig. 7 right and Fig. 11, Appendix D.7).

For layer l and head h, over images and query patches q:

    MAD[l, h] = mean_{images, q} sum_k A[l, h, q, k] * ||P * (g(q) - g(k))||_2

g = (row, col) of a patch on the grid, P = pixels per grid step (the patch size; for a hybrid
the CNN's total stride). The paper uses 128 images (``DEFAULT_NUM_IMAGES``).

Class token (and any other prefix token: registers), ``class_token=``:

- ``"drop"`` (default): the prefix tokens' rows and columns are removed and every patch row is
  renormalised to sum to 1: A'[q, k] = A[q, k] / sum_{k' patch} A[q, k']. The distance is then
  where a patch query looks *among the patches*, independent of how much it looks at the class
  token. Dropping the column without renormalising (a common public notebook) makes every row
  sum to less than 1 and biases distances low, by the attention mass on the class token.
- ``"zero"``: the class token's column stays and counts as distance 0 (it has no position);
  rows are not renormalised. Equals ``"drop"`` scaled per query by the mass on patches.

Query rows are always patch rows (the class token has no position to measure from). Without
prefix tokens both conventions are the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Optional

import torch
from torch import nn

from analysis.attention import TokenLayout, iter_attention, token_layout

CLASS_TOKEN_MODES = ("drop", "zero")
DEFAULT_NUM_IMAGES = 128


def _check_mode(class_token: str) -> None:
    if class_token not in CLASS_TOKEN_MODES:
        raise ValueError(f"class_token={class_token!r} is not one of {list(CLASS_TOKEN_MODES)}")


def patch_attention(weights: torch.Tensor, num_prefix_tokens: int, *, class_token: str = "drop") -> torch.Tensor:
    """The patch-query x patch-key block of attention weights (..., T, T) -> (..., N, N).

    ``drop``: rows renormalised to sum to 1 over the patches; ``zero``: as they are (the mass
    on prefix tokens is left out, i.e. counted at distance 0)."""
    _check_mode(class_token)
    a = weights[..., num_prefix_tokens:, num_prefix_tokens:].to(torch.float64)
    if class_token == "drop" and num_prefix_tokens:
        a = a / a.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
    return a


def attention_distance(
    weights: torch.Tensor, layout: TokenLayout, *, class_token: str = "drop"
) -> torch.Tensor:
    """Per-image, per-head mean attention distance in pixels.

    weights (..., B, heads, T, T) -> (..., B, heads): for each image and head, the mean over
    patch queries of the attention-weighted pixel distance to the keys."""
    if weights.shape[-1] != layout.num_tokens or weights.shape[-2] != layout.num_tokens:
        raise ValueError(
            f"attention over {weights.shape[-1]} tokens does not match the layout: "
            f"{layout.num_prefix_tokens} prefix + {layout.grid_size} patches = {layout.num_tokens}"
        )
    a = patch_attention(weights, layout.num_prefix_tokens, class_token=class_token)
    d = layout.pixel_distances().to(a.device)
    return (a * d).sum(dim=-1).mean(dim=-1)


def uniform_distance(layout: TokenLayout) -> float:
    """The MAD of uniform attention over the patches: the mean pixel distance over all
    (query, key) patch pairs, self-pairs included. A reference: heads well below it attend
    locally, heads near it look everywhere."""
    return float(layout.pixel_distances().mean())


class MeanAttentionDistance:
    """Streaming MAD[l, h]: ``update`` with each batch's (L, B, heads, T, T) weights, then
    ``compute()`` -> (L, heads) float64 in pixels, the mean over all images seen."""

    def __init__(self, layout: TokenLayout, *, class_token: str = "drop") -> None:
        _check_mode(class_token)
        self.layout, self.class_token = layout, class_token
        self.total: Optional[torch.Tensor] = None
        self.num_images = 0

    def update(self, weights: torch.Tensor | Sequence[torch.Tensor]) -> None:
        if not isinstance(weights, torch.Tensor):
            weights = torch.stack(list(weights))
        per_image = attention_distance(weights, self.layout, class_token=self.class_token)  # (L, B, H)
        batch_sum = per_image.sum(dim=1).cpu()
        self.total = batch_sum if self.total is None else self.total + batch_sum
        self.num_images += weights.shape[1]

    def compute(self) -> torch.Tensor:
        if self.total is None:
            raise RuntimeError("no attention weights were added")
        return self.total / self.num_images


def mean_attention_distance(
    model: nn.Module,
    images: torch.Tensor | Iterable[torch.Tensor],
    *,
    num_images: int = DEFAULT_NUM_IMAGES,
    class_token: str = "drop",
    batch_size: int = 32,
) -> torch.Tensor:
    """MAD (L, heads) in pixels of ``model`` over the first ``num_images`` of ``images`` (a
    tensor (N, C, H, W) or an iterable of such batches, already normalised for the model)."""
    if num_images < 1:
        raise ValueError(f"num_images={num_images} must be positive")
    batches = [images] if isinstance(images, torch.Tensor) else images
    meter: Optional[MeanAttentionDistance] = None
    seen = 0
    for batch in batches:
        batch = batch[: num_images - seen]
        if meter is None:
            meter = MeanAttentionDistance(token_layout(model, batch.shape[-2:]), class_token=class_token)
        for _, weights in iter_attention(model, batch, batch_size=batch_size):
            meter.update(weights)
        seen += len(batch)
        if seen >= num_images:
            break
    if meter is None or meter.num_images == 0:
        raise ValueError("no images given")
    return meter.compute()


def summarize(mad: torch.Tensor) -> list[dict]:
    """Per layer (1-based): mean, min and max over heads, and the per-head values."""
    return [
        {
            "layer": layer + 1,
            "mean": float(row.mean()),
            "min": float(row.min()),
            "max": float(row.max()),
            "heads": [float(v) for v in row],
        }
        for layer, row in enumerate(mad)
    ]


def format_summary(mad: torch.Tensor, label: str = "") -> str:
    """A short table: layer, mean/min/max distance over heads, in pixels."""
    lines = [f"mean attention distance (pixels){' - ' + label if label else ''}",
             "layer    mean     min     max"]
    for row in summarize(mad):
        lines.append(f"{row['layer']:5d} {row['mean']:7.2f} {row['min']:7.2f} {row['max']:7.2f}")
    return "\n".join(lines)


#: a head is local when its mean attention distance is below this fraction of uniform attention's
LOCAL_FRACTION = 0.75


def locality(layers: Sequence[dict], uniform: float, *, local_fraction: float = LOCAL_FRACTION) -> dict:
    """The paper's reading of Fig. 7 (right) and Fig. 11 checked on ``summarize``'s rows:

    - ``local_heads``: heads of the first layer whose distance is below ``local_fraction`` x the
      uniform-attention distance ("some heads attend locally in the lowest layers");
    - ``grows_with_depth``: the last layer's mean distance is above the first layer's ("the
      attention distance increases with network depth").

    ``verdict``: "holds" when both are seen, "partly" when one is, "does not hold" when neither.
    The numbers beside it (the first layer's range, both layers' means, all relative to uniform)
    say by how much.
    """
    if not layers:
        raise ValueError("no layers to check")
    first, last = layers[0], layers[-1]
    local = [h for h in first["heads"] if h < local_fraction * uniform]
    grows = len(layers) > 1 and last["mean"] > first["mean"]
    seen = int(bool(local)) + int(grows)
    return {
        "uniform": uniform,
        "local_fraction": local_fraction,
        "local_heads": len(local),
        "heads": len(first["heads"]),
        "first_layer_min": first["min"],
        "first_layer_max": first["max"],
        "first_layer_mean": first["mean"],
        "last_layer_mean": last["mean"],
        "grows_with_depth": grows,
        "verdict": ("does not hold", "partly", "holds")[seen],
    }

"""Figures for the attention analyses, as PNG files (matplotlib, no pyplot state touched).

- ``attention_distance_figure``: Fig. 11 style: one dot per head, the layer on the x axis, the
  mean attention distance in pixels on the y axis; several models (e.g. ViT and hybrid) side
  by side with a shared y axis.
- ``rollout_figure``: input images over their rollout maps overlaid (Fig. 6).
- ``position_similarity_figure``: the grid of cosine-similarity tiles (Fig. 7 centre).
- ``filters_figure``: the principal components of the patch filters (Fig. 7 left).

``*_figure`` functions return a ``matplotlib.figure.Figure``; ``save_figure`` writes it
atomically (temporary file, then rename), so a reader never sees a half-written PNG.
``save_json`` does the same for the numbers (both through ``utils.atomic``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from matplotlib.figure import Figure

from utils.atomic import atomic_savefig, atomic_write_json


def save_figure(fig: Figure, path: str | os.PathLike, *, dpi: int = 120) -> Path:
    """Write ``fig`` as PNG to ``path`` atomically; returns the path."""
    return atomic_savefig(fig, path, dpi=dpi)


def save_json(path: str | os.PathLike, data) -> Path:
    """Write ``data`` as indented JSON to ``path`` atomically; returns the path."""
    return atomic_write_json(path, data)


def _np(x) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def attention_distance_figure(
    distances: Mapping[str, torch.Tensor] | torch.Tensor,
    *,
    references: Optional[Mapping[str, float]] = None,
    title: Optional[str] = None,
) -> Figure:
    """Fig. 11: per model, one dot per (layer, head); x = layer (1-based), y = pixels.
    ``references`` (per model label): a dashed line, e.g. the distance of uniform attention."""
    if not isinstance(distances, Mapping):
        distances = {"ViT": distances}
    n = len(distances)
    fig = Figure(figsize=(4.2 * n, 3.6))
    axes = fig.subplots(1, n, sharey=True, squeeze=False)[0]
    for ax, (label, mad) in zip(axes, distances.items()):
        mad = _np(mad)
        layers, heads = mad.shape
        colors = [f"C{h % 10}" for h in range(heads)]
        for h in range(heads):
            ax.scatter(np.arange(1, layers + 1), mad[:, h], s=14, color=colors[h], alpha=0.8,
                       label=f"head {h + 1}" if heads <= 16 else None)
        if references and label in references:
            ax.axhline(references[label], color="0.4", linestyle="--", linewidth=1, label="uniform attention")
        ax.set_title(label)
        ax.set_xlabel("network depth (layer)")
        ax.set_xticks(np.arange(1, layers + 1))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("mean attention distance (pixels)")
    axes[0].set_ylim(bottom=0)
    if title:
        fig.suptitle(title)
    return fig


def _display_images(images: torch.Tensor) -> np.ndarray:
    """(B, C, H, W) in [0, 1] (1 or 3 channels) -> (B, H, W, 3) for imshow."""
    x = images.detach().float().cpu().clamp(0, 1)
    if x.shape[1] != 3:  # grey, or channels that are not RGB: show the first one in grey
        x = x[:, :1].expand(-1, 3, -1, -1)
    return x.permute(0, 2, 3, 1).numpy()


def rollout_figure(
    images: torch.Tensor, maps: torch.Tensor, *, titles: Optional[Sequence[str]] = None, alpha: float = 0.55
) -> Figure:
    """Top row: the images (B, C, H, W) in [0, 1]; bottom row: their rollout maps (B, H, W)
    (already upsampled to the image size, values in [0, 1]) overlaid."""
    pics, heat = _display_images(images), _np(maps)
    b = len(pics)
    fig = Figure(figsize=(1.7 * b + 0.4, 3.6))
    axes = fig.subplots(2, b, squeeze=False)
    for i in range(b):
        axes[0, i].imshow(pics[i], interpolation="nearest")
        axes[1, i].imshow(pics[i], interpolation="nearest")
        axes[1, i].imshow(heat[i], cmap="inferno", alpha=alpha, vmin=0, vmax=1, interpolation="bilinear")
        if titles is not None:
            axes[0, i].set_title(str(titles[i]), fontsize=8)
        for ax in axes[:, i]:
            ax.set_axis_off()
    fig.suptitle("attention rollout (class token over the patches)", fontsize=10)
    return fig


def similarity_mosaic(sim: torch.Tensor, gap: int = 1) -> np.ndarray:
    """(rows, cols, rows, cols) -> one 2-D array of rows x cols tiles separated by NaN gaps."""
    s = _np(sim)
    h, w = s.shape[:2]
    th, tw = s.shape[2:]
    out = np.full((h * (th + gap) - gap, w * (tw + gap) - gap), np.nan)
    for i in range(h):
        for j in range(w):
            out[i * (th + gap) : i * (th + gap) + th, j * (tw + gap) : j * (tw + gap) + tw] = s[i, j]
    return out


def position_similarity_figure(sim: torch.Tensor, *, title: Optional[str] = None) -> Figure:
    """Fig. 7 centre: tile (i, j) is the cosine similarity of patch (i, j)'s position
    embedding with every patch's; rows and columns of the grid are the patch rows/columns."""
    h, w = sim.shape[:2]
    fig = Figure(figsize=(5.2, 5.0))
    ax = fig.subplots()
    image = ax.imshow(similarity_mosaic(sim), cmap="viridis", vmin=-1, vmax=1, interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_xlabel("input patch column")
    ax.set_ylabel("input patch row")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="cosine similarity")
    ax.set_title(title or f"position embedding similarity ({h}x{w} patches)", fontsize=10)
    return fig


def filters_figure(
    components: torch.Tensor, *, explained: Optional[torch.Tensor] = None, ncols: int = 7,
    title: Optional[str] = None,
) -> Figure:
    """Fig. 7 left: each principal component (k, C, p, p) as an image, rescaled to [0, 1]."""
    comps = components.detach().float().cpu()
    k = comps.shape[0]
    ncols = min(ncols, k)
    nrows = math.ceil(k / ncols)
    fig = Figure(figsize=(1.2 * ncols, 1.3 * nrows + 0.4))
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for idx, ax in enumerate(axes.flat):
        ax.set_axis_off()
        if idx >= k:
            continue
        c = comps[idx]
        lo, hi = c.min(), c.max()
        c = (c - lo) / (hi - lo) if hi > lo else torch.full_like(c, 0.5)
        ax.imshow(_display_images(c[None])[0], interpolation="nearest")
        if explained is not None:
            ax.set_title(f"{100 * float(explained[idx]):.1f}%", fontsize=7)
    fig.suptitle(title or "principal components of the patch-embedding filters", fontsize=10)
    return fig

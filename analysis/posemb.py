"""Position-embedding similarity (ViT paper, Fig. 7 centre).

For every patch, the cosine similarity of its position embedding with the embedding of every
other patch, drawn as a grid of grids: tile (i, j) is the (rows, cols) map of
cos(E[i, j], E[r, c]). The class token's (and registers') embeddings are excluded.

Tables, per kind (``models/position.py``): ``learned_1d`` the learned rows; ``learned_2d``
concat(X[col], Y[row]) per patch (the concatenated vector is what the encoder adds, so that is
what is compared); ``sincos_2d`` the fixed table. Placements: ``stem`` one table;
``every_layer`` one per block (``layer1`` ... ``layerL``); ``every_layer_shared`` one
(``shared``). A plain timm ViT: its ``pos_embed`` (``stem``). Relative kinds and ``none`` have
no per-patch table and are refused with a clear error.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn


def _patch_rows(table: torch.Tensor, num_prefix_tokens: int, num_patches: int, where: str) -> torch.Tensor:
    table = table.detach().reshape(-1, table.shape[-1])
    if table.shape[0] == num_prefix_tokens + num_patches:
        table = table[num_prefix_tokens:]
    if table.shape[0] != num_patches:
        raise ValueError(
            f"{where}: {table.shape[0]} rows, expected {num_patches} patches "
            f"(+ {num_prefix_tokens} prefix tokens)"
        )
    return table.float().cpu()


def position_tables(model: nn.Module) -> dict[str, torch.Tensor]:
    """The absolute position embeddings of the patches, (N, D) each, class token excluded.

    Keys: ``stem``, ``shared`` or ``layer1`` ... ``layerL`` (see the module docstring)."""
    grid = tuple(model.patch_embed.grid_size)
    n = grid[0] * grid[1]
    p = int(getattr(model, "num_prefix_tokens", 0))
    tables: dict[str, torch.Tensor] = {}
    if callable(getattr(model, "absolute_pos_embed", None)):  # models.vit.ViT and what builds on it
        stem = model.absolute_pos_embed(None)
        if stem is not None:
            tables["stem"] = _patch_rows(stem, p, n, "stem position embedding")
        if getattr(model, "pos_shared", None) is not None:
            tables["shared"] = _patch_rows(model.pos_shared.table(), p, n, "shared position embedding")
        else:
            for i, block in enumerate(model.blocks):
                if getattr(block, "pos", None) is not None:
                    tables[f"layer{i + 1}"] = _patch_rows(block.pos.table(), p, n, f"blocks[{i}].pos")
    elif isinstance(getattr(model, "pos_embed", None), torch.Tensor):  # a timm VisionTransformer
        tables["stem"] = _patch_rows(model.pos_embed, p, n, "pos_embed")
    if not tables:
        kind = getattr(model, "pos_embed_kind", None)
        raise ValueError(
            f"{type(model).__name__} has no absolute position embedding"
            + (f" (pos_embed={kind!r})" if kind else "")
            + ": position-embedding similarity needs a per-patch table (learned_1d, learned_2d, "
            "sincos_2d); relative kinds have per-offset tables and none has nothing"
        )
    return tables


def cosine_similarity_grid(table: torch.Tensor, grid_size: Sequence[int]) -> torch.Tensor:
    """(N, D) patch embeddings in raster order -> (rows, cols, rows, cols) cosine similarities:
    ``sim[i, j]`` is the map of patch (i, j)'s similarity with every patch."""
    h, w = int(grid_size[0]), int(grid_size[1])
    if table.shape[0] != h * w:
        raise ValueError(f"{table.shape[0]} embeddings for a {h}x{w} grid")
    e = F.normalize(table.to(torch.float64), dim=-1)
    return (e @ e.T).reshape(h, w, h, w)


def position_similarity(model: nn.Module) -> dict[str, torch.Tensor]:
    """``cosine_similarity_grid`` of every table of ``position_tables(model)``."""
    grid = tuple(model.patch_embed.grid_size)
    return {name: cosine_similarity_grid(t, grid) for name, t in position_tables(model).items()}


def row_column_contrast(sim: torch.Tensor) -> dict[str, float]:
    """Mean similarity of patch pairs in the same row or column (self excluded) and of pairs
    in neither: a number for Fig. 7's "rows and columns show up as structure"."""
    h, w = sim.shape[:2]
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    rows, cols = rows.flatten(), cols.flatten()
    flat = sim.reshape(h * w, h * w)
    same_row = rows[:, None] == rows[None, :]
    same_col = cols[:, None] == cols[None, :]
    eye = torch.eye(h * w, dtype=torch.bool)
    line = (same_row | same_col) & ~eye
    other = ~(same_row | same_col)
    out = {"same_row_or_column": float(flat[line].mean()) if line.any() else float("nan"),
           "other": float(flat[other].mean()) if other.any() else float("nan")}
    return out

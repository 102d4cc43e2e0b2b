"""The parts the CTR nets of ``models.ctr`` share: argument checks, the masked mean over a
behaviour sequence, the MLP head, and the embedding of the "other features" (user id, profile
fields, target item and category).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from models.ctr_batch import PAD


# --------------------------------------------------------------------------- validation
def check_positive(**values: float) -> None:
    for name, value in values.items():
        if value is None or value <= 0:
            raise ValueError(f"{name}={value!r} must be positive")


def check_rate(**values: float) -> None:
    for name, value in values.items():
        if not 0.0 <= value < 1.0:
            raise ValueError(f"{name}={value!r} must be in [0, 1)")


def check_vocab(**values: int) -> None:
    """A vocabulary must hold the padding id 0 and at least one real id."""
    for name, value in values.items():
        if not isinstance(value, int) or value < 2:
            raise ValueError(f"{name}={value!r} must be an int >= 2 (id 0 is padding, real ids start at 1)")


def check_dims(name: str, dims: Sequence[int]) -> tuple[int, ...]:
    dims = tuple(dims)
    if any((not isinstance(d, int)) or d <= 0 for d in dims):
        raise ValueError(f"{name}={list(dims)!r} must be a list of positive ints")
    return dims


# --------------------------------------------------------------------------- shared parts
def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x (B, T, D) over the tokens where mask (B, T) is True; zeros for empty rows."""
    weights = mask.to(x.dtype).unsqueeze(-1)
    return (x * weights).sum(1) / weights.sum(1).clamp_min(1.0)


def mlp_head(in_dim: int, hidden: Sequence[int], *, make_activation, dropout: float = 0.0) -> nn.Sequential:
    """Linear -> make_activation(width) -> dropout for each hidden width, then Linear(..., 1): one logit."""
    layers: list[nn.Module] = []
    for width in hidden:
        layers.append(nn.Linear(in_dim, width))
        layers.append(make_activation(width))
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        in_dim = width
    layers.append(nn.Linear(in_dim, 1))
    return nn.Sequential(*layers)


class FeatureEmbedding(nn.Module):
    """Embeddings of the id features, shared by the sequence and the "other features".

    Shapes: ``tokens(items, categories)`` (..., ) -> (..., item_dim + category_dim);
    ``other(batch)`` -> (B, other_dim) = [user | profile fields | target item | target category].
    """

    def __init__(self, *, n_items: int, n_categories: int, n_users: int, profile_sizes: Sequence[int],
                 item_dim: int, category_dim: int, user_dim: int, profile_dim: int) -> None:
        super().__init__()
        check_vocab(n_items=n_items, n_categories=n_categories)
        if n_users != 0:
            check_vocab(n_users=n_users)
        profile_sizes = tuple(profile_sizes)
        for f, size in enumerate(profile_sizes):
            check_vocab(**{f"profile_sizes[{f}]": size})
        check_positive(item_dim=item_dim, category_dim=category_dim)
        if n_users:
            check_positive(user_dim=user_dim)
        if profile_sizes:
            check_positive(profile_dim=profile_dim)
        self.n_items, self.n_categories, self.n_users = n_items, n_categories, n_users
        self.profile_sizes = profile_sizes
        self.item = nn.Embedding(n_items, item_dim, padding_idx=PAD)
        self.category = nn.Embedding(n_categories, category_dim, padding_idx=PAD)
        self.user = nn.Embedding(n_users, user_dim, padding_idx=PAD) if n_users else None
        self.profile = nn.ModuleList(nn.Embedding(size, profile_dim, padding_idx=PAD) for size in profile_sizes)
        self.token_dim = item_dim + category_dim
        self.other_dim = (user_dim if n_users else 0) + profile_dim * len(profile_sizes) + self.token_dim

    def tokens(self, items: torch.Tensor, categories: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.item(items), self.category(categories)], dim=-1)

    def target(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.tokens(batch["target_item"], batch["target_category"])

    def other(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        parts = []
        if self.user is not None:
            parts.append(self.user(batch["user"]))
        if self.profile_sizes:
            profile = batch["user_features"]
            if profile.shape[-1] < len(self.profile_sizes):
                raise ValueError(
                    f"the batch has {profile.shape[-1]} user_features but the net was built with "
                    f"profile_sizes={list(self.profile_sizes)}"
                )
            parts += [emb(profile[:, f]) for f, emb in enumerate(self.profile)]
        parts.append(self.target(batch))
        return torch.cat(parts, dim=-1)

    def feature_sizes(self) -> dict:
        sizes: dict = {"n_items": self.n_items, "n_categories": self.n_categories}
        if self.n_users:
            sizes["n_users"] = self.n_users
        if self.profile_sizes:
            sizes["profile_sizes"] = list(self.profile_sizes)
        return sizes

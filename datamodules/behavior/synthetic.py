"""The synthetic source: a seeded world whose click rule uses what BST can see (and WDL cannot).

Users have profile fields, items have categories, histories are time-stamped, and the click on a
target depends on (1) the user's profile (a per-category preference drawn from the profile plus
a per-user part), (2) which categories the history holds, weighted by recency, (3) the order of
recent items (a fixed "complement" map such as phone -> phone case: a boost when the newest
item's complement is the target) and (4) how long ago the newest item happened (the boost fades
within about an hour). WDL can find (1), mean pooling part of (2), DIN (2) without the recency,
BST with the time-delta position all four.

The true click probabilities are kept (``click_prob``), and :func:`synthetic_ceiling` scores them
per split (AUC, GAUC, log loss, with ``metrics.py``): the ceiling no model can beat in
expectation. Samples are i.i.d. given the user, so the split is random (``splits.random_split``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from datamodules.behavior.metrics import auc, gauc, logloss
from datamodules.behavior.samples import PadSide, bucketize_time_delta
from datamodules.behavior.splits import SPLITS
from models.ctr_batch import PAD, PAD_BUCKET

SYNTHETIC_PROFILE_CARDINALITIES = (2, 6, 8)  #: e.g. gender, age band, city tier


def generate_synthetic(
    *,
    n_users: int,
    n_items: int,
    n_categories: int,
    n_samples: int,
    seq_len: int,
    min_history: int,
    seed: int,
    pad_side: PadSide = "left",
    bucketize: Callable[[np.ndarray], np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """The seeded synthetic world (vectorised numpy; 100k samples take about a second).

    World: each user has profile fields with cardinalities ``SYNTHETIC_PROFILE_CARDINALITIES``;
    a preference per category pref[u, c] = 0.5 sum_f A_f[profile_f(u), c] + 0.9 e[u, c] (A and e
    standard normal: the profile explains part of the taste, the rest is personal and shows
    only in the history); every item has one category and a popularity bias b_i ~ N(0, 0.3);
    ``complement`` is a fixed cyclic map of categories without fixed points (phone -> phone
    case).

    Sample: a user, a history length in [min_history, seq_len], history categories drawn
    oldest to newest from softmax(pref[u]) except that with probability 0.3 the next item
    is the complement of the previous one; history items uniform within their category; gaps
    between events (and from the newest to the target) are 5-minute exponentials within a session
    (p = 0.5) or 2-day exponentials between sessions. The target's category is drawn from the
    user's preference (0.3), the complement of the newest item (0.25), a random history item
    (0.2) or uniformly (0.25); its item uniform within the category.

    Click logit = -1.2 + 0.5 pref[u, c_t] + b_item
                  + 2.0 tanh(sum_i exp(-delta_i / 3 days) [c_i = c_t])     (history, by recency)
                  + 2.5 [complement(c_newest) = c_t] exp(-delta_newest / 1 h)  (order and recency)
    and the label ~ Bernoulli(sigmoid(logit)). Returns the sample columns (as
    ``samples.build_samples``) plus ``click_prob``, the true probability. Ids are 1-based (0 = padding).
    """
    rng = np.random.default_rng(seed)
    world = _draw_world(rng, n_users, n_items, n_categories)
    user = rng.integers(0, n_users, n_samples)
    length = rng.integers(min_history, seq_len + 1, n_samples)
    hist, target_time = _draw_histories(rng, world, user, length, seq_len)
    target_cat, target_item = _draw_targets(rng, world, user, length, hist["cats"])
    click_prob = _click_probability(world, user, length, target_cat, target_item, hist)
    label = (rng.random(n_samples) < click_prob).astype(np.float32)

    if pad_side == "right":  # move the real entries to the front
        L = seq_len
        src = (np.arange(L)[None, :] + (L - length)[:, None]) % L
        rows = np.arange(n_samples)[:, None]
        hist = {k: a[rows, src] for k, a in hist.items()}
    bucketize = bucketize or (lambda d: bucketize_time_delta(d))
    valid, delta = hist["valid"], hist["delta"]
    return {
        "user": user + 1, "user_features": world.profile[user] + 1,
        "target_item": target_item + 1, "target_category": target_cat + 1, "label": label,
        "target_time": target_time,
        "hist_items": np.where(valid, hist["items"] + 1, PAD), "hist_categories": np.where(valid, hist["cats"] + 1, PAD),
        "hist_positions": np.where(valid, bucketize(np.where(valid, delta, 0)), PAD_BUCKET),
        "hist_times": np.where(valid, hist["times"], 0),
        "click_prob": click_prob.astype(np.float32),
    }


@dataclass(frozen=True)
class _World:
    """The fixed part of the synthetic world (0-based ids)."""

    profile: np.ndarray  # (U, P) profile fields per user
    pref: np.ndarray  # (U, C) preference per category
    cdf: np.ndarray  # (U, C) cumulative softmax(pref)
    item_category: np.ndarray  # (I,)
    item_bias: np.ndarray  # (I,)
    items_by_category: np.ndarray  # (I,) item ids sorted by category
    category_start: np.ndarray  # (C,) where each category starts in items_by_category
    category_count: np.ndarray  # (C,)
    complement: np.ndarray  # (C,) cyclic, no fixed points

    def draw_preferred(self, rng: np.random.Generator, users: np.ndarray) -> np.ndarray:
        """A category per user, drawn from softmax(pref[user])."""
        C = len(self.complement)
        return np.minimum((self.cdf[users] < rng.random(len(users))[:, None]).sum(1), C - 1)

    def draw_item(self, rng: np.random.Generator, cats: np.ndarray) -> np.ndarray:
        """An item uniform within each category of ``cats`` (any shape)."""
        offset = (rng.random(cats.shape) * self.category_count[cats]).astype(np.int64)
        return self.items_by_category[self.category_start[cats] + offset]


def _draw_world(rng: np.random.Generator, U: int, I: int, C: int) -> _World:
    cards = SYNTHETIC_PROFILE_CARDINALITIES
    profile = np.stack([rng.integers(0, k, U) for k in cards], axis=1)  # (U, P), 0-based
    pref = sum(0.5 * rng.standard_normal((k, C))[profile[:, f]] for f, k in enumerate(cards))
    pref = pref + 0.9 * rng.standard_normal((U, C))
    probs = np.exp(pref - pref.max(1, keepdims=True))
    cdf = np.cumsum(probs / probs.sum(1, keepdims=True), axis=1)
    cdf[:, -1] = 1.0
    item_category = np.concatenate([np.arange(C), rng.integers(0, C, I - C)])  # every category has an item
    item_bias = 0.3 * rng.standard_normal(I)
    by_cat = np.argsort(item_category, kind="stable")
    cycle = rng.permutation(C)
    complement = np.empty(C, dtype=np.int64)
    complement[cycle] = np.roll(cycle, -1)
    return _World(profile=profile, pref=pref, cdf=cdf, item_category=item_category, item_bias=item_bias,
                  items_by_category=by_cat, category_start=np.searchsorted(item_category[by_cat], np.arange(C)),
                  category_count=np.bincount(item_category, minlength=C), complement=complement)


def _draw_histories(rng: np.random.Generator, world: _World, user: np.ndarray, length: np.ndarray,
                    L: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Full-width (N, L) histories, left-aligned (column L-1 the newest; ``valid`` marks the real
    ``length`` entries): categories, items, times and deltas to the target; and the target times."""
    N = len(user)
    cats = np.empty((N, L), dtype=np.int64)
    cats[:, 0] = world.draw_preferred(rng, user)
    for k in range(1, L):
        fresh = world.draw_preferred(rng, user)
        follow = rng.random(N) < 0.3
        cats[:, k] = np.where(follow, world.complement[cats[:, k - 1]], fresh)
    items = world.draw_item(rng, cats)
    session = rng.random((N, L)) < 0.5
    gaps = np.where(session, rng.exponential(300.0, (N, L)), rng.exponential(2 * 86400.0, (N, L)))
    gaps = np.maximum(gaps.round(), 0).astype(np.int64)
    target_time = 1_500_000_000 + rng.integers(0, 60 * 86400, N)
    delta = np.cumsum(gaps[:, ::-1], axis=1)[:, ::-1]  # delta[:, L-1] = gap to the target
    valid = np.arange(L)[None, :] >= (L - length)[:, None]
    return {"cats": cats, "items": items, "times": target_time[:, None] - delta, "delta": delta, "valid": valid}, target_time


def _draw_targets(rng: np.random.Generator, world: _World, user: np.ndarray, length: np.ndarray,
                  cats: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Target categories (preference 0.3, complement of the newest 0.25, a history item 0.2,
    uniform 0.25; users without history: preference) and items."""
    N, L = cats.shape
    C = len(world.complement)
    has_hist = length > 0
    newest = cats[:, L - 1]
    r = rng.random(N)
    back = (rng.random(N) * np.maximum(length, 1)).astype(np.int64)  # uniform over the real history
    hist_pick = cats[np.arange(N), L - 1 - back]
    target_cat = np.where(
        r < 0.3, world.draw_preferred(rng, user),
        np.where(r < 0.55, world.complement[newest], np.where(r < 0.75, hist_pick, rng.integers(0, C, N))),
    )
    target_cat = np.where(has_hist | (r < 0.3) | (r >= 0.75), target_cat, world.draw_preferred(rng, user))
    return target_cat, world.draw_item(rng, target_cat)


def _click_probability(world: _World, user: np.ndarray, length: np.ndarray, target_cat: np.ndarray,
                       target_item: np.ndarray, hist: dict[str, np.ndarray]) -> np.ndarray:
    """sigmoid of the click logit of :func:`generate_synthetic` (left-aligned histories)."""
    cats, delta = hist["cats"], hist["delta"]
    L = cats.shape[1]
    newest = cats[:, L - 1]
    recency = np.exp(-delta / (3 * 86400.0)) * hist["valid"]
    interest = (recency * (cats == target_cat[:, None])).sum(1)
    transition = (length > 0) * (world.complement[newest] == target_cat) * np.exp(-delta[:, L - 1] / 3600.0)
    logit = (-1.2 + 0.5 * world.pref[user, target_cat] + world.item_bias[target_item]
             + 2.0 * np.tanh(interest) + 2.5 * transition)
    return 1.0 / (1.0 + np.exp(-logit))


def synthetic_ceiling(columns: dict[str, np.ndarray], split: np.ndarray) -> dict[str, float]:
    """AUC / GAUC (by user) / log loss of the true click probabilities on each split:
    ``{train,val,test}_{auc,gauc,logloss}``."""
    ceiling = {}
    for code, name in enumerate(SPLITS):
        m = split == code
        labels, probs = columns["label"][m], columns["click_prob"][m]
        ceiling[f"{name}_auc"] = auc(labels, probs)
        ceiling[f"{name}_gauc"] = gauc(labels, probs, columns["user"][m])
        ceiling[f"{name}_logloss"] = logloss(labels, probs)
    return ceiling

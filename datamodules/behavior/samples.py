"""Events to samples: position buckets, history windows, sampled negatives.

Position feature (BST Sec. 3.1)
-------------------------------
pos(v_i) = t(target) - t(v_i) >= 0 in seconds, bucketised by :func:`bucketize_time_delta`:
``log`` (default) bucket = 1 + min(floor(log_base(1 + delta / time_unit)), n - 2), so with
the defaults (base 2, unit 60 s, 24 buckets) bucket 1 is under a minute (and the target's own
delta of 0), bucket 2 one to three minutes, bucket k about 2^(k-1) minutes, up to about
8 years in bucket 23; ``linear`` bucket = 1 + min(floor(delta / time_unit), n - 2). Bucket 0 is
padding. Log buckets keep the resolution where recency matters (minutes) and still separate
days from months, with a small table.

Samples
-------
:func:`build_samples` turns events sorted by (user, time, file order) into samples: every event
is a target, its history the user's previous ``seq_len`` events (:func:`history_index`), oldest
to newest, padded with id 0 on ``pad_side`` (left: the newest item is last). ``history``
(``HistoryKind``) says which previous events: ``all`` (every one, whatever its label: for
MovieLens the rated movies, liked or not) or ``positive`` (only those with label 1: the movies
the user liked, as a click sequence holds clicks). Optionally each positive event also yields
sampled negatives (:func:`sample_negatives`) with the same history and time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Literal, get_args

import numpy as np

from utils.choices import check_choice
from models.ctr_batch import PAD, PAD_BUCKET, ZERO_DELTA_BUCKET

PadSide = Literal["left", "right"]
PositionScheme = Literal["log", "linear"]
HistoryKind = Literal["all", "positive"]
PAD_SIDES: tuple[str, ...] = get_args(PadSide)
POSITION_SCHEMES: tuple[str, ...] = get_args(PositionScheme)
HISTORY_KINDS: tuple[str, ...] = get_args(HistoryKind)


def bucketize_time_delta(
    delta: np.ndarray | Iterable[float],
    *,
    n_buckets: int = 24,
    scheme: PositionScheme = "log",
    time_unit: float = 60.0,
    log_base: float = 2.0,
) -> np.ndarray:
    """Bucket ids (int64, in [1, n_buckets - 1]) of time deltas in seconds (>= 0).

    ``log``: 1 + min(floor(log_base(1 + delta / time_unit)), n_buckets - 2);
    ``linear``: 1 + min(floor(delta / time_unit), n_buckets - 2). A delta of 0 is bucket
    ``ZERO_DELTA_BUCKET`` (1); bucket ``PAD_BUCKET`` (0) is never returned (padding). The map is
    non-decreasing in delta. A negative delta (an item after the target: leakage) raises.
    """
    delta = np.asarray(delta, dtype=np.float64)
    if delta.size and np.nanmin(delta) < 0:
        raise ValueError(f"time deltas must be >= 0 (an item after its target?), got min {np.nanmin(delta)}")
    top = n_buckets - 2
    scaled = delta / time_unit
    if scheme == "log":
        # the tiny epsilon puts exact powers (delta / unit = base^k - 1) in bucket k + 1, not k
        raw = np.floor(np.log1p(scaled) / math.log(log_base) + 1e-9)
    elif scheme == "linear":
        raw = np.floor(scaled)
    else:
        raise ValueError(f"scheme={scheme!r} is not one of {list(POSITION_SCHEMES)}")
    return (ZERO_DELTA_BUCKET + np.minimum(raw, top)).astype(np.int64)


def history_index(user: np.ndarray, seq_len: int, pad_side: PadSide,
                  among: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """For events sorted by (user, time): the indices (E, L) of each event's previous ``seq_len``
    events of the same user, oldest to newest, and the mask (E, L) of real entries.

    ``among`` (E,) bool limits the history to the events it marks (e.g. the positives); None:
    every event. ``left`` padding puts the real entries last (the newest in the last column);
    ``right`` puts them first. Masked entries hold index 0 (use the mask).

    Vectorised: the marked events are numbered in order (``rank``); an event's history is the
    marked events numbered from the user's first one up to, not including, the event itself.
    """
    E = len(user)
    pos = np.arange(E)
    marked = np.ones(E, dtype=bool) if among is None else np.asarray(among, dtype=bool)
    if marked.shape != (E,):
        raise ValueError(f"among has shape {marked.shape}, not the {E} events' ({E},)")
    new = np.ones(E, dtype=bool)
    new[1:] = user[1:] != user[:-1]
    start = np.maximum.accumulate(np.where(new, pos, 0))
    before = np.cumsum(marked) - marked  # marked events at earlier positions: the rank of the next one
    n = np.minimum(before - before[start], seq_len)  # earlier marked events of the same user available
    cols = np.arange(seq_len)
    if pad_side == "left":
        rank = before[:, None] - seq_len + cols[None, :]
        mask = cols[None, :] >= (seq_len - n)[:, None]
    else:
        rank = (before - n)[:, None] + cols[None, :]
        mask = cols[None, :] < n[:, None]
    if among is not None:  # rank -> position of the marked event (every event marked: they are equal)
        marked_pos = np.flatnonzero(marked) if marked.any() else np.zeros(1, dtype=np.int64)
        np.clip(rank, 0, len(marked_pos) - 1, out=rank)
        rank = marked_pos[rank]
    rank[~mask] = 0  # in place: (E, L) int64 is the largest array here
    return rank, mask


def sample_negatives(user: np.ndarray, clicked_user: np.ndarray, clicked_item: np.ndarray,
                     candidates: np.ndarray, rng: np.random.Generator, rounds: int = 20) -> np.ndarray:
    """For each entry of ``user``, a uniform draw from ``candidates`` that the user never clicked.

    Collisions are redrawn up to ``rounds`` times (a user who clicked nearly every candidate,
    as in tiny test files, may keep a clicked item after that).
    """
    base = int(max(candidates.max(initial=0), clicked_item.max(initial=0))) + 1
    clicked = np.unique(clicked_user.astype(np.int64) * base + clicked_item)
    out = candidates[rng.integers(0, len(candidates), len(user))]
    for _ in range(rounds):
        keys = user.astype(np.int64) * base + out
        pos = np.searchsorted(clicked, keys).clip(max=len(clicked) - 1)
        hit = clicked[pos] == keys
        if not hit.any():
            break
        out[hit] = candidates[rng.integers(0, len(candidates), int(hit.sum()))]
    return out


def build_samples(
    *,
    user: np.ndarray,
    item: np.ndarray,
    category: np.ndarray,
    time: np.ndarray,
    label: np.ndarray,
    split: np.ndarray,
    seq_len: int,
    pad_side: PadSide,
    bucketize: Callable[[np.ndarray], np.ndarray],
    min_history: int,
    history: HistoryKind = "all",
    user_features: np.ndarray | None = None,
    negatives: int = 0,
    item_category: np.ndarray | None = None,
    rng: np.random.Generator | None = None,
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Samples from events sorted by (user, time, order): every event is a target with the user's
    previous events (``history``: ``all``, or only the ``positive`` ones) as its history. Samples
    with fewer than ``min_history`` history items are dropped. With ``negatives`` > 0 each
    positive (label 1) also yields that many samples (label 0) with the same history, time and
    split and a target item the user has no event with (category from ``item_category``, drawn
    with ``rng`` from the items of all events). Returns (columns, split codes 0/1/2).
    """
    check_choice("history", history, HistoryKind)
    hidx, hmask = history_index(user, seq_len, pad_side, among=None if history == "all" else label == 1)
    keep = hmask.sum(1) >= min_history
    hidx, hmask = hidx[keep], hmask[keep]
    t_user, t_item, t_time = user[keep], item[keep], time[keep]
    t_cat, t_label, t_split = category[keep], label[keep], split[keep]
    hist_times = np.where(hmask, time[hidx], 0)
    delta = np.where(hmask, t_time[:, None] - hist_times, 0)
    positions = np.where(hmask, bucketize(delta), PAD_BUCKET)
    cols = {
        "user": t_user, "target_item": t_item, "target_category": t_cat, "label": t_label,
        "target_time": t_time,
        "hist_items": np.where(hmask, item[hidx], PAD), "hist_categories": np.where(hmask, category[hidx], PAD),
        "hist_positions": positions, "hist_times": hist_times,
    }
    if user_features is not None and user_features.shape[1]:
        cols["user_features"] = user_features[t_user]
    if negatives:
        positive = t_label == 1  # a rated-but-disliked movie is already a negative: it gets none
        reps = {k: np.repeat(v[positive], negatives, axis=0) for k, v in cols.items()}
        candidates = np.unique(item)
        reps["target_item"] = sample_negatives(reps["user"], user, item, candidates, rng)
        reps["target_category"] = item_category[reps["target_item"]]
        reps["label"] = np.zeros_like(reps["label"])
        cols = {k: np.concatenate([cols[k], reps[k]]) for k in cols}
        t_split = np.concatenate([t_split, np.repeat(t_split[positive], negatives)])
    return cols, t_split

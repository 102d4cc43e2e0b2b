"""Train / validation / test split codes (0 / 1 / 2) and the seeded user subset.

Each source names one rule in its registry entry (``sources.py``):

- :func:`per_user_last_split` (MovieLens, Amazon): per user, the last event is test, the second
  to last validation, the rest train; temporal, so no history holds a later event.
- :func:`day_split` (Taobao): the last calendar day is test, the day before validation.
- :func:`random_split` (synthetic): samples are i.i.d. given the user, so a seeded random cut.

:func:`subsample_users` keeps a seeded random subset of users (``max_users``).
"""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np

SplitName = Literal["train", "val", "test"]
#: the split names, in the order of their codes 0, 1, 2
SPLITS: tuple[str, ...] = get_args(SplitName)


def per_user_last_split(user: np.ndarray, min_events: int = 3) -> np.ndarray:
    """Split codes for events sorted by (user, time): last event test (2), second to last
    validation (1), the rest train (0); users with fewer than ``min_events`` events: all train."""
    E = len(user)
    last = np.ones(E, dtype=bool)
    last[:-1] = user[:-1] != user[1:]
    second = np.zeros(E, dtype=bool)
    second[:-1] = last[1:] & ~last[:-1]
    _, inverse, counts = np.unique(user, return_inverse=True, return_counts=True)
    enough = counts[inverse] >= min_events
    split = np.zeros(E, dtype=np.int64)
    split[last & enough] = 2
    split[second & enough] = 1
    return split


def day_split(time: np.ndarray, utc_offset_hours: float) -> np.ndarray:
    """Split codes by calendar day in UTC+``utc_offset_hours``: the last day with an event test
    (2), the day before validation (1), earlier days train (0)."""
    day = (time + int(utc_offset_hours * 3600)) // 86400
    last_day = day.max()
    return np.where(day == last_day, 2, np.where(day == last_day - 1, 1, 0))


def random_split(n: int, *, val_fraction: float, test_fraction: float, seed: int) -> np.ndarray:
    """Seeded random split codes of ``n`` samples: test with probability ``test_fraction``,
    validation ``val_fraction``, the rest train (the generator is seeded with ``[seed, 1]``, so
    the cut does not reuse the stream that drew the samples)."""
    u = np.random.default_rng([seed, 1]).random(n)
    return np.where(u < test_fraction, 2, np.where(u < test_fraction + val_fraction, 1, 0))


def subsample_users(user: np.ndarray, max_users: int | None, rng: np.random.Generator) -> np.ndarray:
    """Boolean mask of the events of a seeded random subset of ``max_users`` users (all if None)."""
    uniq = np.unique(user)
    if max_users is None or max_users >= len(uniq):
        return np.ones(len(user), dtype=bool)
    chosen = rng.choice(uniq, size=max_users, replace=False)
    return np.isin(user, chosen)


def split_summary(label: np.ndarray, user: np.ndarray, split: np.ndarray) -> dict[str, dict]:
    """Per split name: its ``samples``, ``positive_rate`` (None if empty) and distinct ``users``."""
    out = {}
    for code, name in enumerate(SPLITS):
        m = split == code
        out[name] = {"samples": int(m.sum()), "positive_rate": float(label[m].mean()) if m.any() else None,
                     "users": int(len(np.unique(user[m])))}
    return out

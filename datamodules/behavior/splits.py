"""Train / validation / test split codes (0 / 1 / 2) and the seeded user subset.

The real sources share one evaluation protocol, chosen by the data module's ``split``
(``SplitRuleName``; ``sources.py`` maps each name to its rule):

- ``user_fraction`` (default), :func:`per_user_fraction_split`: per user, the last
  ``test_fraction`` of the user's events (at least ``min_split_events``) are test, the
  ``val_fraction`` before them validation, the rest train. Every evaluated user has several
  test impressions, so a user can hold both labels and GAUC (a per-user AUC) is defined for
  them; with one test event per user it never is.
- ``leave_one_out``, :func:`per_user_last_split`: per user, the last event is test, the second
  to last validation, the rest train (DIN's Amazon protocol).
- ``last_days``, :func:`day_split`: the last calendar day is test, the day before validation
  (Taobao's nine days).

All three are temporal: within a user, the train events come before the validation events and
those before the test events, so a model never trains on a user's future.
:func:`random_split` (synthetic) is a seeded random cut: those samples are i.i.d. given the user.

:func:`subsample_users` keeps a seeded random subset of users (``max_users``).
"""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np

SplitName = Literal["train", "val", "test"]
#: the split names, in the order of their codes 0, 1, 2
SPLITS: tuple[str, ...] = get_args(SplitName)
#: the evaluation protocols of the real sources (the data module's ``split``)
SplitRuleName = Literal["user_fraction", "leave_one_out", "last_days"]
SPLIT_RULE_NAMES: tuple[str, ...] = get_args(SplitRuleName)


def per_user_fraction_split(user: np.ndarray, *, test_fraction: float = 0.1, val_fraction: float = 0.1,
                            min_split_events: int = 2) -> np.ndarray:
    """Split codes for events sorted by (user, time): per user with n events, the last
    max(``min_split_events``, round(``test_fraction`` * n)) are test (2), the
    max(``min_split_events``, round(``val_fraction`` * n)) before them validation (1), the rest
    train (0). A user whose test and validation counts would leave no train event is all train
    (with the defaults: fewer than 5 events), so every split of an evaluated user has at least
    ``min_split_events`` events. Halves round up.
    """
    E = len(user)
    pos = np.arange(E)
    new = np.ones(E, dtype=bool)
    new[1:] = user[1:] != user[:-1]
    start = np.maximum.accumulate(np.where(new, pos, 0))
    last = np.ones(E, dtype=bool)
    last[:-1] = new[1:]
    end = np.minimum.accumulate(np.where(last, pos, E)[::-1])[::-1]  # each event's user's last position
    n = end - start + 1
    n_test = np.maximum(min_split_events, _round_half_up(test_fraction * n))
    n_val = np.maximum(min_split_events, _round_half_up(val_fraction * n))
    from_end = end - pos  # 0 for the user's last event
    split = np.where(from_end < n_test, 2, np.where(from_end < n_test + n_val, 1, 0))
    return np.where(n_test + n_val < n, split, 0)


def _round_half_up(x: np.ndarray) -> np.ndarray:
    """Nearest integer, halves up (0.1 * 25 is 2.5 and gives 3; the epsilon absorbs float error)."""
    return np.floor(x + 0.5 + 1e-9).astype(np.int64)


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

"""The registry of sources: for each, its reader, its raw files, its split rule and how it becomes samples.

``SOURCES[name]`` is a :class:`BehaviorSource`; :func:`get_source` looks one up (an unknown name lists
the known ones). ``BehaviorSource.build(data_dir, params, bucketize)`` returns the samples, their split
codes, the vocabulary sizes and what the results file records about the raw data.

``synthetic`` (offline default; ``synthetic.generate_synthetic``)
    A seeded world whose click depends on the profile, the history's categories by recency, the
    order of recent items and the time since the newest one (see ``synthetic.py``). The true
    click probabilities are kept and scored as the ``ceiling``. Split: random
    (``synthetic_val_fraction``, ``synthetic_test_fraction``); the real sources' ``split``,
    ``test_fraction``, ``val_fraction``, ``min_split_events``, ``history`` and the negatives do
    not apply (the generator draws its own histories and labels).
``movielens_1m`` (``data_dir`` = the unzipped ``ml-1m`` folder)
    ``ratings.dat`` ``UserID::MovieID::Rating::Timestamp``, ``users.dat``
    ``UserID::Gender::Age::Occupation::Zip-code``, ``movies.dat`` ``MovieID::Title::Genres``
    (``::``-separated, latin-1). Every rating is a sample; label = rating >= ``positive_rating``
    (4); category = the movie's first listed genre; profile = gender, age, occupation, first
    character of the zip code.
``movielens_csv`` (``data_dir`` = an unzipped folder of the CSV family: ml-latest-small,
ml-latest, ml-20m, ml-25m, ml-32m)
    ``ratings.csv`` ``userId,movieId,rating,timestamp`` (ratings in 0.5 steps), ``movies.csv``
    ``movieId,title,genres``, optional ``tags.csv`` (counted, not a feature); headers, UTF-8.
    Samples as for ``movielens_1m`` (label = rating >= ``positive_rating``, so 4.0, 4.5 and 5.0
    are positives), without a profile (the family has no demographics).
``taobao_user_behavior`` (``data_dir`` holds ``UserBehavior.csv``)
    No header: ``user_id,item_id,category_id,behavior_type,timestamp`` with behavior_type in
    pv/buy/cart/fav. Clicks (pv) inside ``taobao_time_window`` are the positives and the
    behaviour sequence (the other types are checked, then dropped).
``amazon_electronics`` (DIN's layout; ``data_dir`` holds ``reviews_Electronics_5.json`` and
``meta_Electronics.json``)
    One JSON review per line (``reviewerID``, ``asin``, ``unixReviewTime``); meta lines are JSON
    or Python dict literals (``asin``, ``categories``), the category being the last entry of the
    last category path, as DIN's script does. Each review is a positive.

What the real sources share:

- Split (``split``, the same protocol for every real source; ``splits.py``): ``user_fraction``
  (default) per user the last ``test_fraction`` (0.1) of the events, at least
  ``min_split_events`` (2), test, the ``val_fraction`` (0.1) before them validation, the rest
  train, users too short for that all train; ``leave_one_out`` per user the last event test,
  the second to last validation (users with fewer than 3 events all train);
  ``last_days`` the last calendar day (in UTC+``utc_offset_hours``) test, the day before
  validation. ``describe()`` records the rule and its parameters.
- History (``history``): the user's previous ``seq_len`` events with their times, ``all`` of
  them (MovieLens: every rated movie, whatever the rating) or only the ``positive`` ones
  (label 1); for Taobao and Amazon, whose events are all positives, both are the same.
- Negatives (``negatives_per_positive``; None = the source's default: 1 for Taobao and Amazon,
  whose events are all positives, 0 for MovieLens, whose low ratings are the negatives): each
  positive also yields that many samples with label 0, the positive's history, time and split,
  and an item the user has no event with (never clicked, reviewed or rated), drawn uniformly
  from the items of the kept events.
- Samples whose history has fewer than ``min_history`` items are dropped (the first event of
  every user, with the default 1); ``max_users`` keeps a seeded random subset of users (the
  full Taobao file has about 1M users and 100M events, kept in memory). One generator seeded
  with ``seed`` draws the user subset, then the negatives.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal, get_args

import numpy as np

from datamodules.behavior.readers import (
    AMAZON_ELECTRONICS_FILES,
    MOVIELENS_1M_FILES,
    MOVIELENS_CSV_FILES,
    TAOBAO_FILES,
    RawFiles,
    read_amazon_electronics,
    read_movielens_1m,
    read_movielens_csv,
    read_user_behavior,
)
from datamodules.behavior.samples import build_samples
from datamodules.behavior.splits import (
    SPLIT_RULE_NAMES,
    day_split,
    per_user_fraction_split,
    per_user_last_split,
    random_split,
    subsample_users,
)
from datamodules.behavior.synthetic import SYNTHETIC_PROFILE_CARDINALITIES, generate_synthetic, synthetic_ceiling
from models.ctr_batch import PAD

SourceName = Literal["synthetic", "movielens_1m", "movielens_csv", "taobao_user_behavior", "amazon_electronics"]
Params = Mapping[str, Any]  #: the data module's hyperparameters
#: (user, time, params) -> split codes 0 train / 1 val / 2 test, one per event (or sample)
SplitRule = Callable[[np.ndarray, np.ndarray, Params], np.ndarray]
#: the real sources' split and history parameters (a generated source ignores them)
REAL_SOURCE_PARAMS = ("split", "test_fraction", "val_fraction", "min_split_events", "history")


@dataclass(frozen=True)
class Events:
    """A real source's events after its reader: sorted by (user, time, file order), ids 1..n (0 = padding)."""

    user: np.ndarray
    item: np.ndarray
    category: np.ndarray
    time: np.ndarray
    label: np.ndarray
    sizes: dict  #: ``n_users``, ``n_items``, ``n_categories`` (and ``profile_sizes``), id 0 included
    raw: dict  #: counts of the raw data, for the results file
    user_features: np.ndarray | None = None  #: (n_users, P) profile table indexed by user id
    item_category: np.ndarray | None = None  #: (n_items,) category per item id, for sampled negatives


@dataclass(frozen=True)
class PreparedBehavior:
    """A source's samples: columns, split codes, vocabulary sizes, and ``ceiling`` or ``raw`` meta."""

    columns: dict[str, np.ndarray]
    split: np.ndarray
    sizes: dict
    meta: dict


@dataclass(frozen=True)
class BehaviorSource:
    """One registry entry.

    ``reader`` reads (or generates) the raw data; ``events`` turns its output into
    :class:`Events` (real sources); ``prepare`` runs the whole pipeline. The split rule is
    ``fixed_split`` (a generated source's own) or the one the ``split`` parameter names
    (``SPLIT_RULES``). ``files`` is None for a generated source. ``default_negatives`` is the
    number of sampled negatives per positive when ``negatives_per_positive`` is None.
    ``cache_ignores`` are prefixes of parameters that do not change this source's samples (left
    out of its cache key); ``described`` the parameters ``describe()`` reports besides the
    common ones.
    """

    name: str
    reader: Callable[..., Any]
    prepare: Callable[[BehaviorSource, str | None, Params, Callable[[np.ndarray], np.ndarray]], PreparedBehavior]
    files: RawFiles | None = None
    events: Callable[[BehaviorSource, str | os.PathLike, Params, np.random.Generator], Events] | None = None
    fixed_split: str | None = None
    default_negatives: int = 0
    cache_ignores: tuple[str, ...] = ("synthetic_",)
    described: tuple[str, ...] = ()

    def build(self, data_dir: str | None, params: Params, bucketize: Callable[[np.ndarray], np.ndarray]) -> PreparedBehavior:
        """Run this source's pipeline (``prepare``) with the data module's parameters."""
        return self.prepare(self, data_dir, params, bucketize)

    def split_rule(self, params: Params) -> str:
        """The name of the rule that splits this source (a key of ``SPLIT_RULES``)."""
        return self.fixed_split or params["split"]

    def cut(self, user: np.ndarray, time: np.ndarray, params: Params) -> np.ndarray:
        """Split codes 0 train / 1 val / 2 test of events (or samples) sorted by (user, time)."""
        return SPLIT_RULES[self.split_rule(params)](user, time, params)

    def describe_split(self, params: Params) -> dict:
        """The split rule and the parameters it reads, as the results file records them."""
        rule = self.split_rule(params)
        return {"rule": rule, **{k: params[k] for k in SPLIT_RULE_PARAMS[rule]}}

    def negatives_per_positive(self, params: Params) -> int:
        """Sampled negatives per positive: ``negatives_per_positive``, or this source's default when None."""
        value = params.get("negatives_per_positive")
        return self.default_negatives if value is None else int(value)


# ----------------------------------------------------------------------------------- split rules
def user_fractions(user: np.ndarray, time: np.ndarray, params: Params) -> np.ndarray:
    """Per user: the last ``test_fraction`` test, the ``val_fraction`` before validation, each at
    least ``min_split_events`` (``splits.per_user_fraction_split``)."""
    return per_user_fraction_split(user, test_fraction=params["test_fraction"], val_fraction=params["val_fraction"],
                                   min_split_events=params["min_split_events"])


def last_events_per_user(user: np.ndarray, time: np.ndarray, params: Params) -> np.ndarray:
    """Per user: last event test, second to last validation (``splits.per_user_last_split``)."""
    return per_user_last_split(user)


def last_days(user: np.ndarray, time: np.ndarray, params: Params) -> np.ndarray:
    """Last day test, the day before validation, in UTC+``utc_offset_hours`` (``splits.day_split``)."""
    return day_split(time, params["utc_offset_hours"])


def random_fractions(user: np.ndarray, time: np.ndarray, params: Params) -> np.ndarray:
    """Seeded random cut with the ``synthetic_*_fraction`` parameters (``splits.random_split``)."""
    return random_split(len(user), val_fraction=params["synthetic_val_fraction"],
                        test_fraction=params["synthetic_test_fraction"], seed=params["seed"])


#: split rule name -> the rule: the real sources' ``split`` choices, and the synthetic ``random``
SPLIT_RULES: Mapping[str, SplitRule] = MappingProxyType({
    "user_fraction": user_fractions, "leave_one_out": last_events_per_user, "last_days": last_days,
    "random": random_fractions,
})
#: split rule name -> the parameters it reads (what ``describe()`` records with the rule)
SPLIT_RULE_PARAMS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "user_fraction": ("test_fraction", "val_fraction", "min_split_events"), "leave_one_out": (),
    "last_days": ("utc_offset_hours",), "random": ("synthetic_val_fraction", "synthetic_test_fraction", "seed"),
})
if set(SPLIT_RULES) != set(SPLIT_RULE_NAMES) | {"random"} or set(SPLIT_RULE_PARAMS) != set(SPLIT_RULES):
    raise ImportError(f"the split rules {list(SPLIT_RULES)} and SplitRuleName {list(SPLIT_RULE_NAMES)} disagree")


# ----------------------------------------------------------------------------------- pipelines
def prepare_generated(source: BehaviorSource, data_dir: str | None, params: Params,
                      bucketize: Callable[[np.ndarray], np.ndarray]) -> PreparedBehavior:
    """The synthetic pipeline: generate samples, split them, score the true probabilities."""
    h = params
    columns = source.reader(
        n_users=h["synthetic_users"], n_items=h["synthetic_items"], n_categories=h["synthetic_categories"],
        n_samples=h["synthetic_samples"], seq_len=h["seq_len"], min_history=h["min_history"], seed=h["seed"],
        pad_side=h["pad_side"], bucketize=bucketize,
    )
    split = source.cut(columns["user"], columns["target_time"], h)
    sizes = {"n_users": h["synthetic_users"] + 1, "n_items": h["synthetic_items"] + 1,
             "n_categories": h["synthetic_categories"] + 1,
             "profile_sizes": [k + 1 for k in SYNTHETIC_PROFILE_CARDINALITIES]}
    return PreparedBehavior(columns, split, sizes, {"ceiling": synthetic_ceiling(columns, split)})


def prepare_events(source: BehaviorSource, data_dir: str | None, params: Params,
                   bucketize: Callable[[np.ndarray], np.ndarray]) -> PreparedBehavior:
    """The real-source pipeline: read events, split them, build samples (and sampled negatives)."""
    rng = np.random.default_rng(params["seed"])
    ev = source.events(source, data_dir, params, rng)
    columns, split = build_samples(
        user=ev.user, item=ev.item, category=ev.category, time=ev.time, label=ev.label,
        split=source.cut(ev.user, ev.time, params), user_features=ev.user_features,
        negatives=source.negatives_per_positive(params), item_category=ev.item_category,
        rng=rng, seq_len=params["seq_len"], pad_side=params["pad_side"], bucketize=bucketize,
        min_history=params["min_history"], history=params["history"],
    )
    return PreparedBehavior(columns, split, ev.sizes, {"raw": ev.raw})


# ----------------------------------------------------------------------------------- events
def movielens_events(source: BehaviorSource, data_dir: str | os.PathLike, params: Params,
                     rng: np.random.Generator) -> Events:
    """Ratings as events, label = rating >= ``positive_rating``; ids as the reader maps them
    (both MovieLens readers: ml-1m's ``::`` files and the CSV family)."""
    ev = source.reader(data_dir)
    keep = subsample_users(ev["user"], params["max_users"], rng)
    user, item, category, ts, rating = (ev[k][keep] for k in ("user", "item", "category", "time", "rating"))
    return Events(
        user=user, item=item, category=category, time=ts,
        label=(rating >= params["positive_rating"]).astype(np.float32),
        sizes={k: ev[k] for k in ("n_users", "n_items", "n_categories", "profile_sizes")},
        raw={"ratings": int(len(user)), **ev["counts"]}, user_features=ev["user_features"],
        item_category=ev["item_category"],
    )


def taobao_events(source: BehaviorSource, data_dir: str | os.PathLike, params: Params,
                  rng: np.random.Generator) -> Events:
    """Clicks in the time window as positives; ids mapped 1..n over the kept users' events."""
    window = params["taobao_time_window"]
    ev = source.reader(data_dir, time_window=window)
    if ev["clicks"] == 0:
        raise ValueError(f"no clicks (pv) in {data_dir}/UserBehavior.csv inside taobao_time_window={window}")
    keep = subsample_users(ev["user"], params["max_users"], rng)
    user_map, item_map, cat_map = (np.unique(ev[k][keep]) for k in ("user", "item", "category"))
    user = np.searchsorted(user_map, ev["user"][keep]) + 1
    item = np.searchsorted(item_map, ev["item"][keep]) + 1
    category = np.searchsorted(cat_map, ev["category"][keep]) + 1
    item_category = np.zeros(len(item_map) + 1, dtype=np.int64)
    item_category[item] = category  # an item listed under several categories keeps its last
    return Events(
        user=user, item=item, category=item_category[item], time=ev["time"][keep],
        label=np.ones(len(user), np.float32),
        sizes={"n_users": len(user_map) + 1, "n_items": len(item_map) + 1, "n_categories": len(cat_map) + 1},
        raw={"rows": ev["rows"], "clicks_in_window": ev["clicks"], "last_day_utc_offset": params["utc_offset_hours"]},
        item_category=item_category,
    )


def amazon_events(source: BehaviorSource, data_dir: str | os.PathLike, params: Params,
                  rng: np.random.Generator) -> Events:
    """Reviews as positives; ids mapped 1..n over all reviews (before the user subset), then sorted."""
    ev = source.reader(data_dir)
    users = np.asarray(ev["user"])
    uniq_users, user = np.unique(users, return_inverse=True)
    uniq_items, item = np.unique(np.asarray(ev["item"]), return_inverse=True)
    user, item = user + 1, item + 1
    cat_names = sorted(set(ev["item_category"].values()))
    cat_id = {c: i + 1 for i, c in enumerate(cat_names)}
    item_category = np.zeros(len(uniq_items) + 1, dtype=np.int64)
    item_category[1:] = [cat_id.get(ev["item_category"].get(a), PAD) for a in uniq_items]
    ts = ev["time"]
    keep = subsample_users(user, params["max_users"], rng)
    user, item, ts = user[keep], item[keep], ts[keep]
    order = np.lexsort((np.arange(len(user)), ts, user))
    user, item, ts = user[order], item[order], ts[order]
    return Events(
        user=user, item=item, category=item_category[item], time=ts, label=np.ones(len(user), np.float32),
        sizes={"n_users": len(uniq_users) + 1, "n_items": len(uniq_items) + 1, "n_categories": len(cat_names) + 1},
        raw={"reviews": int(len(users)), "items_with_category": len(ev["item_category"])},
        item_category=item_category,
    )


# ----------------------------------------------------------------------------------- the registry
_ENTRIES = (
    BehaviorSource("synthetic", reader=generate_synthetic, prepare=prepare_generated, fixed_split="random",
           cache_ignores=("positive_", "negatives_", "max_users", "taobao_", "utc_", *REAL_SOURCE_PARAMS)),
    BehaviorSource("movielens_1m", reader=read_movielens_1m, prepare=prepare_events, files=MOVIELENS_1M_FILES,
           events=movielens_events, described=("positive_rating", "max_users")),
    BehaviorSource("movielens_csv", reader=read_movielens_csv, prepare=prepare_events, files=MOVIELENS_CSV_FILES,
           events=movielens_events, described=("positive_rating", "max_users")),
    BehaviorSource("taobao_user_behavior", reader=read_user_behavior, prepare=prepare_events, files=TAOBAO_FILES,
           events=taobao_events, default_negatives=1, described=("max_users", "taobao_time_window")),
    BehaviorSource("amazon_electronics", reader=read_amazon_electronics, prepare=prepare_events,
           files=AMAZON_ELECTRONICS_FILES, events=amazon_events, default_negatives=1, described=("max_users",)),
)
#: name -> :class:`BehaviorSource`, in the order of ``SourceName``
SOURCES: Mapping[str, BehaviorSource] = MappingProxyType({s.name: s for s in _ENTRIES})
if tuple(SOURCES) != get_args(SourceName):
    raise ImportError(f"the source registry {list(SOURCES)} and SourceName {list(get_args(SourceName))} disagree")
#: name -> the raw files each real source needs in ``data_dir``
REQUIRED_FILES = {s.name: s.files.names for s in _ENTRIES if s.files is not None}
#: name -> where to download each real source
DOWNLOAD = {s.name: s.files.download for s in _ENTRIES if s.files is not None}


def get_source(name: str) -> BehaviorSource:
    """The registry entry of ``name``; ValueError listing the known sources if there is none."""
    try:
        return SOURCES[name]
    except (KeyError, TypeError):
        raise ValueError(f"source={name!r} is not one of {list(SOURCES)}") from None

"""CTR data with user behaviour sequences for the BST reproduction (Chen et al. 2019).

``BehaviorDataModule(source=...)`` turns one of four sources into samples
(user, profile, target item, its category, the user's previous ``seq_len`` items with their
categories and position buckets, click label), split into train / val / test, cached on disk
as HF ``datasets``, and served as dict batches (keys and shapes in ``models/ctr.py``).

Sources
-------
``synthetic`` (offline default; :func:`generate_synthetic`)
    A seeded world of users with profile fields, items with categories and time-stamped
    histories, where the click on a target depends on (1) the user's profile (a per-category
    preference drawn from the profile plus a per-user part), (2) which categories the history
    holds, weighted by recency, (3) the order of recent items (a fixed "complement" map such as
    phone -> phone case: a boost when the newest item's complement is the target) and (4) how
    long ago the newest item happened (the boost fades within about an hour). WDL can find (1),
    mean pooling part of (2), DIN (2) without the recency, BST with the time-delta position all
    four. The true click probabilities are kept, and their AUC / GAUC on the test split (the
    ceiling no model can beat in expectation) is recorded in ``ceiling`` / ``ceiling_auc``.
    Samples are i.i.d. given the user, so the split is random (fractions configurable).
``movielens_1m`` (``data_dir`` = the unzipped ``ml-1m`` folder)
    ``ratings.dat`` ``UserID::MovieID::Rating::Timestamp``, ``users.dat``
    ``UserID::Gender::Age::Occupation::Zip-code``, ``movies.dat`` ``MovieID::Title::Genres``
    (``::``-separated, latin-1). Every rating is a sample; label = rating >= ``positive_rating``
    (4); the sequence = the user's previous ``seq_len`` rated movies (any rating) with their
    times; category = the movie's first listed genre; profile = gender, age, occupation, first
    character of the zip code. Temporal split per user: the last rating is test, the second to
    last validation, the rest train (users with fewer than 3 ratings: all train).
``taobao_user_behavior`` (``data_dir`` holds ``UserBehavior.csv``)
    No header: ``user_id,item_id,category_id,behavior_type,timestamp`` with behavior_type in
    pv/buy/cart/fav. Clicks (pv) inside ``taobao_time_window`` are the positives and the
    behaviour sequence (the other types are checked, then dropped); each positive gets
    ``negatives_per_positive`` items the user never clicked, drawn uniformly from the items
    seen, with the positive's history and time. Split by day (in UTC+``utc_offset_hours``): the
    last day test, the day before validation, earlier days train.
``amazon_electronics`` (DIN's layout; ``data_dir`` holds ``reviews_Electronics_5.json`` and
``meta_Electronics.json``)
    One JSON review per line (``reviewerID``, ``asin``, ``unixReviewTime``); meta lines are JSON
    or Python dict literals (``asin``, ``categories``), the category being the last entry of the
    last category path, as DIN's script does. Each review is a positive with one random
    never-reviewed item as negative (``negatives_per_positive``); the last review per user is
    test, the second to last validation (DIN has no validation split), the rest train.

For the real sources, samples whose history has fewer than ``min_history`` items are dropped
(the first event of every user, with the default 1); ``max_users`` keeps a seeded random subset
of users (the full Taobao file has about 1M users and 100M events, kept in memory).

Position feature (BST Sec. 3.1)
-------------------------------
pos(v_i) = t(target) - t(v_i) >= 0 in seconds, bucketised by :func:`bucketize_time_delta`:
``log`` (default) bucket = 1 + min(floor(log_base(1 + delta / time_unit)), n - 2), so with
the defaults (base 2, unit 60 s, 24 buckets) bucket 1 is under a minute (and the target's own
delta of 0), bucket 2 one to three minutes, bucket k about 2^(k-1) minutes, up to about
8 years in bucket 23; ``linear`` bucket = 1 + min(floor(delta / time_unit), n - 2). Bucket 0 is
padding. Log buckets keep the resolution where recency matters (minutes) and still separate
days from months, with a small table.

Padding and caching
-------------------
Sequences are stored oldest to newest, padded to ``seq_len`` with id 0 on ``pad_side`` (left:
the newest item is last). The preprocessed splits are saved with HF ``datasets`` under
``cache_dir`` (default ``$BEHAVIOR_CACHE_DIR`` or ``~/.cache/bst_behavior``), in a folder named
by a hash of the source files' sizes and modification times and every preprocessing
parameter; it is written to a temporary folder and renamed, so a second run (or another
process) loads it instead of preprocessing, and a half-written cache is never read.

Batches and devices
-------------------
``batch_size`` is the global batch; ``setup`` splits it over ``trainer.world_size`` processes
(``per_device_batch_size``). Batches are dicts: ``user`` (B,), ``user_features`` (B, P),
``target_item`` (B,), ``target_category`` (B,), ``hist_items`` / ``hist_categories`` /
``hist_positions`` (B, L) long, ``hist_mask`` (B, L) bool, ``label`` (B,) float. After
``setup`` (or on first access) ``feature_sizes`` gives what the nets need.
"""

from __future__ import annotations

import ast
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import torch
from lightning import LightningDataModule
from torch.utils.data import DataLoader, Dataset

from models.ctr import PAD, PAD_BUCKET, ZERO_DELTA_BUCKET

SOURCES = ("synthetic", "movielens_1m", "taobao_user_behavior", "amazon_electronics")
PAD_SIDES = ("left", "right")
POSITION_SCHEMES = ("log", "linear")
SPLITS = ("train", "val", "test")
CACHE_VERSION = 1

REQUIRED_FILES = {
    "movielens_1m": ("ratings.dat", "users.dat", "movies.dat"),
    "taobao_user_behavior": ("UserBehavior.csv",),
    "amazon_electronics": ("reviews_Electronics_5.json", "meta_Electronics.json"),
}
DOWNLOAD = {
    "movielens_1m": "https://files.grouplens.org/datasets/movielens/ml-1m.zip (unzip; data_dir = the ml-1m folder)",
    "taobao_user_behavior": "Tianchi dataset 649, https://tianchi.aliyun.com/dataset/649 (UserBehavior.csv.zip; sign-in required)",
    "amazon_electronics": (
        "the McAuley lab Amazon 2014 page, https://jmcauley.ucsd.edu/data/amazon/ "
        "(reviews_Electronics_5.json.gz and meta_Electronics.json.gz; gunzip both)"
    ),
}
FORMATS = {
    "ratings.dat": "UserID::MovieID::Rating::Timestamp (integers, latin-1)",
    "users.dat": "UserID::Gender::Age::Occupation::Zip-code (latin-1)",
    "movies.dat": "MovieID::Title::Genres with Genres separated by '|' (latin-1)",
    "UserBehavior.csv": "user_id,item_id,category_id,behavior_type,timestamp (no header; integers except behavior_type in pv/buy/cart/fav)",
    "reviews_Electronics_5.json": 'one JSON object per line with "reviewerID" (str), "asin" (str), "unixReviewTime" (int)',
    "meta_Electronics.json": "one JSON object or Python dict literal per line with 'asin' (str) and optionally 'categories' (list of lists of str)",
}
TAOBAO_BEHAVIORS = ("pv", "buy", "cart", "fav")
#: 2017-11-25 00:00 to 2017-12-04 00:00 in UTC+8: the nine days the dataset documents.
TAOBAO_TIME_WINDOW = (1511539200, 1512316800)

#: batch keys and the stored column each comes from (``hist_mask`` is hist_items != 0)
BATCH_COLUMNS = ("user", "user_features", "target_item", "target_category", "hist_items",
                 "hist_categories", "hist_positions", "label")


class MalformedLineError(ValueError):
    """A raw file line that does not match the documented format."""

    def __init__(self, path: str | os.PathLike, lineno: int, expected: str, line: str | None = None,
                 reason: str | None = None) -> None:
        shown = "" if line is None else f": {line.rstrip()[:200]!r}"
        why = f" ({reason})" if reason else ""
        super().__init__(f"{path}, line {lineno}: malformed line{why}{shown}; expected {expected}")
        self.path, self.lineno = str(path), lineno


class DatasetMissingError(FileNotFoundError):
    """The raw files of a source are not where the config says."""


# =========================================================================== position buckets
def bucketize_time_delta(
    delta: np.ndarray | Iterable[float],
    *,
    n_buckets: int = 24,
    scheme: str = "log",
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


# =========================================================================== raw readers
def _require_files(source: str, data_dir: str | os.PathLike | None) -> Path:
    files = REQUIRED_FILES[source]
    if data_dir is None:
        raise DatasetMissingError(
            f"source={source!r} needs data_dir, a folder with {', '.join(files)}; download: {DOWNLOAD[source]}"
        )
    folder = Path(data_dir).expanduser()
    if not folder.is_dir():
        raise DatasetMissingError(
            f"source={source!r}: data_dir {str(folder)!r} does not exist (looked for {', '.join(files)} in it); "
            f"download: {DOWNLOAD[source]}"
        )
    missing = [name for name in files if not (folder / name).is_file()]
    if missing:
        raise DatasetMissingError(
            f"source={source!r}: missing {', '.join(missing)} in {str(folder)!r} "
            f"(needs {', '.join(files)}); download: {DOWNLOAD[source]}"
        )
    return folder


def _split_lines(path: Path, sep: str, n_fields: int, encoding: str = "latin-1"):
    """Yield (lineno, fields) of a separator-delimited file; blank lines are skipped."""
    expected = FORMATS[path.name] if path.name in FORMATS else f"{n_fields} fields separated by {sep!r}"
    with open(path, encoding=encoding, newline="") as f:
        for lineno, line in enumerate(f, 1):
            text = line.rstrip("\r\n")
            if not text.strip():
                continue
            fields = text.split(sep)
            if len(fields) != n_fields:
                raise MalformedLineError(path, lineno, expected, text, f"{len(fields)} fields, not {n_fields}")
            yield lineno, fields, text


def _vocab(values: Iterable) -> dict:
    """Deterministic id map, 1..n (0 stays padding / unknown)."""
    return {v: i + 1 for i, v in enumerate(sorted(set(values)))}


def read_movielens_1m(data_dir: str | os.PathLike) -> dict:
    """Parse ml-1m. Returns events (sorted by user, time, file order) and the vocabularies.

    Keys: ``user``, ``item``, ``category``, ``time`` (int64 seconds), ``rating`` (E,) arrays;
    ``user_features`` (n_users + 1, 4) profile table indexed by user id (row 0 = unknown);
    ``n_users``, ``n_items``, ``n_categories``, ``profile_sizes`` (vocabulary sizes, id 0 included).
    """
    folder = _require_files("movielens_1m", data_dir)
    movies_path, users_path, ratings_path = folder / "movies.dat", folder / "users.dat", folder / "ratings.dat"

    movie_genre: dict[int, str] = {}
    for lineno, (movie, _title, genres), text in _split_lines(movies_path, "::", 3):
        try:
            movie_id = int(movie)
        except ValueError:
            raise MalformedLineError(movies_path, lineno, FORMATS["movies.dat"], text, "MovieID is not an integer") from None
        movie_genre[movie_id] = genres.split("|")[0].strip()

    profiles: dict[int, tuple[str, str, str, str]] = {}
    for lineno, (user, gender, age, occupation, zipcode), text in _split_lines(users_path, "::", 5):
        try:
            user_id = int(user)
            int(age), int(occupation)
        except ValueError:
            raise MalformedLineError(users_path, lineno, FORMATS["users.dat"], text, "UserID, Age and Occupation must be integers") from None
        profiles[user_id] = (gender.strip(), age.strip(), occupation.strip(), zipcode.strip()[:1])

    rows = []
    for lineno, fields, text in _split_lines(ratings_path, "::", 4):
        try:
            rows.append(tuple(int(x) for x in fields))
        except ValueError:
            raise MalformedLineError(ratings_path, lineno, FORMATS["ratings.dat"], text, "not all integers") from None
    if not rows:
        raise ValueError(f"{ratings_path} holds no ratings")
    raw = np.asarray(rows, dtype=np.int64)
    raw_user, raw_movie, rating, ts = raw.T

    user_map = _vocab(np.unique(raw_user).tolist())
    item_map = _vocab(set(movie_genre) | set(np.unique(raw_movie).tolist()))
    genre_map = _vocab(movie_genre.values())
    field_maps = [_vocab(p[f] for p in profiles.values()) for f in range(4)]

    item_category = np.zeros(len(item_map) + 1, dtype=np.int64)
    for movie_id, item_id in item_map.items():
        item_category[item_id] = genre_map.get(movie_genre.get(movie_id), PAD)
    user_features = np.zeros((len(user_map) + 1, 4), dtype=np.int64)
    for user_id, uid in user_map.items():
        if user_id in profiles:
            user_features[uid] = [field_maps[f][profiles[user_id][f]] for f in range(4)]

    user = _map_array(raw_user, user_map)
    item = _map_array(raw_movie, item_map)
    order = np.lexsort((np.arange(len(user)), ts, user))  # user, then time, then file order
    return {
        "user": user[order], "item": item[order], "category": item_category[item[order]],
        "time": ts[order], "rating": rating[order], "user_features": user_features,
        "n_users": len(user_map) + 1, "n_items": len(item_map) + 1, "n_categories": len(genre_map) + 1,
        "profile_sizes": [len(m) + 1 for m in field_maps],
    }


def _map_array(values: np.ndarray, mapping: dict) -> np.ndarray:
    keys = np.fromiter(mapping.keys(), dtype=np.int64, count=len(mapping))
    ids = np.fromiter(mapping.values(), dtype=np.int64, count=len(mapping))
    order = np.argsort(keys)
    pos = np.searchsorted(keys[order], values)
    return ids[order][pos]


def _scan_user_behavior(path: Path, start_line: int = 1) -> None:
    """Find and raise the first malformed line of UserBehavior.csv (the slow, exact path)."""
    expected = FORMATS["UserBehavior.csv"]
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        for lineno, line in enumerate(f, 1):
            if lineno < start_line:
                continue
            text = line.rstrip("\r\n")
            if not text.strip():
                continue
            fields = text.split(",")
            if len(fields) != 5:
                raise MalformedLineError(path, lineno, expected, text, f"{len(fields)} fields, not 5")
            try:
                [int(fields[i]) for i in (0, 1, 2, 4)]
            except ValueError:
                raise MalformedLineError(path, lineno, expected, text, "a non-integer id or timestamp") from None
            if fields[3].strip() not in TAOBAO_BEHAVIORS:
                raise MalformedLineError(path, lineno, expected, text, f"behavior_type {fields[3]!r}")


def read_user_behavior(data_dir: str | os.PathLike, *, time_window: tuple[int, int] | None = TAOBAO_TIME_WINDOW,
                       chunk_rows: int = 5_000_000) -> dict:
    """Parse Taobao's UserBehavior.csv; keep the clicks (pv) inside ``time_window`` [start, end).

    Fast path: pandas reads chunks with fixed dtypes; if a chunk does not parse, or holds an
    unknown behaviour type, the file is scanned line by line to report the first bad line.
    Returns ``user``, ``item``, ``category``, ``time`` (E,) raw ids of the kept clicks, sorted by
    user, time and file order, and ``rows``/``clicks`` counts.
    """
    import pandas as pd

    folder = _require_files("taobao_user_behavior", data_dir)
    path = folder / "UserBehavior.csv"
    names = ["user", "item", "category", "behavior", "time"]
    dtypes = {"user": "int64", "item": "int64", "category": "int64", "behavior": "str", "time": "int64"}
    kept, rows = [], 0
    reader = pd.read_csv(path, header=None, names=names, dtype=dtypes, chunksize=chunk_rows,
                         skip_blank_lines=True, engine="c")
    while True:
        try:
            chunk = next(reader)
        except StopIteration:
            break
        except (ValueError, pd.errors.ParserError, OverflowError, TypeError):
            _scan_user_behavior(path)  # finds and raises the first bad line
            raise  # the scan found nothing wrong line by line: surface pandas' own error
        behavior = chunk["behavior"].str.strip()
        if not behavior.isin(TAOBAO_BEHAVIORS).all():
            _scan_user_behavior(path)
        rows += len(chunk)
        keep = (behavior == "pv").to_numpy(copy=True)
        if time_window is not None:
            t = chunk["time"].to_numpy()
            keep &= (t >= time_window[0]) & (t < time_window[1])
        kept.append(chunk.loc[keep, ["user", "item", "category", "time"]].to_numpy(dtype=np.int64))
    if rows == 0:
        raise ValueError(f"{path} holds no rows")
    data = np.concatenate(kept) if kept else np.zeros((0, 4), dtype=np.int64)
    user, item, category, ts = data.T
    order = np.lexsort((np.arange(len(user)), ts, user))
    return {"user": user[order], "item": item[order], "category": category[order], "time": ts[order],
            "rows": rows, "clicks": len(user)}


_ASIN = re.compile(r"""['"]asin['"]\s*:\s*['"]([^'"]+)['"]""")


def read_amazon_electronics(data_dir: str | os.PathLike) -> dict:
    """Parse the 5-core Electronics reviews and their meta data (DIN's layout).

    Returns raw string ids ``user`` (reviewerID), ``item`` (asin), ``time`` (unixReviewTime) in
    file order, and ``item_category``: asin -> category (last entry of the last category path)
    for the reviewed items that have meta data.
    """
    folder = _require_files("amazon_electronics", data_dir)
    reviews_path, meta_path = folder / "reviews_Electronics_5.json", folder / "meta_Electronics.json"
    users, items, times = [], [], []
    expected = FORMATS["reviews_Electronics_5.json"]
    with open(reviews_path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                review = json.loads(line)
                user, item, ts = review["reviewerID"], review["asin"], int(review["unixReviewTime"])
                if not isinstance(user, str) or not isinstance(item, str):
                    raise TypeError("ids must be strings")
            except (ValueError, KeyError, TypeError) as err:
                raise MalformedLineError(reviews_path, lineno, expected, line, type(err).__name__ + f": {err}") from None
            users.append(user), items.append(item), times.append(ts)
    if not users:
        raise ValueError(f"{reviews_path} holds no reviews")
    wanted = set(items)
    item_category: dict[str, str] = {}
    expected = FORMATS["meta_Electronics.json"]
    with open(meta_path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            match = _ASIN.search(line)
            if match is None:
                raise MalformedLineError(meta_path, lineno, expected, line, "no 'asin'")
            if match.group(1) not in wanted:
                continue  # most meta lines are for items nobody in the 5-core set reviewed
            try:
                try:
                    meta = json.loads(line)
                except ValueError:
                    meta = ast.literal_eval(line.strip())
                if not isinstance(meta, dict):
                    raise TypeError("not a dict")
                paths = meta.get("categories") or []
                category = paths[-1][-1] if paths and paths[-1] else None
                if category is not None and not isinstance(category, str):
                    raise TypeError("categories must be lists of strings")
            except (ValueError, SyntaxError, TypeError, IndexError, MemoryError) as err:
                raise MalformedLineError(meta_path, lineno, expected, line, type(err).__name__ + f": {err}") from None
            if category is not None:
                item_category[meta["asin"]] = category
    return {"user": users, "item": items, "time": np.asarray(times, dtype=np.int64), "item_category": item_category}


# =========================================================================== sample building
def history_index(user: np.ndarray, seq_len: int, pad_side: str) -> tuple[np.ndarray, np.ndarray]:
    """For events sorted by (user, time): the indices (E, L) of each event's previous ``seq_len``
    events of the same user, oldest to newest, and the mask (E, L) of real entries.

    ``left`` padding puts the real entries last (the newest in the last column); ``right``
    puts them first. Masked entries hold index 0 (use the mask).
    """
    E = len(user)
    pos = np.arange(E)
    new = np.ones(E, dtype=bool)
    new[1:] = user[1:] != user[:-1]
    start = np.maximum.accumulate(np.where(new, pos, 0))
    n = np.minimum(pos - start, seq_len)  # earlier events available
    cols = np.arange(seq_len)
    if pad_side == "left":
        idx = pos[:, None] - seq_len + cols[None, :]
        mask = cols[None, :] >= (seq_len - n)[:, None]
    else:
        idx = (pos - n)[:, None] + cols[None, :]
        mask = cols[None, :] < n[:, None]
    return np.where(mask, idx, 0), mask


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
    pad_side: str,
    bucketize: Callable[[np.ndarray], np.ndarray],
    min_history: int,
    user_features: np.ndarray | None = None,
    negatives: int = 0,
    item_category: np.ndarray | None = None,
    rng: np.random.Generator | None = None,
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Samples from events sorted by (user, time, order): every event is a target with the user's
    previous events as its history. With ``negatives`` > 0 each event also yields that many
    samples (label 0) with the same history and time and a never-clicked target item (category
    from ``item_category``). Returns (columns, split codes 0/1/2).
    """
    hidx, hmask = history_index(user, seq_len, pad_side)
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
        reps = {k: np.repeat(v, negatives, axis=0) for k, v in cols.items()}
        candidates = np.unique(item)
        reps["target_item"] = sample_negatives(reps["user"], user, item, candidates, rng)
        reps["target_category"] = item_category[reps["target_item"]]
        reps["label"] = np.zeros_like(reps["label"])
        cols = {k: np.concatenate([cols[k], reps[k]]) for k in cols}
        t_split = np.concatenate([t_split, np.repeat(t_split, negatives)])
    return cols, t_split


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


def _subsample_users(user: np.ndarray, max_users: int | None, rng: np.random.Generator) -> np.ndarray:
    """Boolean mask of the events of a seeded random subset of ``max_users`` users (all if None)."""
    uniq = np.unique(user)
    if max_users is None or max_users >= len(uniq):
        return np.ones(len(user), dtype=bool)
    chosen = rng.choice(uniq, size=max_users, replace=False)
    return np.isin(user, chosen)


# =========================================================================== synthetic world
SYNTHETIC_PROFILE_CARDINALITIES = (2, 6, 8)  #: e.g. gender, age band, city tier


def _auc(labels: np.ndarray, scores: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(labels, scores)) if 0 < labels.sum() < len(labels) else float("nan")


def _gauc(labels: np.ndarray, scores: np.ndarray, groups: np.ndarray) -> float:
    """Impressions-weighted per-group AUC (ties: average rank), skipping one-class groups.

    The numpy twin of ``lightning_modules.metrics.group_auroc`` (data code does not import the
    training code); used for the synthetic ceiling, and tested against it.
    """
    if len(labels) == 0:
        return float("nan")
    order = np.lexsort((scores, groups))
    g, s, y = groups[order], scores[order], labels[order].astype(np.float64)
    n = len(g)
    idx = np.arange(n)
    new_g = np.r_[True, g[1:] != g[:-1]]
    gid = np.cumsum(new_g) - 1
    rank = idx - idx[new_g][gid] + 1.0
    new_r = new_g | np.r_[True, s[1:] != s[:-1]]
    rid = np.cumsum(new_r) - 1
    avg = (np.bincount(rid, rank) / np.bincount(rid))[rid]
    cnt, pos = np.bincount(gid), np.bincount(gid, y)
    rsum = np.bincount(gid, avg * y)
    neg = cnt - pos
    ok = (pos > 0) & (neg > 0)
    if not ok.any():
        return float("nan")
    auc = (rsum[ok] - pos[ok] * (pos[ok] + 1) / 2) / (pos[ok] * neg[ok])
    return float((auc * cnt[ok]).sum() / cnt[ok].sum())


def generate_synthetic(
    *,
    n_users: int,
    n_items: int,
    n_categories: int,
    n_samples: int,
    seq_len: int,
    min_history: int,
    seed: int,
    pad_side: str = "left",
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
    :func:`build_samples`) plus ``click_prob``, the true probability. Ids are 1-based (0 = padding).
    """
    rng = np.random.default_rng(seed)
    U, I, C, N, L = n_users, n_items, n_categories, n_samples, seq_len
    cards = SYNTHETIC_PROFILE_CARDINALITIES
    profile = np.stack([rng.integers(0, k, U) for k in cards], axis=1)  # (U, P), 0-based
    pref = sum(0.5 * rng.standard_normal((k, C))[profile[:, f]] for f, k in enumerate(cards))
    pref = pref + 0.9 * rng.standard_normal((U, C))
    probs = np.exp(pref - pref.max(1, keepdims=True))
    cdf = np.cumsum(probs / probs.sum(1, keepdims=True), axis=1)
    cdf[:, -1] = 1.0
    item_category = np.concatenate([np.arange(C), rng.integers(0, C, I - C)])
    item_bias = 0.3 * rng.standard_normal(I)
    by_cat = np.argsort(item_category, kind="stable")
    cat_start = np.searchsorted(item_category[by_cat], np.arange(C))
    cat_count = np.bincount(item_category, minlength=C)
    cycle = rng.permutation(C)
    complement = np.empty(C, dtype=np.int64)
    complement[cycle] = np.roll(cycle, -1)

    def draw_pref(users: np.ndarray) -> np.ndarray:
        return np.minimum((cdf[users] < rng.random(len(users))[:, None]).sum(1), C - 1)

    def draw_item(cats: np.ndarray) -> np.ndarray:
        return by_cat[cat_start[cats] + (rng.random(cats.shape) * cat_count[cats]).astype(np.int64)]

    user = rng.integers(0, U, N)
    length = rng.integers(min_history, L + 1, N)
    cats = np.empty((N, L), dtype=np.int64)  # column L-1 is the newest
    cats[:, 0] = draw_pref(user)
    for k in range(1, L):
        fresh = draw_pref(user)
        follow = rng.random(N) < 0.3
        cats[:, k] = np.where(follow, complement[cats[:, k - 1]], fresh)
    items = draw_item(cats)
    session = rng.random((N, L)) < 0.5
    gaps = np.where(session, rng.exponential(300.0, (N, L)), rng.exponential(2 * 86400.0, (N, L)))
    gaps = np.maximum(gaps.round(), 0).astype(np.int64)
    target_time = 1_500_000_000 + rng.integers(0, 60 * 86400, N)
    delta = np.cumsum(gaps[:, ::-1], axis=1)[:, ::-1]  # delta[:, L-1] = gap to the target
    times = target_time[:, None] - delta
    valid = np.arange(L)[None, :] >= (L - length)[:, None]  # left-aligned: newest last

    has_hist = length > 0
    newest = cats[:, L - 1]
    r = rng.random(N)
    back = (rng.random(N) * np.maximum(length, 1)).astype(np.int64)  # uniform over the real history
    hist_pick = cats[np.arange(N), L - 1 - back]
    target_cat = np.where(
        r < 0.3, draw_pref(user),
        np.where(r < 0.55, complement[newest], np.where(r < 0.75, hist_pick, rng.integers(0, C, N))),
    )
    target_cat = np.where(has_hist | (r < 0.3) | (r >= 0.75), target_cat, draw_pref(user))
    target_item = draw_item(target_cat)

    recency = np.exp(-delta / (3 * 86400.0)) * valid
    interest = (recency * (cats == target_cat[:, None])).sum(1)
    transition = has_hist * (complement[newest] == target_cat) * np.exp(-delta[:, L - 1] / 3600.0)
    logit = (-1.2 + 0.5 * pref[user, target_cat] + item_bias[target_item]
             + 2.0 * np.tanh(interest) + 2.5 * transition)
    click_prob = 1.0 / (1.0 + np.exp(-logit))
    label = (rng.random(N) < click_prob).astype(np.float32)

    if pad_side == "right":  # move the real entries to the front
        shift = (L - length)[:, None]
        src = (np.arange(L)[None, :] + shift) % L
        rows = np.arange(N)[:, None]
        cats, items, times, delta, valid = (a[rows, src] for a in (cats, items, times, delta, valid))
    bucketize = bucketize or (lambda d: bucketize_time_delta(d))
    cols = {
        "user": user + 1, "user_features": profile[user] + 1,
        "target_item": target_item + 1, "target_category": target_cat + 1, "label": label,
        "target_time": target_time,
        "hist_items": np.where(valid, items + 1, PAD), "hist_categories": np.where(valid, cats + 1, PAD),
        "hist_positions": np.where(valid, bucketize(np.where(valid, delta, 0)), PAD_BUCKET),
        "hist_times": np.where(valid, times, 0),
        "click_prob": click_prob.astype(np.float32),
    }
    return cols


# =========================================================================== torch side
class _Batches(Dataset):
    """In-memory columns served a whole batch at a time (``__getitems__``), as model-ready dicts."""

    def __init__(self, columns: dict[str, np.ndarray]) -> None:
        self.columns = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in columns.items()}
        self.length = len(self.columns["label"])

    def __len__(self) -> int:
        return self.length

    def __getitems__(self, indices) -> dict[str, torch.Tensor]:
        idx = torch.as_tensor(indices, dtype=torch.long)
        batch = {k: v[idx] for k, v in self.columns.items()}
        out = {k: v.long() for k, v in batch.items() if k != "label"}
        out["label"] = batch["label"].float()
        out["hist_mask"] = out["hist_items"] != PAD
        return out

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {k: v[0] for k, v in self.__getitems__([index]).items()}


def _pass_through(batch):
    """collate_fn for datasets that already return whole batches."""
    return batch


def _file_stats(folder: Path, names: Iterable[str]) -> list:
    return [(name, (folder / name).stat().st_size, (folder / name).stat().st_mtime_ns) for name in names]


# =========================================================================== DataModule
class BehaviorDataModule(LightningDataModule):
    """CTR samples with behaviour sequences from one of ``SOURCES`` (see the module docstring).

    Args:
        source: ``synthetic`` | ``movielens_1m`` | ``taobao_user_behavior`` | ``amazon_electronics``.
        data_dir: folder with the raw files (real sources); never committed to the repository.
        cache_dir: where preprocessed splits are cached; default ``$BEHAVIOR_CACHE_DIR`` or
            ``~/.cache/bst_behavior``.
        use_cache: read / write the cache (off: preprocess in memory every time).
        seq_len: behaviour sequence length L (the paper: 20).
        pad_side: ``left`` (the newest item last) | ``right``.
        min_history: drop samples with fewer history items (real sources; for ``synthetic`` the
            smallest generated history length).
        n_position_buckets: position-feature vocabulary, padding bucket 0 included.
        position_scheme: ``log`` (default) | ``linear`` (see :func:`bucketize_time_delta`).
        position_time_unit: seconds per unit of the bucketing (default 60: minutes).
        position_log_base: base of the log buckets.
        batch_size: the global batch size, split over the processes.
        eval_batch_size: global batch for val/test/predict (default: ``batch_size``).
        num_workers: DataLoader workers per process.
        pin_memory: pin host memory (useful on GPUs).
        seed: seeds the synthetic world, the split, negative sampling and user subsampling.
        synthetic_users, synthetic_items, synthetic_categories, synthetic_samples: sizes of the
            synthetic world.
        synthetic_val_fraction, synthetic_test_fraction: random split of the synthetic samples.
        positive_rating: MovieLens label = rating >= this.
        negatives_per_positive: sampled negatives per click (Taobao, Amazon).
        max_users: keep a seeded random subset of this many users (real sources).
        taobao_time_window: [start, end) unix seconds of the Taobao clicks kept (None: all).
        utc_offset_hours: the time zone of Taobao's day boundaries (UTC+8).
    """

    def __init__(
        self,
        source: str = "synthetic",
        data_dir: str | None = None,
        cache_dir: str | None = None,
        use_cache: bool = True,
        seq_len: int = 20,
        pad_side: str = "left",
        min_history: int = 1,
        n_position_buckets: int = 24,
        position_scheme: str = "log",
        position_time_unit: float = 60.0,
        position_log_base: float = 2.0,
        batch_size: int = 256,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        pin_memory: bool = False,
        seed: int = 0,
        synthetic_users: int = 2000,
        synthetic_items: int = 2000,
        synthetic_categories: int = 20,
        synthetic_samples: int = 100_000,
        synthetic_val_fraction: float = 0.1,
        synthetic_test_fraction: float = 0.1,
        positive_rating: int = 4,
        negatives_per_positive: int = 1,
        max_users: int | None = None,
        taobao_time_window: tuple[int, int] | None = TAOBAO_TIME_WINDOW,
        utc_offset_hours: float = 8.0,
    ) -> None:
        super().__init__()
        _choice("source", source, SOURCES)
        _choice("pad_side", pad_side, PAD_SIDES)
        _choice("position_scheme", position_scheme, POSITION_SCHEMES)
        _positive(seq_len=seq_len, batch_size=batch_size, position_time_unit=position_time_unit,
                  negatives_per_positive=negatives_per_positive, synthetic_users=synthetic_users,
                  synthetic_items=synthetic_items, synthetic_categories=synthetic_categories,
                  synthetic_samples=synthetic_samples)
        if eval_batch_size is not None:
            _positive(eval_batch_size=eval_batch_size)
        if max_users is not None:
            _positive(max_users=max_users)
        if not isinstance(n_position_buckets, int) or n_position_buckets < 3:
            raise ValueError(f"n_position_buckets={n_position_buckets!r} must be an int >= 3 (0 padding, 1 delta 0, more)")
        if position_scheme == "log" and position_log_base <= 1:
            raise ValueError(f"position_log_base={position_log_base!r} must be > 1")
        if not 0 <= min_history <= seq_len:
            raise ValueError(f"min_history={min_history!r} must be in [0, seq_len={seq_len}]")
        if num_workers < 0:
            raise ValueError(f"num_workers={num_workers!r} must be >= 0")
        if synthetic_items < synthetic_categories:
            raise ValueError(
                f"synthetic_items={synthetic_items} must be >= synthetic_categories={synthetic_categories} "
                "(every category needs an item)"
            )
        if synthetic_categories < 2:
            raise ValueError(f"synthetic_categories={synthetic_categories!r} must be >= 2")
        for name, value in (("synthetic_val_fraction", synthetic_val_fraction),
                            ("synthetic_test_fraction", synthetic_test_fraction)):
            if not 0.0 < value < 1.0:
                raise ValueError(f"{name}={value!r} must be in (0, 1)")
        if synthetic_val_fraction + synthetic_test_fraction >= 1.0:
            raise ValueError("synthetic_val_fraction + synthetic_test_fraction must be < 1")
        if taobao_time_window is not None and taobao_time_window[0] >= taobao_time_window[1]:
            raise ValueError(f"taobao_time_window={list(taobao_time_window)!r} must be [start, end) with start < end")
        if source != "synthetic" and data_dir is None:
            raise DatasetMissingError(
                f"source={source!r} needs data_dir, a folder with {', '.join(REQUIRED_FILES[source])}; "
                f"download: {DOWNLOAD[source]}"
            )
        self.save_hyperparameters()
        self.source = source
        self.data_dir = data_dir
        self.seq_len = seq_len
        self.pad_side = pad_side
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.per_device_batch_size: int | None = None
        self.per_device_eval_batch_size: int | None = None
        self.cache_status: str | None = None  #: "built", "loaded" or "in_memory" after preparation
        self.cache_path: Path | None = None
        self._meta: dict | None = None
        self._splits: dict | None = None  # HF datasets per split
        self._tensors: dict[str, _Batches] = {}

    # ------------------------------------------------------------------ positions
    def bucketize(self, delta: np.ndarray) -> np.ndarray:
        """This module's position buckets of time deltas in seconds (see :func:`bucketize_time_delta`)."""
        h = self.hparams
        return bucketize_time_delta(delta, n_buckets=h.n_position_buckets, scheme=h.position_scheme,
                                    time_unit=h.position_time_unit, log_base=h.position_log_base)

    # ------------------------------------------------------------------ caching
    def _preprocessing_params(self) -> dict:
        h = dict(self.hparams)
        for key in ("cache_dir", "use_cache", "batch_size", "eval_batch_size", "num_workers", "pin_memory", "data_dir"):
            h.pop(key, None)
        if self.source == "synthetic":
            h = {k: v for k, v in h.items() if not k.startswith(("positive_", "negatives_", "max_users", "taobao_", "utc_"))}
        else:
            h = {k: v for k, v in h.items() if not k.startswith("synthetic_")}
        h["taobao_time_window"] = list(h["taobao_time_window"]) if h.get("taobao_time_window") else None
        return h

    def cache_key(self) -> str:
        """Hash of the cache version, the preprocessing parameters and the source files' size and mtime."""
        files = []
        if self.source != "synthetic":
            folder = _require_files(self.source, self.data_dir)
            files = _file_stats(folder, REQUIRED_FILES[self.source])
        blob = json.dumps({"version": CACHE_VERSION, "params": self._preprocessing_params(), "files": files},
                          sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def _cache_root(self) -> Path:
        root = self.hparams.cache_dir or os.environ.get("BEHAVIOR_CACHE_DIR") or "~/.cache/bst_behavior"
        return Path(root).expanduser()

    def _ensure_prepared(self) -> None:
        """Load the cached splits, or preprocess (and cache) them; idempotent."""
        if self._splits is not None:
            return
        if not self.hparams.use_cache:
            columns, split, meta = self.preprocess()
            self._splits, self._meta = _to_hf(columns, split), meta
            self.cache_status = "in_memory"
            return
        path = self._cache_root() / f"{self.source}-{self.cache_key()}"
        self.cache_path = path
        if (path / "meta.json").is_file():
            self.cache_status = "loaded"
        else:
            columns, split, meta = self.preprocess()
            _save_atomically(path, _to_hf(columns, split), meta)
            self.cache_status = "built"
        self._splits, self._meta = _load(path)

    def prepare_data(self) -> None:
        """Preprocess into the cache once (Lightning calls this on one process per node)."""
        self._ensure_prepared()

    # ------------------------------------------------------------------ preprocessing
    def preprocess(self) -> tuple[dict[str, np.ndarray], np.ndarray, dict]:
        """Read the raw source and build every sample: (columns, split codes, meta)."""
        h = self.hparams
        start = time.perf_counter()
        rng = np.random.default_rng(h.seed)
        common = dict(seq_len=h.seq_len, pad_side=h.pad_side, bucketize=self.bucketize, min_history=h.min_history)
        meta: dict = {"source": self.source}
        if self.source == "synthetic":
            columns = generate_synthetic(
                n_users=h.synthetic_users, n_items=h.synthetic_items, n_categories=h.synthetic_categories,
                n_samples=h.synthetic_samples, seq_len=h.seq_len, min_history=h.min_history, seed=h.seed,
                pad_side=h.pad_side, bucketize=self.bucketize,
            )
            n = len(columns["label"])
            split_rng = np.random.default_rng([h.seed, 1])
            u = split_rng.random(n)
            split = np.where(u < h.synthetic_test_fraction, 2,
                             np.where(u < h.synthetic_test_fraction + h.synthetic_val_fraction, 1, 0))
            sizes = {"n_users": h.synthetic_users + 1, "n_items": h.synthetic_items + 1,
                     "n_categories": h.synthetic_categories + 1,
                     "profile_sizes": [k + 1 for k in SYNTHETIC_PROFILE_CARDINALITIES]}
            ceiling = {}
            for code, name in enumerate(SPLITS):
                m = split == code
                ceiling[f"{name}_auc"] = _auc(columns["label"][m], columns["click_prob"][m])
                ceiling[f"{name}_gauc"] = _gauc(columns["label"][m], columns["click_prob"][m], columns["user"][m])
                ceiling[f"{name}_logloss"] = _logloss(columns["label"][m], columns["click_prob"][m])
            meta["ceiling"] = ceiling
        elif self.source == "movielens_1m":
            ev = read_movielens_1m(self.data_dir)
            keep = _subsample_users(ev["user"], h.max_users, rng)
            ev = {k: (v[keep] if isinstance(v, np.ndarray) and v.shape == ev["user"].shape else v) for k, v in ev.items()}
            label = (ev["rating"] >= h.positive_rating).astype(np.float32)
            columns, split = build_samples(
                user=ev["user"], item=ev["item"], category=ev["category"], time=ev["time"], label=label,
                split=per_user_last_split(ev["user"]), user_features=ev["user_features"], **common,
            )
            sizes = {k: ev[k] for k in ("n_users", "n_items", "n_categories", "profile_sizes")}
            meta["raw"] = {"ratings": int(len(ev["user"]))}
        elif self.source == "taobao_user_behavior":
            ev = read_user_behavior(self.data_dir, time_window=h.taobao_time_window)
            if ev["clicks"] == 0:
                raise ValueError(f"no clicks (pv) in {self.data_dir}/UserBehavior.csv inside taobao_time_window={h.taobao_time_window}")
            keep = _subsample_users(ev["user"], h.max_users, rng)
            user_map, item_map, cat_map = (np.unique(ev[k][keep]) for k in ("user", "item", "category"))
            user = np.searchsorted(user_map, ev["user"][keep]) + 1
            item = np.searchsorted(item_map, ev["item"][keep]) + 1
            category = np.searchsorted(cat_map, ev["category"][keep]) + 1
            ts = ev["time"][keep]
            item_category = np.zeros(len(item_map) + 1, dtype=np.int64)
            item_category[item] = category  # an item listed under several categories keeps its last
            category = item_category[item]
            day = (ts + int(h.utc_offset_hours * 3600)) // 86400
            last_day = day.max()
            split = np.where(day == last_day, 2, np.where(day == last_day - 1, 1, 0))
            columns, split = build_samples(
                user=user, item=item, category=category, time=ts, label=np.ones(len(user), np.float32),
                split=split, negatives=h.negatives_per_positive, item_category=item_category, rng=rng, **common,
            )
            sizes = {"n_users": len(user_map) + 1, "n_items": len(item_map) + 1, "n_categories": len(cat_map) + 1}
            meta["raw"] = {"rows": ev["rows"], "clicks_in_window": ev["clicks"], "last_day_utc_offset": h.utc_offset_hours}
        else:  # amazon_electronics
            ev = read_amazon_electronics(self.data_dir)
            users = np.asarray(ev["user"])
            uniq_users, user = np.unique(users, return_inverse=True)
            uniq_items, item = np.unique(np.asarray(ev["item"]), return_inverse=True)
            user, item = user + 1, item + 1
            cat_names = sorted(set(ev["item_category"].values()))
            cat_id = {c: i + 1 for i, c in enumerate(cat_names)}
            item_category = np.zeros(len(uniq_items) + 1, dtype=np.int64)
            item_category[1:] = [cat_id.get(ev["item_category"].get(a), PAD) for a in uniq_items]
            ts = ev["time"]
            keep = _subsample_users(user, h.max_users, rng)
            user, item, ts = user[keep], item[keep], ts[keep]
            order = np.lexsort((np.arange(len(user)), ts, user))
            user, item, ts = user[order], item[order], ts[order]
            columns, split = build_samples(
                user=user, item=item, category=item_category[item], time=ts, label=np.ones(len(user), np.float32),
                split=per_user_last_split(user), negatives=h.negatives_per_positive,
                item_category=item_category, rng=rng, **common,
            )
            sizes = {"n_users": len(uniq_users) + 1, "n_items": len(uniq_items) + 1, "n_categories": len(cat_names) + 1}
            meta["raw"] = {"reviews": int(len(users)), "items_with_category": len(ev["item_category"])}
        if len(columns["label"]) == 0:
            raise ValueError(f"source={self.source!r} produced no samples (min_history={h.min_history}?)")
        sizes["n_position_buckets"] = h.n_position_buckets
        sizes["seq_len"] = h.seq_len
        meta["feature_sizes"] = sizes
        meta["n_profile_fields"] = len(sizes.get("profile_sizes", []))
        meta["preprocess_seconds"] = round(time.perf_counter() - start, 3)
        meta["params"] = self._preprocessing_params()
        meta["splits"] = {
            name: {"samples": int((split == code).sum()),
                   "positive_rate": float(columns["label"][split == code].mean()) if (split == code).any() else None,
                   "users": int(len(np.unique(columns["user"][split == code])))}
            for code, name in enumerate(SPLITS)
        }
        return columns, split, meta

    # ------------------------------------------------------------------ Lightning hooks
    def setup(self, stage: str | None = None) -> None:
        world_size = self.trainer.world_size if self.trainer is not None else 1
        for name, value in (("batch_size", self.batch_size), ("eval_batch_size", self.eval_batch_size)):
            if value % world_size:
                raise ValueError(
                    f"{name}={value} is the global batch and must be divisible by the {world_size} processes"
                )
        self.per_device_batch_size = self.batch_size // world_size
        self.per_device_eval_batch_size = self.eval_batch_size // world_size
        self._ensure_prepared()
        for name in SPLITS:
            if name not in self._tensors:
                self._tensors[name] = _Batches(_columns(self._splits[name], BATCH_COLUMNS, self.n_profile_fields))

    def _loader(self, split: str, train: bool) -> DataLoader:
        if split not in self._tensors:
            raise RuntimeError("call setup() before asking for a DataLoader")
        workers = self.hparams.num_workers
        return DataLoader(
            self._tensors[split],
            batch_size=self.per_device_batch_size if train else self.per_device_eval_batch_size,
            shuffle=train,
            drop_last=train and len(self._tensors[split]) > self.per_device_batch_size,
            num_workers=workers,
            persistent_workers=workers > 0,
            pin_memory=self.hparams.pin_memory,
            collate_fn=_pass_through,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", train=False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader("test", train=False)

    # ------------------------------------------------------------------ what the nets and reports need
    @property
    def feature_sizes(self) -> dict:
        """Vocabulary sizes (id 0 included) and lengths, by the nets' keyword names:
        ``n_users``, ``n_items``, ``n_categories``, ``profile_sizes`` (if the source has a
        profile), ``n_position_buckets``, ``seq_len``. Prepares the data on first access."""
        self._ensure_prepared()
        return dict(self._meta["feature_sizes"])

    @property
    def n_profile_fields(self) -> int:
        self._ensure_prepared()
        return int(self._meta["n_profile_fields"])

    @property
    def ceiling(self) -> dict | None:
        """Synthetic only: AUC / GAUC / logloss of the true click probabilities per split."""
        self._ensure_prepared()
        return self._meta.get("ceiling")

    @property
    def ceiling_auc(self) -> float | None:
        """Synthetic only: the test AUC of the true click probabilities (the best reachable)."""
        return None if self.ceiling is None else self.ceiling["test_auc"]

    def split_dataset(self, split: str):
        """The preprocessed HF dataset of a split (all columns, incl. ``target_time``, ``hist_times``)."""
        _choice("split", split, SPLITS)
        self._ensure_prepared()
        return self._splits[split]

    def example_batch(self, n: int = 1) -> dict[str, torch.Tensor]:
        """The first ``n`` training samples as a batch (for FLOP counting and smoke checks)."""
        if "train" not in self._tensors:
            self._ensure_prepared()
            self._tensors["train"] = _Batches(_columns(self._splits["train"], BATCH_COLUMNS, self.n_profile_fields))
        data = self._tensors["train"]
        return data.__getitems__(list(range(min(n, len(data)))))

    def describe(self) -> dict:
        """What the results file records about the data."""
        self._ensure_prepared()
        h = self.hparams
        out = {
            "class": type(self).__name__,
            "source": self.source,
            "data_dir": self.data_dir,
            "seq_len": h.seq_len,
            "pad_side": h.pad_side,
            "min_history": h.min_history,
            "position": {"scheme": h.position_scheme, "n_buckets": h.n_position_buckets,
                         "time_unit_s": h.position_time_unit, "log_base": h.position_log_base,
                         "padding_bucket": PAD_BUCKET, "zero_delta_bucket": ZERO_DELTA_BUCKET},
            "feature_sizes": self._meta["feature_sizes"],
            "splits": self._meta["splits"],
            "ceiling": self._meta.get("ceiling"),
            "batch_size": self.batch_size,
            "per_device_batch_size": self.per_device_batch_size,
            "seed": h.seed,
            "cache": {"path": None if self.cache_path is None else str(self.cache_path), "status": self.cache_status},
            "preprocess_seconds": self._meta.get("preprocess_seconds"),
        }
        if self.source == "synthetic":
            out["synthetic"] = {k: h[k] for k in h if k.startswith("synthetic_")}
        else:
            out["raw"] = self._meta.get("raw")
            if self.source == "movielens_1m":
                out["positive_rating"] = h.positive_rating
            else:
                out["negatives_per_positive"] = h.negatives_per_positive
            out["max_users"] = h.max_users
        return out


# =========================================================================== helpers
def _choice(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not one of {list(allowed)}")


def _positive(**values) -> None:
    for name, value in values.items():
        if not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"{name}={value!r} must be positive")


def _logloss(labels: np.ndarray, probs: np.ndarray) -> float:
    p = np.clip(probs.astype(np.float64), 1e-7, 1 - 1e-7)
    return float(-(labels * np.log(p) + (1 - labels) * np.log1p(-p)).mean()) if len(labels) else float("nan")


_INT32_COLUMNS = ("user", "user_features", "target_item", "target_category", "hist_items", "hist_categories",
                  "hist_positions")


def _to_hf(columns: dict[str, np.ndarray], split: np.ndarray):
    """Numpy columns -> a DatasetDict with one Dataset per split (fixed-length list columns)."""
    import pyarrow as pa
    from datasets import Dataset, DatasetDict

    out = {}
    for code, name in enumerate(SPLITS):
        m = split == code
        arrays = {}
        for key, values in columns.items():
            v = values[m]
            if key in _INT32_COLUMNS:
                v = v.astype(np.int32)
            elif key in ("label", "click_prob"):
                v = v.astype(np.float32)
            else:
                v = v.astype(np.int64)
            if v.ndim == 2:
                if v.shape[1] == 0:
                    continue
                arrays[key] = pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1)), v.shape[1])
            else:
                arrays[key] = pa.array(v)
        out[name] = Dataset(pa.table(arrays))
    return DatasetDict(out)


def _columns(dataset, names: Iterable[str], n_profile: int) -> dict[str, np.ndarray]:
    """Columns of an HF dataset as in-memory numpy arrays (2-D for fixed-length lists)."""
    import pyarrow as pa

    table = dataset.data
    n = dataset.num_rows
    out = {}
    for name in names:
        if name not in table.column_names:
            if name == "user_features":
                out[name] = np.zeros((n, n_profile), dtype=np.int32)
                continue
            raise KeyError(f"column {name!r} missing from the cached data")
        column = table.column(name).combine_chunks()
        if pa.types.is_fixed_size_list(column.type):
            width = column.type.list_size
            values = column.flatten().to_numpy(zero_copy_only=False).reshape(n, width)
        else:
            values = column.to_numpy(zero_copy_only=False)
        out[name] = np.array(values)  # a writable in-memory copy (the cache is memory-mapped)
    return out


def _save_atomically(path: Path, splits, meta: dict) -> None:
    """Write the splits and meta.json to a temporary folder beside ``path``, then rename it."""
    import datasets

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        bars = datasets.is_progress_bar_enabled()
        datasets.disable_progress_bars()
        try:
            splits.save_to_disk(str(tmp / "splits"))
        finally:
            if bars:
                datasets.enable_progress_bars()
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True, default=_json_default))
        try:
            os.rename(tmp, path)
        except OSError:
            if not (path / "meta.json").is_file():  # not another process finishing first: a real error
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _load(path: Path):
    from datasets import load_from_disk

    meta = json.loads((path / "meta.json").read_text())
    splits = load_from_disk(str(path / "splits"))
    return splits, meta

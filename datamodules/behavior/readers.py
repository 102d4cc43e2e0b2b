"""Readers of the real sources' raw files, with errors that name the file, the line and the format.

- :func:`read_movielens_1m`: ``ratings.dat``, ``users.dat``, ``movies.dat`` (``::``-separated,
  latin-1); ids mapped to 1..n.
- :func:`read_user_behavior`: Taobao's ``UserBehavior.csv`` (about 100M rows: pandas chunks on
  the fast path, a line-by-line scan to report the first bad line); raw ids.
- :func:`read_amazon_electronics`: the 5-core Electronics reviews and their meta data, JSON or
  Python dict literals per line (DIN's layout); raw string ids.

Each source's files and where to download them are a :class:`RawFiles`; a missing folder or
file raises :class:`DatasetMissingError` (with the download address), a line that does not match
the documented format (``FORMATS``) raises :class:`MalformedLineError` (``path, line N``).
"""

from __future__ import annotations

import ast
import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from models.ctr import PAD

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


@dataclass(frozen=True)
class RawFiles:
    """The raw files a source reads from its ``data_dir``, and where to download them."""

    source: str
    names: tuple[str, ...]
    download: str

    def require(self, data_dir: str | os.PathLike | None) -> Path:
        """The folder holding every file, or :class:`DatasetMissingError` saying what is missing and where to get it."""
        files = ", ".join(self.names)
        if data_dir is None:
            raise DatasetMissingError(
                f"source={self.source!r} needs data_dir, a folder with {files}; download: {self.download}"
            )
        folder = Path(data_dir).expanduser()
        if not folder.is_dir():
            raise DatasetMissingError(
                f"source={self.source!r}: data_dir {str(folder)!r} does not exist (looked for {files} in it); "
                f"download: {self.download}"
            )
        missing = [name for name in self.names if not (folder / name).is_file()]
        if missing:
            raise DatasetMissingError(
                f"source={self.source!r}: missing {', '.join(missing)} in {str(folder)!r} "
                f"(needs {files}); download: {self.download}"
            )
        return folder


MOVIELENS_1M_FILES = RawFiles(
    "movielens_1m", ("ratings.dat", "users.dat", "movies.dat"),
    "https://files.grouplens.org/datasets/movielens/ml-1m.zip (unzip; data_dir = the ml-1m folder)",
)
TAOBAO_FILES = RawFiles(
    "taobao_user_behavior", ("UserBehavior.csv",),
    "Tianchi dataset 649, https://tianchi.aliyun.com/dataset/649 (UserBehavior.csv.zip; sign-in required)",
)
AMAZON_ELECTRONICS_FILES = RawFiles(
    "amazon_electronics", ("reviews_Electronics_5.json", "meta_Electronics.json"),
    "the McAuley lab Amazon 2014 page, https://jmcauley.ucsd.edu/data/amazon/ "
    "(reviews_Electronics_5.json.gz and meta_Electronics.json.gz; gunzip both)",
)


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
    folder = MOVIELENS_1M_FILES.require(data_dir)
    movie_genre = _read_movies(folder / "movies.dat")
    profiles = _read_users(folder / "users.dat")
    raw_user, raw_movie, rating, ts = _read_ratings(folder / "ratings.dat")

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


def _read_movies(path: Path) -> dict[int, str]:
    """MovieID -> its first listed genre."""
    movie_genre: dict[int, str] = {}
    for lineno, (movie, _title, genres), text in _split_lines(path, "::", 3):
        try:
            movie_id = int(movie)
        except ValueError:
            raise MalformedLineError(path, lineno, FORMATS["movies.dat"], text, "MovieID is not an integer") from None
        movie_genre[movie_id] = genres.split("|")[0].strip()
    return movie_genre


def _read_users(path: Path) -> dict[int, tuple[str, str, str, str]]:
    """UserID -> (gender, age, occupation, first character of the zip code)."""
    profiles: dict[int, tuple[str, str, str, str]] = {}
    for lineno, (user, gender, age, occupation, zipcode), text in _split_lines(path, "::", 5):
        try:
            user_id = int(user)
            int(age), int(occupation)
        except ValueError:
            raise MalformedLineError(path, lineno, FORMATS["users.dat"], text, "UserID, Age and Occupation must be integers") from None
        profiles[user_id] = (gender.strip(), age.strip(), occupation.strip(), zipcode.strip()[:1])
    return profiles


def _read_ratings(path: Path) -> np.ndarray:
    """(4, E) int64: raw user, movie, rating, timestamp, in file order."""
    rows = []
    for lineno, fields, text in _split_lines(path, "::", 4):
        try:
            rows.append(tuple(int(x) for x in fields))
        except ValueError:
            raise MalformedLineError(path, lineno, FORMATS["ratings.dat"], text, "not all integers") from None
    if not rows:
        raise ValueError(f"{path} holds no ratings")
    return np.asarray(rows, dtype=np.int64).T


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

    folder = TAOBAO_FILES.require(data_dir)
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
    folder = AMAZON_ELECTRONICS_FILES.require(data_dir)
    users, items, times = _read_reviews(folder / "reviews_Electronics_5.json")
    item_category = _read_meta_categories(folder / "meta_Electronics.json", wanted=set(items))
    return {"user": users, "item": items, "time": np.asarray(times, dtype=np.int64), "item_category": item_category}


def _read_reviews(path: Path) -> tuple[list[str], list[str], list[int]]:
    """reviewerID, asin and unixReviewTime of every review, in file order."""
    users, items, times = [], [], []
    expected = FORMATS["reviews_Electronics_5.json"]
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                review = json.loads(line)
                user, item, ts = review["reviewerID"], review["asin"], int(review["unixReviewTime"])
                if not isinstance(user, str) or not isinstance(item, str):
                    raise TypeError("ids must be strings")
            except (ValueError, KeyError, TypeError) as err:
                raise MalformedLineError(path, lineno, expected, line, type(err).__name__ + f": {err}") from None
            users.append(user), items.append(item), times.append(ts)
    if not users:
        raise ValueError(f"{path} holds no reviews")
    return users, items, times


def _read_meta_categories(path: Path, wanted: set[str]) -> dict[str, str]:
    """asin -> the last entry of its last category path, for the ``wanted`` items with one.

    Lines of other items are only matched for their asin, not parsed (most meta lines are for
    items nobody in the 5-core set reviewed)."""
    item_category: dict[str, str] = {}
    expected = FORMATS["meta_Electronics.json"]
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            match = _ASIN.search(line)
            if match is None:
                raise MalformedLineError(path, lineno, expected, line, "no 'asin'")
            if match.group(1) not in wanted:
                continue
            try:
                meta, category = _meta_category(line)
            except (ValueError, SyntaxError, TypeError, IndexError, MemoryError) as err:
                raise MalformedLineError(path, lineno, expected, line, type(err).__name__ + f": {err}") from None
            if category is not None:
                item_category[meta["asin"]] = category
    return item_category


def _meta_category(line: str) -> tuple[dict, str | None]:
    """(the parsed dict, its category or None) of one meta line, a JSON object or a Python dict literal."""
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
    return meta, category

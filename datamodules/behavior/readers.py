"""Readers of the real sources' raw files, with errors that name the file, the line and the format.

- :func:`read_movielens_1m`: ``ratings.dat``, ``users.dat``, ``movies.dat`` (``::``-separated,
  latin-1, or UTF-8); ids mapped to 1..n.
- :func:`read_movielens_csv`: the MovieLens CSV family (ml-latest-small, ml-latest, ml-20m,
  ml-25m, ml-32m): ``ratings.csv``, ``movies.csv`` and the optional ``tags.csv``, with headers,
  UTF-8 (latin-1 when a file does not decode as UTF-8); no profile. Ids mapped to 1..n as for
  ml-1m.
- :func:`read_user_behavior`: Taobao's ``UserBehavior.csv`` (about 100M rows: pandas chunks on
  the fast path, a line-by-line scan to report the first bad line); raw ids.
- :func:`read_amazon_electronics`: the 5-core Electronics reviews and their meta data, JSON or
  Python dict literals per line (DIN's layout); raw string ids.

Each source's files and where to download them are a :class:`RawFiles`; a missing folder or
file raises :class:`DatasetMissingError` (with the download address), a line that does not match
the documented format (``FORMATS``) raises :class:`MalformedLineError` (``path, line N``).

Both MovieLens formats open their files the same way (:func:`open_text`): UTF-8 if the whole file
decodes as UTF-8, else latin-1, and a UTF-8 byte-order mark at the start is dropped in either case.
"""

from __future__ import annotations

import ast
import codecs
import csv
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from models.ctr_batch import PAD

FORMATS = {
    "ratings.dat": "UserID::MovieID::Rating::Timestamp (integers, latin-1 or UTF-8)",
    "users.dat": "UserID::Gender::Age::Occupation::Zip-code (latin-1 or UTF-8)",
    "movies.dat": "MovieID::Title::Genres with Genres separated by '|' (latin-1 or UTF-8)",
    "ratings.csv": "the header userId,movieId,rating,timestamp, then integers except rating, a number in 0.5 steps "
                   "from 0.5 to 5 (UTF-8 or latin-1)",
    "movies.csv": "the header movieId,title,genres, then CSV rows (a title with a comma in double quotes), "
                  "movieId an integer, genres separated by '|' or '(no genres listed)' (UTF-8 or latin-1)",
    "tags.csv": "the header userId,movieId,tag,timestamp, then CSV rows, integers except tag (UTF-8 or latin-1)",
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
    """The raw files a source reads from its ``data_dir`` (``names`` required, ``optional`` read
    when present), and where to download them."""

    source: str
    names: tuple[str, ...]
    download: str
    optional: tuple[str, ...] = ()

    def present(self, folder: Path) -> tuple[str, ...]:
        """The required files and the optional ones ``folder`` holds: what the reader reads and
        the cache key tracks."""
        return self.names + tuple(name for name in self.optional if (folder / name).is_file())

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
MOVIELENS_CSV_FILES = RawFiles(
    "movielens_csv", ("ratings.csv", "movies.csv"),
    "the GroupLens MovieLens page, https://grouplens.org/datasets/movielens/ (the CSV family: ml-latest-small, "
    "ml-latest, ml-20m, ml-25m, ml-32m; e.g. https://files.grouplens.org/datasets/movielens/ml-latest-small.zip; "
    "unzip; data_dir = the unzipped folder)",
    optional=("tags.csv",),
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


def _split_lines(path: Path, sep: str, n_fields: int, encoding: str | None = None):
    """Yield (lineno, fields) of a separator-delimited file; blank lines are skipped. ``encoding``
    None: :func:`text_encoding`'s (latin-1 for ml-1m's files, which are not all valid UTF-8)."""
    expected = FORMATS[path.name] if path.name in FORMATS else f"{n_fields} fields separated by {sep!r}"
    with open_text(path, encoding) as f:
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
    ``item_category`` (n_items + 1,) category per item id; ``user_features`` (n_users + 1, 4)
    profile table indexed by user id (row 0 = unknown); ``n_users``, ``n_items``,
    ``n_categories``, ``profile_sizes`` (vocabulary sizes, id 0 included); ``counts`` of the raw
    files.
    """
    folder = MOVIELENS_1M_FILES.require(data_dir)
    movie_genre = _read_movies(folder / "movies.dat")
    profiles = _read_users(folder / "users.dat")
    raw_user, raw_movie, rating, ts = _read_ratings(folder / "ratings.dat")
    out = _movielens_ids(raw_user, raw_movie, rating, ts, movie_genre)

    field_maps = [_vocab(p[f] for p in profiles.values()) for f in range(4)]
    user_features = np.zeros((out["n_users"], 4), dtype=np.int64)
    for user_id, uid in out.pop("user_map").items():
        if user_id in profiles:
            user_features[uid] = [field_maps[f][profiles[user_id][f]] for f in range(4)]
    return {**out, "user_features": user_features, "profile_sizes": [len(m) + 1 for m in field_maps],
            "counts": {"movies": len(movie_genre), "users_with_profile": len(profiles)}}


def read_movielens_csv(data_dir: str | os.PathLike) -> dict:
    """Parse a folder of the MovieLens CSV family (ml-latest-small, ml-latest, ml-20m, ml-25m, ml-32m).

    ``ratings.csv`` (ratings in 0.5 steps), ``movies.csv`` (the category is the first listed
    genre; ``(no genres listed)`` is category 0, unknown) and, when present, ``tags.csv`` (read
    and checked, then only counted: tags are no model feature). Each file is read as UTF-8, or
    as latin-1 when it does not decode as UTF-8 (older copies were re-encoded). The family has
    no demographics, so there is no profile. Returns the keys of :func:`read_movielens_1m` with
    ``user_features`` None, ``profile_sizes`` [] and ``rating`` float64; ``counts`` holds the
    movies and tags read (``tags`` None without ``tags.csv``).
    """
    folder = MOVIELENS_CSV_FILES.require(data_dir)
    movie_genre = _read_movies_csv(folder / "movies.csv")
    raw_user, raw_movie, rating, ts = _read_ratings_csv(folder / "ratings.csv")
    tags = _count_tags_csv(folder / "tags.csv") if (folder / "tags.csv").is_file() else None
    out = _movielens_ids(raw_user, raw_movie, rating, ts, movie_genre)
    del out["user_map"]
    return {**out, "user_features": None, "profile_sizes": [], "counts": {"movies": len(movie_genre), "tags": tags}}


def _movielens_ids(raw_user: np.ndarray, raw_movie: np.ndarray, rating: np.ndarray, ts: np.ndarray,
                   movie_genre: dict[int, str | None]) -> dict:
    """Ids 1..n (users rated; movies listed or rated; first genres) and the events sorted by
    (user, time, file order).

    A movie that is rated but not listed, or listed without a genre, has category 0 (unknown).
    """
    user_map = _vocab(np.unique(raw_user).tolist())
    item_map = _vocab(set(movie_genre) | set(np.unique(raw_movie).tolist()))
    genre_map = _vocab(g for g in movie_genre.values() if g is not None)
    item_category = np.zeros(len(item_map) + 1, dtype=np.int64)
    for movie_id, item_id in item_map.items():
        item_category[item_id] = genre_map.get(movie_genre.get(movie_id), PAD)
    user = _map_array(raw_user, user_map)
    item = _map_array(raw_movie, item_map)
    order = np.lexsort((np.arange(len(user)), ts, user))  # user, then time, then file order
    return {
        "user": user[order], "item": item[order], "category": item_category[item[order]],
        "time": ts[order], "rating": rating[order], "item_category": item_category, "user_map": user_map,
        "n_users": len(user_map) + 1, "n_items": len(item_map) + 1, "n_categories": len(genre_map) + 1,
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


# ----------------------------------------------------------------------------- the MovieLens CSV family
RATINGS_CSV_HEADER = ("userId", "movieId", "rating", "timestamp")
MOVIES_CSV_HEADER = ("movieId", "title", "genres")
TAGS_CSV_HEADER = ("userId", "movieId", "tag", "timestamp")
NO_GENRES = "(no genres listed)"


def text_encoding(path: Path, block: int = 1 << 24) -> str:
    """``utf-8-sig`` (UTF-8, a byte-order mark dropped) if the whole file decodes as UTF-8, else
    ``latin-1``, which decodes any bytes (a file re-encoded by an older tool stays readable)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    with open(path, "rb") as f:
        try:
            for chunk in iter(lambda: f.read(block), b""):
                decoder.decode(chunk)
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            return "latin-1"
    return "utf-8-sig"


def open_text(path: Path, encoding: str | None = None) -> IO[str]:
    """``path`` opened as text for reading (``newline=""``, for csv) in ``encoding`` (None:
    :func:`text_encoding`'s), positioned after a UTF-8 byte-order mark if the file starts with one:
    ``utf-8-sig`` drops it itself; in latin-1 (a mark before bytes that are not UTF-8) it would be
    the three characters 'ï»¿' glued to the first field."""
    encoding = encoding or text_encoding(path)
    f = open(path, encoding=encoding, newline="")
    if codecs.lookup(encoding).name != "utf-8-sig":
        try:
            mark = codecs.BOM_UTF8.decode(encoding)
        except UnicodeDecodeError:  # an encoding that cannot hold the mark: there is none to drop
            return f
        if f.read(len(mark)) != mark:
            f.seek(0)
    return f


def _csv_rows(path: Path, header: tuple[str, ...], check: Callable[[list[str]], object] | None = None,
              encoding: str | None = None) -> Iterator[tuple[int, list[str]]]:
    """Yield (line number, fields) of each row after ``header``; blank lines are skipped.

    Uses the csv module, so a quoted field may hold commas. A wrong header, a row with another
    number of fields, or a row ``check`` rejects (a ValueError saying why) raises
    :class:`MalformedLineError` with the line number (of the row's last line, for a quoted field
    spanning lines). ``encoding`` None: :func:`text_encoding`'s.
    """
    expected = FORMATS[path.name]
    with open_text(path, encoding) as f:
        reader = csv.reader(f)
        first = next(reader, None)
        if first is None or tuple(x.strip() for x in first) != header:
            shown = None if first is None else ",".join(first)
            raise MalformedLineError(path, 1, expected, shown, f"the header is not {','.join(header)}")
        for row in reader:
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            text = ",".join(row)
            if len(row) != len(header):
                raise MalformedLineError(path, reader.line_num, expected, text,
                                         f"{len(row)} fields, not {len(header)}")
            if check is not None:
                try:
                    check(row)
                except ValueError as err:
                    raise MalformedLineError(path, reader.line_num, expected, text, str(err)) from None
            yield reader.line_num, row


def _check_ids_and_time(row: list[str]) -> None:
    """ValueError unless fields 0, 1 and 3 (userId, movieId, timestamp of ratings.csv and tags.csv) are integers."""
    for name, value in zip(("userId", "movieId", "timestamp"), (row[0], row[1], row[3])):
        if not _is_int(value):
            raise ValueError(f"{name} {value!r} is not an integer")


def _check_rating_row(row: list[str]) -> float:
    """The rating of a ratings.csv row; ValueError unless the ids and time are integers and the
    rating is in 0.5 steps from 0.5 to 5."""
    _check_ids_and_time(row)
    try:
        rating = float(row[2])
    except ValueError:
        raise ValueError(f"rating {row[2]!r} is not a number") from None
    if not _is_half_step(np.array([rating]))[0]:
        raise ValueError(f"rating {row[2]!r} is not in 0.5 steps from 0.5 to 5")
    return rating


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def _is_half_step(rating: np.ndarray) -> np.ndarray:
    """Which ratings are 0.5, 1.0, ..., 5.0 (NaN is not)."""
    doubled = rating * 2
    return (rating >= 0.5) & (rating <= 5.0) & (doubled == np.round(doubled))


def _read_ratings_csv(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Raw userId, movieId (int64), rating (float64), timestamp (int64), in file order.

    Fast path: pandas with fixed dtypes (ml-32m has 32M rows); if it does not parse, or a
    rating is off the 0.5 steps, the file is scanned row by row to report the first bad line.
    """
    import pandas as pd

    encoding = text_encoding(path)
    next(_csv_rows(path, RATINGS_CSV_HEADER, encoding=encoding), None)  # checks the header (and the first row's width)
    dtypes = {"userId": "int64", "movieId": "int64", "rating": "float64", "timestamp": "int64"}
    try:
        table = pd.read_csv(path, header=0, names=list(RATINGS_CSV_HEADER), dtype=dtypes, engine="c",
                            encoding=encoding, skip_blank_lines=True)
    except (ValueError, pd.errors.ParserError, OverflowError, TypeError):
        _scan_ratings_csv(path, encoding)  # finds and raises the first bad line
        raise  # the scan found nothing wrong row by row: surface pandas' own error
    rating = table["rating"].to_numpy()
    if not _is_half_step(rating).all():
        _scan_ratings_csv(path, encoding)
    if len(table) == 0:
        raise ValueError(f"{path} holds no ratings")
    return (table["userId"].to_numpy(), table["movieId"].to_numpy(), rating, table["timestamp"].to_numpy())


def _scan_ratings_csv(path: Path, encoding: str) -> None:
    """Raise the first malformed line of ratings.csv (the slow, exact path)."""
    for _ in _csv_rows(path, RATINGS_CSV_HEADER, check=_check_rating_row, encoding=encoding):
        pass


def _read_movies_csv(path: Path) -> dict[int, str | None]:
    """movieId -> its first listed genre (None for ``(no genres listed)`` or an empty field)."""
    movie_genre: dict[int, str | None] = {}
    for _, (movie, _title, genres) in _csv_rows(path, MOVIES_CSV_HEADER, check=_check_movie_row):
        first = genres.split("|")[0].strip()
        movie_genre[int(movie)] = None if first in ("", NO_GENRES) else first
    return movie_genre


def _check_movie_row(row: list[str]) -> None:
    """ValueError unless the movieId is an integer (titles and genres are free text)."""
    if not _is_int(row[0]):
        raise ValueError(f"movieId {row[0]!r} is not an integer")


def _count_tags_csv(path: Path) -> int:
    """The number of tags in tags.csv, every row checked (the tags themselves are no feature)."""
    return sum(1 for _ in _csv_rows(path, TAGS_CSV_HEADER, check=_check_ids_and_time))


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

"""Small raw files in each real source's documented format, and a helper to read a data module back.

Shared by the ``tests/test_behavior_*.py`` files (not a test file itself).
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from datamodules.behavior import TAOBAO_TIME_WINDOW, BehaviorDataModule

SPLIT_CODE = {"train": 0, "val": 1, "test": 2}
DAY = 86400
T0 = TAOBAO_TIME_WINDOW[0]  # 2017-11-25 00:00 in UTC+8
#: the real ml-latest-small zip, when the machine has it beside the checkout (never in the repository)
ML_LATEST_SMALL = Path(__file__).resolve().parents[2] / "shared/data/movielens/ml-latest-small.zip"


@pytest.fixture(scope="session")
def synthetic_dm(tmp_path_factory):
    """A 40k-sample synthetic world (1000 users, 600 items), set up once per test run."""
    dm = BehaviorDataModule(cache_dir=str(tmp_path_factory.mktemp("syn")), synthetic_samples=40_000,
                            synthetic_users=1000, synthetic_items=600, seed=3)
    dm.setup("fit")
    return dm


def frame(dm: BehaviorDataModule) -> dict[str, np.ndarray]:
    """All splits' columns concatenated, with a ``split`` code column."""
    parts = {}
    for name, code in SPLIT_CODE.items():
        if dm.split_dataset(name).num_rows == 0:
            continue  # an empty split's list columns come back 1-D
        cols = dm.split_dataset(name).with_format("numpy")[:]
        cols["split"] = np.full(len(cols["label"]), code)
        for key, value in cols.items():
            parts.setdefault(key, []).append(np.asarray(value))
    return {k: np.concatenate(v) for k, v in parts.items()}


def write_movielens(folder: Path, ratings: list[str] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    movies = ["1::Toy Story (1995)::Animation|Children's|Comedy", "2::Jumanji (1995)::Adventure|Children's|Fantasy",
              "3::Caf\u00e9 Society (1995)::Comedy|Romance", "4::Heat (1995)::Action|Crime|Thriller",
              "5::Sabrina (1995)::Comedy|Romance", "6::Nixon (1995)::Drama"]
    users = ["1::F::1::10::48067", "2::M::56::16::70072", "3::M::25::15::55117"]
    if ratings is None:
        ratings = [
            "1::3::4::200",  # same second as movie 2, but later in the file
            "1::1::5::100",
            "2::6::5::50",
            "1::4::2::300",
            "1::5::4::400",
            "2::1::1::60",
            "2::2::4::70",
            "3::2::5::10",
            "3::6::3::20",
        ]
        ratings.insert(0, "1::2::3::200")
    (folder / "movies.dat").write_bytes(("\n".join(movies) + "\n").encode("latin-1"))
    (folder / "users.dat").write_bytes(("\n".join(users) + "\n").encode("latin-1"))
    (folder / "ratings.dat").write_bytes(("\n".join(ratings) + "\n").encode("latin-1"))
    return folder


def write_user_behavior(folder: Path, extra: list[str] = ()) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rows = [
        f"10,100,7,pv,{T0 + 3600}",
        f"10,101,7,pv,{T0 + DAY + 100}",
        f"10,101,7,buy,{T0 + DAY + 200}",
        f"10,102,8,pv,{T0 + 7 * DAY + 50}",
        f"10,103,8,pv,{T0 + 8 * DAY + 50}",
        f"10,109,9,cart,{T0 + 8 * DAY + 60}",
        f"20,100,7,pv,{T0 + 10}",
        f"20,104,9,pv,{T0 + 2 * DAY}",
        f"20,105,9,fav,{T0 + 2 * DAY + 5}",
        f"20,106,9,pv,{T0 + 8 * DAY + 7}",
        f"30,107,7,pv,{T0 + 5 * DAY}",
        f"30,108,8,pv,{T0 + 7 * DAY + 1}",
        f"30,100,7,pv,{T0 - 10 * DAY}",  # outside the window: dropped
        *extra,
    ]
    (folder / "UserBehavior.csv").write_text("\n".join(rows) + "\n")
    return folder


def write_amazon(folder: Path, bad_review_line: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    reviews = []
    plan = {"U1": [("A1", 10), ("A2", 20), ("A3", 30), ("A4", 40)], "U2": [("A2", 5), ("A5", 15), ("A1", 25)],
            "U3": [("A6", 7), ("A3", 8)]}
    for user, items in plan.items():
        for asin, t in items:
            reviews.append(json.dumps({"reviewerID": user, "asin": asin, "reviewerName": "x", "helpful": [0, 0],
                                       "reviewText": "ok", "overall": 5.0, "summary": "s", "unixReviewTime": t,
                                       "reviewTime": "01 1, 2014"}))
    if bad_review_line is not None:
        reviews.insert(2, bad_review_line)
    (folder / "reviews_Electronics_5.json").write_text("\n".join(reviews) + "\n")
    meta = [
        "{'asin': 'A1', 'categories': [['Electronics', 'Computers & Accessories', 'Laptops']], 'title': \"Bob's laptop\"}",
        "{'asin': 'A2', 'categories': [['Electronics', 'Headphones']]}",
        '{"asin": "A3", "categories": [["Electronics", "Computers & Accessories", "Laptops"]]}',
        "{'asin': 'A4', 'salesRank': {'Electronics': 5}, 'categories': [['Electronics', 'Cables']]}",
        "{'asin': 'ZZZ', 'categories': [['Electronics', 'Unreviewed']]}",
        "{'asin': 'A6', 'categories': [['Electronics', 'Audio'], ['Electronics', 'Headphones']]}",
    ]  # A5 has no meta line: category unknown (0)
    (folder / "meta_Electronics.json").write_text("\n".join(meta) + "\n")
    return folder


MOVIES_CSV = [
    "movieId,title,genres",
    "1,Toy Story (1995),Adventure|Animation|Children|Comedy|Fantasy",
    '11,"American President, The (1995)",Comedy|Drama|Romance',  # a comma inside quotes
    "3,Caf\u00e9 Society (2016),Comedy|Drama|Romance",
    "4,Heat (1995),Action|Crime|Thriller",
    "5,Pirates (2010),(no genres listed)",
    "6,Nixon (1995),Drama",
]
RATINGS_CSV = [
    "userId,movieId,rating,timestamp",
    "1,3,4.0,200",
    "1,1,3.5,100",
    "1,11,5.0,300",
    "1,4,0.5,400",
    "1,5,4.5,500",
    "1,6,2.0,600",
    "2,6,3.0,50",
    "2,1,4.0,60",
    "7,11,1.5,10",
]
TAGS_CSV = [
    "userId,movieId,tag,timestamp",
    "1,11,funny,310",
    '2,1,"pixar, animation",70',
    "7,11,Caf\u00e9 talk,11",
]


def write_movielens_csv(folder: Path, *, ratings: list[str] | None = None, movies: list[str] | None = None,
                        tags: list[str] | None = TAGS_CSV, encoding: str = "utf-8") -> Path:
    """A tiny folder of the MovieLens CSV family (headers, quoted titles, '|' genres); no tags.csv
    if ``tags`` is None."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {"ratings.csv": RATINGS_CSV if ratings is None else ratings,
             "movies.csv": MOVIES_CSV if movies is None else movies, "tags.csv": tags}
    for name, lines in files.items():
        if lines is not None:
            (folder / name).write_bytes(("\n".join(lines) + "\n").encode(encoding))
    return folder


def ml_latest_small(folder: Path, n_users: int | None = None) -> Path:
    """ml-latest-small unzipped into ``folder`` (only the ratings and tags of users 1..``n_users`` if
    given); the test is skipped when the zip is not on this machine."""
    if not ML_LATEST_SMALL.is_file():
        pytest.skip(f"the real ml-latest-small zip is not at {ML_LATEST_SMALL} (download it from GroupLens)")
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(ML_LATEST_SMALL) as archive:
        for name in ("ratings.csv", "movies.csv", "tags.csv"):
            lines = io.TextIOWrapper(archive.open(f"ml-latest-small/{name}"), encoding="utf-8").read().splitlines()
            if n_users is not None and name != "movies.csv":
                lines = lines[:1] + [line for line in lines[1:] if int(line.split(",", 1)[0]) <= n_users]
            (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder

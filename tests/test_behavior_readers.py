"""datamodules/behavior/readers.py: the three raw readers on small files in the documented formats,
and the errors that name the file, the line and the format, or the missing files and their download."""

from __future__ import annotations

import numpy as np
import pytest

from datamodules.behavior.readers import (
    MOVIELENS_1M_FILES,
    DatasetMissingError,
    MalformedLineError,
    read_amazon_electronics,
    read_movielens_1m,
    read_user_behavior,
)
from tests.behavior_files import DAY, T0, write_amazon, write_movielens, write_user_behavior


def test_missing_folder_or_files_say_what_and_where_to_download(tmp_path):
    with pytest.raises(DatasetMissingError, match=r"needs data_dir, a folder with ratings.dat, users.dat, movies.dat.*ml-1m.zip"):
        MOVIELENS_1M_FILES.require(None)
    with pytest.raises(DatasetMissingError, match=r"does not exist.*files.grouplens.org/datasets/movielens/ml-1m.zip"):
        read_movielens_1m(tmp_path / "nowhere")
    (tmp_path / "ratings.dat").write_text("1::1::5::10\n")
    with pytest.raises(DatasetMissingError, match=r"missing users.dat, movies.dat in"):
        read_movielens_1m(tmp_path)
    with pytest.raises(DatasetMissingError, match=r"missing UserBehavior.csv.*Tianchi dataset 649"):
        read_user_behavior(tmp_path)
    with pytest.raises(DatasetMissingError, match=r"missing reviews_Electronics_5.json, meta_Electronics.json.*jmcauley"):
        read_amazon_electronics(tmp_path)
    assert issubclass(DatasetMissingError, FileNotFoundError)


# ------------------------------------------------------------------------------ MovieLens
def test_movielens_reader_sorts_by_user_time_and_file_order_and_maps_ids(tmp_path):
    ev = read_movielens_1m(write_movielens(tmp_path / "ml-1m"))
    assert (ev["n_users"], ev["n_items"], ev["n_categories"]) == (4, 7, 6)
    assert ev["profile_sizes"] == [3, 4, 4, 4]
    u1 = ev["user"] == 1
    # movies 2 and 3 both at t = 200: file order (2 first) decides
    assert ev["item"][u1].tolist() == [1, 2, 3, 4, 5] and ev["time"][u1].tolist() == [100, 200, 200, 300, 400]
    assert ev["rating"][u1].tolist() == [5, 3, 4, 2, 4]
    assert ev["user_features"].shape == (4, 4) and (ev["user_features"][0] == 0).all()
    assert (np.diff(ev["user"]) >= 0).all()


@pytest.mark.parametrize(
    ("name", "bad", "line", "why"),
    [
        ("ratings.dat", "2::3::four::100", 3, "not all integers"),
        ("ratings.dat", "2::3::4", 3, "3 fields, not 4"),
        ("users.dat", "9::M::x::1::123", 3, "UserID, Age and Occupation must be integers"),
        ("movies.dat", "7::Only a title", 3, "2 fields, not 3"),
    ],
)
def test_movielens_malformed_line_names_file_line_and_format(tmp_path, name, bad, line, why):
    folder = write_movielens(tmp_path / "ml-1m")
    lines = (folder / name).read_bytes().decode("latin-1").splitlines()
    lines.insert(line - 1, bad)
    (folder / name).write_bytes(("\n".join(lines) + "\n").encode("latin-1"))
    with pytest.raises(MalformedLineError, match=rf"{name}, line {line}: malformed line \({why}.*expected") as err:
        read_movielens_1m(folder)
    assert err.value.lineno == line and err.value.path.endswith(name)


# ------------------------------------------------------------------------------ Taobao
def test_user_behavior_reader_keeps_clicks_in_the_window(tmp_path):
    ev = read_user_behavior(write_user_behavior(tmp_path / "taobao"))
    assert ev["rows"] == 13 and ev["clicks"] == 9  # 3 non-click rows, 1 click outside the window
    assert ev["user"].tolist() == [10] * 4 + [20] * 3 + [30] * 2
    assert ev["item"][:4].tolist() == [100, 101, 102, 103] and (ev["time"] >= T0).all()
    everything = read_user_behavior(tmp_path / "taobao", time_window=None)
    assert everything["clicks"] == 10 and everything["time"][everything["user"] == 30][0] == T0 - 10 * DAY


@pytest.mark.parametrize(
    ("bad", "why"),
    [("10,100,7,click,1511600000", "behavior_type 'click'"), ("10,100,7,pv", "4 fields, not 5"),
     ("10,abc,7,pv,1511600000", "a non-integer id")],
)
def test_user_behavior_malformed_line(tmp_path, bad, why):
    folder = write_user_behavior(tmp_path / "taobao")
    lines = (folder / "UserBehavior.csv").read_text().splitlines()
    lines.insert(4, bad)
    (folder / "UserBehavior.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(MalformedLineError, match=rf"UserBehavior.csv, line 5: malformed line \({why}"):
        read_user_behavior(folder)


# ------------------------------------------------------------------------------ Amazon
def test_amazon_reader_categories_from_the_last_path(tmp_path):
    ev = read_amazon_electronics(write_amazon(tmp_path / "amazon"))
    assert ev["user"][:4] == ["U1"] * 4 and len(ev["item"]) == 9 and ev["time"].dtype == np.int64
    assert ev["item_category"] == {"A1": "Laptops", "A2": "Headphones", "A3": "Laptops", "A4": "Cables",
                                   "A6": "Headphones"}  # ZZZ never reviewed, A5 without meta


def test_amazon_malformed_review_and_meta_lines(tmp_path):
    folder = write_amazon(tmp_path / "amazon", bad_review_line='{"reviewerID": "U9", "asin": "A1"}')
    with pytest.raises(MalformedLineError, match=r"reviews_Electronics_5.json, line 3: malformed line \(KeyError"):
        read_amazon_electronics(folder)
    folder = write_amazon(tmp_path / "amazon2")
    with open(folder / "meta_Electronics.json", "a") as fh:
        fh.write("{'asin': 'A5', 'categories': [['Electronics', 'Cables']\n")  # truncated literal
    with pytest.raises(MalformedLineError, match=r"meta_Electronics.json, line 7: malformed line"):
        read_amazon_electronics(folder)

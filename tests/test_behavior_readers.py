"""datamodules/behavior/readers.py: the raw readers on small files in the documented formats,
and the errors that name the file, the line and the format, or the missing files and their download."""

from __future__ import annotations

import codecs
from pathlib import Path

import numpy as np
import pytest

from datamodules.behavior.readers import (
    MOVIELENS_1M_FILES,
    DatasetMissingError,
    MalformedLineError,
    read_amazon_electronics,
    read_movielens_1m,
    read_movielens_csv,
    open_text,
    read_user_behavior,
    text_encoding,
)
from tests.behavior_files import (
    DAY,
    MOVIES_CSV,
    RATINGS_CSV,
    T0,
    TAGS_CSV,
    write_amazon,
    write_movielens,
    write_movielens_csv,
    write_user_behavior,
)


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
    (tmp_path / "ratings.csv").write_text("userId,movieId,rating,timestamp\n1,1,5.0,10\n")
    with pytest.raises(DatasetMissingError, match=r"missing movies.csv in .*ml-latest-small.zip"):
        read_movielens_csv(tmp_path)
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


def assert_malformed(read, folder, name: str, line: int, why: str) -> None:
    """``read(folder)`` raises MalformedLineError naming ``name``, its ``line`` and ``why``, then the format."""
    with pytest.raises(MalformedLineError, match=rf"{name}, line {line}: malformed line \({why}.*expected") as err:
        read(folder)
    assert err.value.lineno == line and err.value.path.endswith(name)


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
    assert_malformed(read_movielens_1m, folder, name, line, why)


# ------------------------------------------------------------------------------ the MovieLens CSV family
#: each CSV fixture file's lines, by file name
CSV_LINES = {"ratings.csv": RATINGS_CSV, "movies.csv": MOVIES_CSV, "tags.csv": TAGS_CSV}


def test_movielens_csv_reader_headers_quoted_titles_genres_and_tags(tmp_path):
    ev = read_movielens_csv(write_movielens_csv(tmp_path / "ml"))
    # 6 movies (the quoted "American President, The" is one row of three fields), users 1, 2, 7
    assert (ev["n_users"], ev["n_items"], ev["n_categories"]) == (4, 7, 5)  # Action, Adventure, Comedy, Drama
    assert ev["user_features"] is None and ev["profile_sizes"] == []
    assert ev["counts"] == {"movies": 6, "tags": 3}
    u1 = ev["user"] == 1
    # movies sorted by id get items 1..6: 1, 3, 4, 5, 6, 11; user 1 in time order: 1, 3, 11, 4, 5, 6
    assert ev["item"][u1].tolist() == [1, 2, 6, 3, 4, 5] and ev["time"][u1].tolist() == [100, 200, 300, 400, 500, 600]
    assert ev["rating"][u1].tolist() == [3.5, 4.0, 5.0, 0.5, 4.5, 2.0] and ev["rating"].dtype == np.float64
    # the first listed genre: Toy Story -> Adventure (2), American President and Café Society -> Comedy (3),
    # Heat -> Action (1), Pirates (no genres listed) -> 0 unknown, Nixon -> Drama (4)
    assert ev["item_category"].tolist() == [0, 2, 3, 1, 0, 4, 3]
    np.testing.assert_array_equal(ev["category"], ev["item_category"][ev["item"]])
    assert read_movielens_csv(write_movielens_csv(tmp_path / "no-tags", tags=None))["counts"]["tags"] is None


def test_movielens_csv_reads_latin1_files_like_utf8_ones(tmp_path):
    utf8 = write_movielens_csv(tmp_path / "utf8")
    latin1 = write_movielens_csv(tmp_path / "latin1", encoding="latin-1")
    assert "é".encode("latin-1") in (latin1 / "movies.csv").read_bytes()  # not valid UTF-8 ...
    with pytest.raises(UnicodeDecodeError):
        (latin1 / "movies.csv").read_bytes().decode("utf-8")
    assert text_encoding(utf8 / "movies.csv") == "utf-8-sig" and text_encoding(latin1 / "movies.csv") == "latin-1"
    assert text_encoding(latin1 / "ratings.csv") == "utf-8-sig"  # ASCII is UTF-8
    a, b = read_movielens_csv(utf8), read_movielens_csv(latin1)  # ... and still read, with the same result
    assert a["counts"] == b["counts"] == {"movies": 6, "tags": 3}
    for key in ("user", "item", "category", "time", "rating", "item_category"):
        np.testing.assert_array_equal(a[key], b[key])


@pytest.mark.parametrize(
    ("name", "bad", "line", "why"),
    [
        ("ratings.csv", "1,2,four,100", 3, "rating 'four' is not a number"),
        ("ratings.csv", "1,2,4.3,100", 4, "rating '4.3' is not in 0.5 steps"),
        ("ratings.csv", "1,2,5.5,100", 4, "rating '5.5' is not in 0.5 steps"),
        ("ratings.csv", "1,2,4.0", 5, "3 fields, not 4"),
        ("ratings.csv", "1,2,4.0,100,7", 5, "5 fields, not 4"),
        ("ratings.csv", "1.5,2,4.0,100", 2, "userId '1.5' is not an integer"),
        ("movies.csv", "7,Hello, World (1999),Drama", 3, "4 fields, not 3"),
        ("movies.csv", "x7,Seven (1995),Drama", 6, "movieId 'x7' is not an integer"),
        ("tags.csv", "1,3,nice,yesterday", 3, "timestamp 'yesterday' is not an integer"),
    ],
)
def test_movielens_csv_malformed_line_names_file_line_and_format(tmp_path, name, bad, line, why):
    lines = CSV_LINES[name].copy()
    lines.insert(line - 1, bad)
    folder = write_movielens_csv(tmp_path / "ml", **{name.removesuffix(".csv"): lines})
    assert_malformed(read_movielens_csv, folder, name, line, why)


@pytest.mark.parametrize("name", ["ratings.csv", "movies.csv", "tags.csv"])
def test_movielens_csv_wrong_header_is_line_1(tmp_path, name):
    lines = CSV_LINES[name]
    header = lines[0]
    for wrong in (lines[1:], ["user," + header.split(",", 1)[1], *lines[1:]]):  # no header; a renamed column
        folder = write_movielens_csv(tmp_path / f"ml-{len(wrong)}", **{name.removesuffix(".csv"): wrong})
        with pytest.raises(MalformedLineError, match=rf"{name}, line 1: malformed line \(the header is not {header}\)"):
            read_movielens_csv(folder)


def _with_bom(folder: Path, names: tuple[str, ...], encoding: str) -> Path:
    """``folder``'s files re-encoded in ``encoding``, each starting with a UTF-8 byte-order mark."""
    for name in names:
        path = folder / name
        path.write_bytes(codecs.BOM_UTF8 + path.read_bytes().decode("latin-1" if name == "movies.dat" else "utf-8")
                         .encode(encoding))  # fmt: skip
    return folder


@pytest.mark.parametrize("encoding", ["utf-8", "latin-1"])
@pytest.mark.parametrize(
    ("read", "write", "names"),
    [
        (read_movielens_1m, write_movielens, ("ratings.dat", "users.dat", "movies.dat")),
        (read_movielens_csv, write_movielens_csv, ("ratings.csv", "movies.csv", "tags.csv")),
    ],
    ids=["ml-1m ::", "csv"],
)
def test_a_byte_order_mark_is_dropped_the_same_way_in_both_movielens_formats(tmp_path, read, write, names, encoding):
    """A UTF-8 byte-order mark before the first line (an editor or export tool adds one) reads like no mark, in the
    :: files as in the CSV ones, whether the rest is UTF-8 or latin-1 (a mark before bytes that are not UTF-8)."""
    plain = write(tmp_path / "plain")
    marked = _with_bom(write(tmp_path / "marked"), names, encoding)
    assert all((marked / name).read_bytes().startswith(codecs.BOM_UTF8) for name in names)
    if encoding == "latin-1":  # "é" in latin-1: the files with titles are not UTF-8 behind their mark
        title_file = "movies.dat" if "movies.dat" in names else "movies.csv"
        with pytest.raises(UnicodeDecodeError):
            (marked / title_file).read_bytes().decode("utf-8")
    a, b = read(plain), read(marked)
    assert a["counts"] == b["counts"]
    for key in ("user", "item", "category", "time", "rating", "item_category", "user_features"):
        if a.get(key) is not None:
            np.testing.assert_array_equal(a[key], b[key])
    for name in names:
        with open_text(marked / name) as f:
            assert f.read(1).isalnum()  # the first field's first character, not the mark's


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

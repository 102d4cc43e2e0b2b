"""datamodules/behavior/cache.py: keyed entries, reused across runs, written whole and atomically."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from datamodules.behavior import BehaviorDataModule
from datamodules.behavior.cache import behavior_cache_root, entry_key, is_complete, load_entry, save_entry, to_hf_splits
from tests.behavior_files import frame, write_movielens


def test_cache_second_setup_skips_preprocessing_and_tracks_files_and_params(tmp_path, monkeypatch):
    folder = write_movielens(tmp_path / "ml-1m")
    cache = tmp_path / "cache"
    kw = dict(source="movielens_1m", data_dir=str(folder), cache_dir=str(cache), seq_len=3)
    first = BehaviorDataModule(**kw)
    first.prepare_data()
    first.setup("fit")
    assert first.cache_status == "built"
    assert first.cache_path.parent == cache and (first.cache_path / "meta.json").is_file()
    assert [p.name for p in cache.iterdir()] == [first.cache_path.name], "no temporary folders left behind"

    def boom(self):
        raise AssertionError("preprocessed again")

    monkeypatch.setattr(BehaviorDataModule, "preprocess", boom)
    second = BehaviorDataModule(**kw)
    second.setup("fit")
    assert second.cache_status == "loaded" and second.cache_path == first.cache_path
    assert second.feature_sizes == first.feature_sizes
    np.testing.assert_array_equal(frame(second)["hist_items"], frame(first)["hist_items"])
    # another preprocessing parameter, or a changed file, is another cache entry
    assert BehaviorDataModule(**{**kw, "seq_len": 4}).cache_key() != first.cache_key()
    assert BehaviorDataModule(**{**kw, "pad_side": "right"}).cache_key() != first.cache_key()
    assert BehaviorDataModule(**{**kw, "batch_size": 64}).cache_key() == first.cache_key()
    key = first.cache_key()
    assert first.cache_path.name.endswith(key)
    stat = (folder / "ratings.dat").stat()
    os.utime(folder / "ratings.dat", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert BehaviorDataModule(**kw).cache_key() != key
    monkeypatch.undo()
    third = BehaviorDataModule(**kw)
    third.setup("fit")
    assert third.cache_status == "built"


def tiny_splits():
    columns = {"user": np.array([1, 2, 3]), "label": np.array([1.0, 0.0, 1.0]),
               "hist_items": np.array([[0, 1], [1, 2], [2, 3]])}
    return to_hf_splits(columns, np.array([0, 1, 2]))


def test_entry_is_written_whole_with_strict_json_meta(tmp_path):
    path = tmp_path / "synthetic-abc"
    save_entry(path, tiny_splits(), {"ceiling": {"val_auc": float("nan")}, "sizes": np.int64(3)})
    assert is_complete(path) and [p.name for p in tmp_path.iterdir()] == ["synthetic-abc"]
    assert json.loads((path / "meta.json").read_text()) == {"ceiling": {"val_auc": None}, "sizes": 3}
    splits, meta = load_entry(path)
    assert splits["train"]["hist_items"] == [[0, 1]] and meta["sizes"] == 3


def test_a_failed_write_leaves_no_entry_and_a_complete_one_written_meanwhile_wins(tmp_path):
    class Broken:
        def save_to_disk(self, path):
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        save_entry(tmp_path / "e", Broken(), {})
    assert list(tmp_path.iterdir()) == []
    save_entry(tmp_path / "e", tiny_splits(), {"by": "first"})
    save_entry(tmp_path / "e", tiny_splits(), {"by": "second"})  # loses the race: not an error
    assert load_entry(tmp_path / "e")[1] == {"by": "first"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e"]


def test_key_and_root(tmp_path, monkeypatch):
    assert entry_key({"a": 1}, []) == entry_key({"a": 1}, []) != entry_key({"a": 2}, [])
    assert len(entry_key({}, [])) == 16
    assert behavior_cache_root(str(tmp_path)) == tmp_path
    monkeypatch.setenv("BEHAVIOR_CACHE_DIR", str(tmp_path / "env"))
    assert behavior_cache_root(None) == tmp_path / "env"
    monkeypatch.delenv("BEHAVIOR_CACHE_DIR")
    assert behavior_cache_root(None) == behavior_cache_root("~/.cache/bst_behavior")

"""utils.atomic: files and directories appear whole or not at all, with the ordinary mode."""

from __future__ import annotations

import json
import math
import os
import stat

import numpy as np
import pytest

from utils.atomic import atomic_directory, atomic_savefig, atomic_write, atomic_write_json, atomic_write_text


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_text_written_whole_with_umask_mode(tmp_path):
    old = os.umask(0o022)
    try:
        path = atomic_write_text(tmp_path / "a" / "b.txt", "hello\n")
    finally:
        os.umask(old)
    assert path.read_text() == "hello\n"
    assert _mode(path) == 0o644  # not tempfile's 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["b.txt"]


def test_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "results.json"
    path.write_text("old")

    def boom(f):
        f.write("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, boom)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_json_is_strict(tmp_path):
    path = atomic_write_json(tmp_path / "r.json", {"loss": math.nan, "acc": np.float32(0.5), "n": np.int64(3),
                                                   "v": [math.inf, 1.0], "t": (1, 2)})
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"loss": None, "acc": 0.5, "n": 3, "v": [None, 1.0], "t": [1, 2]}


def test_savefig_writes_a_png(tmp_path):
    from matplotlib.figure import Figure

    fig = Figure()
    fig.add_subplot().plot([0, 1], [1, 0])
    path = atomic_savefig(fig, tmp_path / "f.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_directory_appears_only_when_complete(tmp_path):
    final = tmp_path / "prepared"
    with pytest.raises(KeyboardInterrupt):
        with atomic_directory(final) as tmp:
            (tmp / "part").write_text("x")
            raise KeyboardInterrupt
    assert not final.exists() and list(tmp_path.iterdir()) == []

    with atomic_directory(final) as tmp:
        (tmp / "part").write_text("x")
        assert not final.exists()
    assert (final / "part").read_text() == "x"
    assert [p.name for p in tmp_path.iterdir()] == ["prepared"]


def test_directory_race_lost_to_a_complete_writer_is_not_an_error(tmp_path):
    final = tmp_path / "cache"
    with atomic_directory(final) as tmp:
        (tmp / "ours").write_text("1")
        final.mkdir()
        (final / "theirs").write_text("2")  # another process finished first
    assert [p.name for p in final.iterdir()] == ["theirs"]
    assert [p.name for p in tmp_path.iterdir()] == ["cache"]

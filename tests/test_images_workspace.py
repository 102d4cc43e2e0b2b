"""datamodules/images/workspace.py: who owns a temporary preparation directory, which leftovers are stale (and only
those are removed), and the one-line error for a cache directory that cannot be written."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
from pathlib import Path

import pytest

from datamodules.images.workspace import (
    OWNER,
    CacheNotWritableError,
    check_writable,
    find_leftovers,
    owned_directory,
    owner_record,
    remove_stale,
)


def killed_preparation(*finals: Path) -> list[Path]:
    """The temporary directories a process leaves when SIGKILL stops it inside ``owned_directory`` (one per
    ``final``, nested): a forked child that kills itself, so no new interpreter has to import torch."""
    pid = os.fork()
    if pid == 0:  # the child: build, and be killed before the rename
        try:
            with contextlib.ExitStack() as stack:
                for final in finals:
                    tmp = stack.enter_context(owned_directory(final))
                    (tmp / "part.arrow").write_bytes(b"x" * 5000)
                os.kill(os.getpid(), signal.SIGKILL)
        finally:
            os._exit(1)  # never back into pytest
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    return [next(p for p in final.parent.iterdir() if p.name.startswith(f".{final.name}.")) for final in finals]


def fake_leftover(parent: Path, name: str, owner: dict | None) -> Path:
    tmp = parent / f".{name}.abcd1234.tmp"
    tmp.mkdir(parents=True)
    (tmp / "00000.arrow").write_bytes(b"y" * 1000)
    if owner is not None:
        (tmp / OWNER).write_text(json.dumps(owner))
    return tmp


def test_the_owner_is_recorded_while_building_and_gone_from_the_result(tmp_path):
    final = tmp_path / "cache" / "attention-repro" / "prepared" / "folder-x-1"
    with owned_directory(final) as tmp:
        owner = json.loads((tmp / OWNER).read_text())
        assert owner["pid"] == os.getpid() and owner["host"] == socket.gethostname()
        (left,) = find_leftovers(tmp_path / "cache")
        assert left.alive is True and left.path == str(tmp) and left.target == str(final)
        assert remove_stale(tmp_path / "cache", say=lambda _: None) == [] and tmp.is_dir()  # in use: untouched
        (tmp / "manifest.json").write_text("{}")
    assert sorted(p.name for p in final.iterdir()) == ["manifest.json"]
    assert find_leftovers(tmp_path / "cache") == []


def test_only_the_directories_of_processes_gone_from_this_host_are_removed(tmp_path):
    cache = tmp_path / "cache"
    prepared = cache / "attention-repro" / "prepared"
    killed, arrays, decoded = killed_preparation(
        prepared / "folder-imgs-1",
        cache / "attention-repro" / "digits-2",  # converted arrays live one level up
        prepared / "folder-imgs-0" / "decoded-RGB-8x8",  # decoded arrays inside a prepared dataset
    )
    me = owner_record()
    reused = fake_leftover(prepared, "folder-reused", {**me, "process_start": "1"})  # our pid, another process
    rebooted = fake_leftover(prepared, "folder-rebooted", {**me, "boot_id": "another-boot"})
    running = fake_leftover(prepared, "folder-running", me)
    elsewhere = fake_leftover(prepared, "folder-elsewhere", {**me, "host": "node-that-is-not-this-one"})
    unowned = fake_leftover(prepared, "folder-unowned", None)

    found = {Path(left.path): left for left in find_leftovers(cache)}
    assert set(found) == {killed, arrays, decoded, reused, rebooted, running, elsewhere, unowned}
    assert found[killed].alive is False and found[killed].bytes > 5000 and found[killed].pid != os.getpid()
    assert "no longer running; stale: the next `data prepare` removes it" in found[killed].line()
    assert found[running].alive is True and "running; in use" in found[running].line()
    assert found[elsewhere].alive is None
    assert "host node-that-is-not-this-one, cannot be checked" in found[elsewhere].line()
    assert found[unowned].alive is None and found[unowned].pid is None and "no owner recorded" in found[unowned].line()

    lines: list[str] = []
    removed = remove_stale(cache, say=lines.append)
    assert {Path(r.path) for r in removed} == {killed, arrays, decoded, reused, rebooted}
    for path in (killed, arrays, decoded, reused, rebooted):
        assert not path.exists()
        (line,) = [x for x in lines if str(path) in x]
        assert line.startswith(f"[data] removed {path} (") and "interrupted preparation" in line
        assert "no longer running" in line
    kb = [x for x in lines if str(killed) in x][0]
    assert re.search(r"\(5\.\d kB\)", kb)  # its size (5,000 bytes and the owner record), measured before removal
    for path in (running, elsewhere, unowned):
        assert (path / "00000.arrow").is_file()
        (line,) = [x for x in lines if str(path) in x]
        assert "removed" not in line
    assert "delete it by hand" in [x for x in lines if str(elsewhere) in x][0]


def test_a_cache_directory_below_a_regular_file_is_named_in_one_line(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file")
    with pytest.raises(CacheNotWritableError) as err:
        check_writable(blocker / "cache", "(from --data.cache_dir)")
    text = str(err.value)
    assert "\n" not in text and text.startswith(f"the cache directory {blocker / 'cache'} (from --data.cache_dir)")
    assert f"{blocker} is a file, not a directory" in text and "--data.cache_dir DIR" in text
    check_writable(tmp_path / "fine")  # a writable one: the probe leaves only the directories it needs
    assert [p.name for p in (tmp_path / "fine" / "attention-repro" / "prepared").iterdir()] == []

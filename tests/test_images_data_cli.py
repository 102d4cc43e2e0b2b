"""``python -m reproductions data prepare|info`` (``reproductions/commands/data.py``) on tiny folders, offline."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reproductions.__main__ import main
from tests.images_helpers import isolated, write_jpeg_folder  # noqa: F401
from tests.cli_helpers import cli_env


def test_prepare_then_info_show_where_the_data_is_and_its_splits(tmp_path, capsys):
    folder, cache = tmp_path / "imgs", tmp_path / "cache"
    write_jpeg_folder(folder, per_class=3)
    args = ["--source", "imagenet", "--data.data_dir", str(folder), "--data.cache_dir", str(cache)]
    assert main(["data", "info", *args]) == 0
    assert "not prepared" in capsys.readouterr().out
    assert main(["data", "prepare", *args, "--data.prepare_workers", "1", "--json"]) == 0
    assert "prepared 12 images" in capsys.readouterr().out
    assert main(["data", "prepare", *args, "--json"]) == 0  # prepared already: found by its fingerprint
    out = capsys.readouterr().out
    result = json.loads(out[out.index("{\n"):])
    assert result["splits"] == {"train": 6, "test": 6} and result["classes"] == 2 and result["kind"] == "folder"
    assert result["path"].startswith(str(cache)) and result["bytes"] > 0
    assert main(["data", "info", *args]) == 0
    out = capsys.readouterr().out
    assert f"prepared in {result['path']}" in out and "train 6, test 6, 2 classes" in out


def test_prepare_from_a_config_with_overrides_and_one_line_errors(tmp_path, capsys):
    folder, cache = tmp_path / "imgs", tmp_path / "cache"
    write_jpeg_folder(folder, splits=("train",), per_class=4)
    (folder / "train" / "n01" / "broken.jpg").write_bytes(b"GIF89a not really")
    config = tmp_path / "x.yaml"
    config.write_text("data:\n  class_path: datamodules.images.ImageDataModule\n  init_args:\n    source: folder\n"
                      "    image_size: 8\n")
    args = ["--config", str(config), "--data.data_dir", str(folder), "--data.cache_dir", str(cache)]
    assert main(["data", "prepare", *args]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the progress bar: one line
    assert err.startswith("error: ") and "broken.jpg: cannot be decoded" in err and "BadImageError" not in err
    assert len(err.strip().splitlines()) == 1
    assert "skip_bad_images" in err
    assert main(["data", "prepare", *args, "--data.skip_bad_images", "true"]) == 0
    out = capsys.readouterr().out
    assert "skipped 1 of 9 files" in out and "1 undecodable files skipped" in out and "in memory" in out


# ------------------------------------------------------------------------------------------- faults
REPO = Path(__file__).resolve().parents[1]



def _tmp_dirs(cache: Path) -> list[Path]:
    root = cache / "attention-repro" / "prepared"
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp"))


@pytest.mark.subprocess
@pytest.mark.slow
def test_a_prepare_killed_midway_is_listed_by_info_and_removed_by_the_next_prepare(tmp_path, capsys):
    """SIGKILL a real `data prepare` while it writes its shards (held at a FIFO named like an image, which it
    reads until a writer closes it), then `info` lists the temporary directory it left (path, size, owner pid, not
    running) and the next `prepare` removes it in one line before preparing."""
    folder, cache = tmp_path / "imgs", tmp_path / "cache"
    write_jpeg_folder(folder, per_class=3)
    fifo = folder / "train" / "n02" / "zz-never-ends.JPEG"
    os.mkfifo(fifo)
    args = ["--source", "folder", "--data.data_dir", str(folder), "--data.cache_dir", str(cache),
            "--data.prepare_workers", "1"]  # fmt: skip
    log = open(tmp_path / "prepare.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "reproductions", "data", "prepare", *args], cwd=REPO, env=cli_env(),
                            stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    writer, deadline = None, time.monotonic() + 300
    try:
        while writer is None and proc.poll() is None and time.monotonic() < deadline:
            try:  # succeeds once the preparation has opened the FIFO to read it: it is inside its shards
                writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                time.sleep(0.2)
        assert writer is not None, (tmp_path / "prepare.log").read_text()[-2000:]
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(60) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
        if writer is not None:
            os.close(writer)
        log.close()
    os.unlink(fifo)
    (left,) = _tmp_dirs(cache)
    assert (left / "train").is_dir() and (left / ".owner.json").is_file()

    assert main(["data", "info", *args[:6]]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if str(left) in x)
    assert f"pid {proc.pid} on this host, no longer running; stale" in line and " kB " in f"{line} "
    assert main(["data", "info", *args[:6], "--json"]) == 0
    (entry,) = json.loads(capsys.readouterr().out)["leftovers"]
    assert entry["path"] == str(left) and entry["pid"] == proc.pid and entry["alive"] is False and entry["bytes"] > 0

    assert main(["data", "prepare", *args]) == 0
    out = capsys.readouterr().out
    (removed,) = [x for x in out.splitlines() if x.startswith("[data] removed ")]
    assert removed.startswith(f"[data] removed {left} (")
    assert f"pid {proc.pid} on this host, no longer running" in removed
    assert not left.exists() and _tmp_dirs(cache) == [] and "prepared 12 images" in out
    assert main(["data", "info", *args[:6]]) == 0
    assert "temporary directories" not in capsys.readouterr().out


def _read_only_mount(directory: Path) -> list[str] | None:
    """A command prefix that runs a command with ``directory`` mounted read-only (in a private mount namespace,
    gone with the command), or None where this process may not mount."""
    if shutil.which("unshare") is None:
        return None
    script = f'mount --bind "{directory}" "{directory}" && mount -o remount,bind,ro "{directory}" && exec "$@"'
    prefix = ["unshare", "-m", "sh", "-c", script, "sh"]
    probe = subprocess.run([*prefix, "sh", "-c", f'touch "{directory}/probe"'], capture_output=True, text=True)
    if probe.returncode == 0 or "Read-only file system" not in probe.stderr:
        (directory / "probe").unlink(missing_ok=True)
        return None
    return prefix


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["read-only directory", "below a regular file"])
def test_prepare_into_a_cache_dir_that_cannot_be_written_ends_in_one_line(tmp_path, capsys, kind):
    """A read-only cache directory (permission bits, or as root, who ignores them, a read-only mount of it), or one
    below a regular file: exit 2 and one `error:` line naming the directory and the option that moves the cache,
    before any work; nothing written."""
    folder, cache = tmp_path / "imgs", tmp_path / "cache"
    write_jpeg_folder(folder, per_class=2)
    if kind == "below a regular file":
        (tmp_path / "a-file").write_text("not a directory")
        cache = tmp_path / "a-file" / "cache"
    else:
        cache.mkdir()
    args = ["data", "prepare", "--source", "folder", "--data.data_dir", str(folder), "--data.cache_dir", str(cache)]
    if kind == "read-only directory" and os.geteuid() == 0:
        prefix = _read_only_mount(cache)
        if prefix is None:
            pytest.skip("running as root (permission bits do not stop root) without the right to mount read-only")
        done = subprocess.run([*prefix, sys.executable, "-m", "reproductions", *args], cwd=REPO, env=cli_env(),
                              capture_output=True, text=True, timeout=600)  # fmt: skip
        code, err = done.returncode, done.stderr
        why = "Read-only file system"
    else:
        if kind == "read-only directory":
            cache.chmod(0o555)
        try:
            code, err = main(args), capsys.readouterr().err
        finally:
            if cache.is_dir():
                cache.chmod(0o755)
        why = "Permission denied" if kind == "read-only directory" else f"{tmp_path / 'a-file'} is a file"
    last = err.strip().splitlines()[-1]
    assert code == 2, err[-2000:]
    assert last.startswith(f"error: the cache directory {cache} (from --data.cache_dir) cannot be written ("), last
    assert why in last and "--data.cache_dir DIR" in last and "HF_DATASETS_CACHE" in last
    assert "Traceback" not in err and "Preparing" not in err
    assert (tmp_path / "a-file").read_text() == "not a directory" if kind != "read-only directory" else \
        list(cache.iterdir()) == []  # fmt: skip


def test_a_config_that_is_not_yaml_is_named_with_its_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("data:\n\tinit_args: {}\n")
    assert main(["data", "prepare", "--config", str(bad)]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"error: --config {bad}, line 2, column 1: a tab character"), last

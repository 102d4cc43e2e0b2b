"""The cache directory as a workspace: whether preparations can write there, and what interrupted ones left.

A preparation builds its directory in a hidden temporary sibling, ``.<name>.<8 characters>.tmp``, and renames it
into place at the end (``utils.atomic.atomic_directory``). A process killed outright (SIGKILL, the out-of-memory
killer, a node that lost power) cannot remove it, so ``owned_directory`` records its owner in it as it is created,
``.owner.json``: the process id, the host, the process's start time and the machine's boot id. With that a
leftover is judged safely:

- owned by a process on this host that no longer runs (no such pid, the pid now belongs to a process started at
  another time, or the machine was restarted since): stale, ``remove_stale`` removes it;
- owned by a running process on this host: in use, never touched;
- owned by a process on another host (a shared cache): cannot be checked from here, left with a note;
- without an owner record (written by an older version, or killed in the instant after it was created): left
  with a note.

``find_leftovers`` lists them all (``data info``), ``remove_stale`` removes the stale ones and says so in one line
each (``data prepare``). ``check_writable`` fails in one line naming the directory before any work when the cache
cannot be written (a read-only directory or file system, a path below a regular file).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from utils.atomic import atomic_directory, atomic_write_json
from utils.process import boot_id, process_alive, process_start

OWNER = ".owner.json"
"""The owner record inside a temporary preparation directory."""
CACHE_SUBDIR = "attention-repro"
TEMPORARY = re.compile(r"^\.(?P<target>.+)\.[A-Za-z0-9_]{8}\.tmp$")
"""The name ``tempfile.mkdtemp(prefix=".<target>.", suffix=".tmp")`` gives a temporary directory."""


class CacheNotWritableError(PermissionError):
    """The cache directory cannot be written: prepared data would have nowhere to go."""


# ------------------------------------------------------------------------------------------------ sizes


def directory_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (for ``data info``; not used on the training path)."""
    total = 0
    for p in Path(path).rglob("*"):
        with contextlib.suppress(OSError):  # a file removed meanwhile
            if p.is_file():
                total += p.stat().st_size
    return total


def human_bytes(n: float) -> str:
    """``123 B``, ``1.2 kB``, ``3.4 GB`` (powers of 1000)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    return f"{n} B"  # pragma: no cover


# ------------------------------------------------------------------------------------------------ writable


def check_writable(cache_root: Path, origin: str = "") -> None:
    """Raise ``CacheNotWritableError`` (one line: the directory, why, what to do) unless a file can be created
    where preparations write, ``<cache root>/attention-repro/prepared``; the probe file is removed at once."""
    target = Path(cache_root) / CACHE_SUBDIR / "prepared"
    try:
        target.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=target, prefix=".write-check.", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        why = err.strerror or type(err).__name__
        where = f" ({why}: {err.filename})" if err.filename else f" ({why})"
        blocking = next((p for p in (target, *target.parents) if p.exists() and not p.is_dir()), None)
        if blocking is not None:  # a regular file where a directory has to be
            where = f" ({blocking} is a file, not a directory)"
        told = f" {origin}" if origin else ""
        raise CacheNotWritableError(
            f"the cache directory {cache_root}{told} cannot be written{where}; prepared data is written below it: "
            "choose a writable directory with --data.cache_dir DIR (or the environment variable HF_DATASETS_CACHE)"
        ) from None


# ------------------------------------------------------------------------------------------------ owners


def owner_record() -> dict[str, Any]:
    """Who this process is: pid, host, start time, boot id, when, and the command line."""
    import sys

    return {"pid": os.getpid(), "host": socket.gethostname(), "process_start": process_start(os.getpid()),
            "boot_id": boot_id(), "created": time.time(), "command": " ".join(sys.argv)[:300]}  # fmt: skip


def owner_alive(owner: dict[str, Any]) -> bool | None:
    """Whether the process of ``owner`` still runs: True, False, or None when it cannot be told from here
    (another host). A pid reused by a newer process, or a restarted machine, counts as not running."""
    if owner.get("host") != socket.gethostname():
        return None
    return process_alive(int(owner["pid"]), start=owner.get("process_start"), boot=owner.get("boot_id"))


@contextlib.contextmanager
def owned_directory(final: str | os.PathLike, *, complete: Callable[[Path], bool] | None = None) -> Iterator[Path]:
    """``utils.atomic.atomic_directory`` whose temporary directory records its owner (``OWNER``) from the start;
    the record is removed before the rename, so the finished directory holds only what the block wrote."""
    with atomic_directory(final, complete=complete) as tmp:
        atomic_write_json(tmp / OWNER, owner_record())
        yield tmp
        (tmp / OWNER).unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------------ leftovers


@dataclass
class Leftover:
    """A temporary preparation directory found in the cache."""

    path: str
    target: str
    """The directory it was building."""
    bytes: int
    pid: int | None
    host: str | None
    alive: bool | None
    """The owner still runs (True), does not (False), or cannot be told (None: another host, or no record)."""
    started: float | None
    command: str | None

    @property
    def stale(self) -> bool:
        return self.alive is False

    @property
    def owner(self) -> str:
        if self.pid is None:
            return "no owner recorded"
        here = "this host" if self.host == socket.gethostname() else f"host {self.host}"
        state = {True: "running", False: "no longer running", None: "cannot be checked from here"}[self.alive]
        return f"pid {self.pid} on {here}, {state}"

    def line(self) -> str:
        """One line for ``data info``: where, how big, whose, and what will happen to it."""
        fate = {True: "in use", False: "stale: the next `data prepare` removes it",
                None: "left alone: delete it by hand if no preparation is writing it"}[self.alive]
        return f"{self.path}  {human_bytes(self.bytes)}  ({self.owner}; {fate})"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "stale": self.stale}


def _read_owner(path: Path) -> dict[str, Any] | None:
    try:
        owner = json.loads((path / OWNER).read_text())
    except (OSError, ValueError):
        return None
    return owner if isinstance(owner, dict) and isinstance(owner.get("pid"), int) else None


def _places(cache_root: Path) -> list[Path]:
    """The directories preparations build in: the converted arrays, the prepared datasets, and each prepared
    dataset (its decoded arrays)."""
    base = Path(cache_root) / CACHE_SUBDIR
    prepared = base / "prepared"
    places = [base, prepared]
    if prepared.is_dir():
        places += sorted(d for d in prepared.iterdir()
                         if d.is_dir() and not d.name.startswith(".") and d.name != "index")  # fmt: skip
    return places


def find_leftovers(cache_root: Path) -> list[Leftover]:
    """Every temporary preparation directory under ``cache_root``, with its owner and whether it runs."""
    found = []
    for place in _places(cache_root):
        if not place.is_dir():
            continue
        for d in sorted(place.iterdir()):
            match = TEMPORARY.match(d.name)
            if match is None or not d.is_dir():
                continue
            owner = _read_owner(d)
            found.append(Leftover(
                path=str(d), target=str(place / match.group("target")), bytes=directory_bytes(d),
                pid=owner["pid"] if owner else None, host=owner.get("host") if owner else None,
                alive=owner_alive(owner) if owner else None, started=owner.get("created") if owner else None,
                command=owner.get("command") if owner else None,
            ))  # fmt: skip
    return found


def _remove(path: Path) -> None:
    """Remove ``path``, its owner record last: a removal cut short is still judged stale next time."""
    for child in path.iterdir():
        if child.name == OWNER:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
    (path / OWNER).unlink(missing_ok=True)
    path.rmdir()


def remove_stale(cache_root: Path, say: Callable[[str], Any] = print) -> list[Leftover]:
    """Remove the stale temporary preparation directories under ``cache_root`` (their owner no longer runs on
    this host), saying so in one line each; say one line about each left alone. Returns the removed ones."""
    removed = []
    for left in find_leftovers(cache_root):
        if left.alive is True:
            say(f"[data] {left.path} is being written by a running preparation ({left.owner}): left alone")
            continue
        if left.alive is None:
            say(f"[data] left {left.path} ({human_bytes(left.bytes)}; {left.owner}) as it is: delete it by hand if "
                "no preparation is writing it")  # fmt: skip
            continue
        try:
            _remove(Path(left.path))
        except FileNotFoundError:  # another process removed it first
            pass
        except OSError as err:
            say(f"[data] could not remove {left.path}, the temporary directory of an interrupted preparation "
                f"({left.owner}): {err.strerror or err}; delete it by hand")  # fmt: skip
            continue
        removed.append(left)
        say(f"[data] removed {left.path} ({human_bytes(left.bytes)}), the temporary directory of an interrupted "
            f"preparation ({left.owner})")  # fmt: skip
    return removed

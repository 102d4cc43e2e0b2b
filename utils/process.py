"""Whether a process recorded earlier (in a lock or an owner file) still runs on this machine, and
whether this process is the first of its job (``is_rank_zero``).

A record holds the process's pid, its start time (``process_start``: clock ticks since boot, from
``/proc/<pid>/stat``) and the machine's boot id (``boot_id``). ``process_alive`` says whether that
process still runs: a pid that no longer exists, one reused by a newer process (another start
time) or a machine restarted since (another boot id) count as gone. Whether the record is from
this host is the caller's question (another host's process cannot be seen from here).
"""

from __future__ import annotations

import os
from pathlib import Path


def boot_id() -> str | None:
    """This machine's boot id (Linux), or None where unknown."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def process_start(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat`` field 22), or
    None where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:  # the command name (field 2) may hold spaces and parentheses: split after its last ')'
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (IndexError, ValueError):
        return None


def process_alive(pid: int, *, start: int | str | None = None, boot: str | None = None) -> bool:
    """Whether process ``pid`` of this machine still runs and is the one recorded: with ``start``
    (its ``process_start`` then), a pid now held by a process that started at another time is
    not; with ``boot`` (``boot_id`` then), nothing from before a restart is."""
    now_boot = boot_id()
    if boot and now_boot and boot != now_boot:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        pass
    now = process_start(int(pid))
    return not (start is not None and now is not None and str(start) != str(now))


def is_rank_zero() -> bool:
    """Whether this process is the job's first (rank 0): every rank variable is 0 or unset."""
    for var in ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID"):
        try:
            if int(os.environ.get(var) or 0) != 0:
                return False
        except ValueError:
            continue
    return True

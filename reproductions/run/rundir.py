"""The run directory's name and rules: ``<root>/<experiment>/<variant>/seed<k>/`` with the experiment
named by its config (``experiment_name``); one run at a time (a lock, taken by the job's first
process, ``utils.process.is_rank_zero``), a finished run is never overwritten by accident, and a fresh attempt
starts without the checkpoints of an earlier one.

Lock. ``<run dir>/run.lock`` is created atomically (``O_CREAT | O_EXCL``) by the run that uses
the directory and holds JSON: pid, host, start time, the command, the process's start time in
clock ticks (so a recycled pid is not mistaken for the run) and the SLURM job, if any. It is
removed when the run ends, however it ends short of SIGKILL. A second run into the same
directory refuses at once, naming the holder. A lock left by a process that is gone (same host,
pid dead or recycled; or the same SLURM job, requeued onto another node) is stale: the next run
takes it over and says so in one line. A lock held on another host cannot be checked from here;
the message says which file to delete once that run is known to be gone.

A launcher (``repro sweep``) takes a run's lock before it touches the run's files (its
``stdout.log``) and holds it for the run it starts (``for_children``): that run, a process below
the launcher, continues under the launcher's lock instead of refusing it; any other process is
refused as before, so two sweeps of one root never write into one run.

Overwrite. ``fit`` into a directory whose ``results.json`` says ``finished`` refuses unless
``--run.overwrite true``; resuming the run's own checkpoint is allowed (it continues that run).

Where an existing run lies (``existing_run_dir``). A folder holding two of ``config.yaml``,
``results.json`` and ``checkpoints/`` is a run directory. ``validate``/``test``/``predict`` on a
checkpoint ``<dir>/checkpoints/x.ckpt`` of one, or with its ``<dir>/config.yaml``, act on that
directory where it lies now, never on the ``run.root`` its copied config names (a moved run would
write into the old place, maybe into another run there); ``fit`` does so when its config and its
checkpoint lie in the same run directory (resuming a moved run). Otherwise the run directory is
``<run.root>/<experiment>/<variant>/seed<k>/``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from reproductions.run.errors import RunFailed, UsageError
from utils.process import process_alive, process_start

REPRODUCTIONS_DIR = Path(__file__).resolve().parents[1]  # reproductions/
#: folders whose configs modify an experiment rather than name one (see ``experiment_name``)
OVERLAY_FOLDERS = {"overlays", "sources"}

LOCK_FILE = "run.lock"


class RunDirBusy(RunFailed):
    """Another live run holds the run directory's lock."""


def slurm_job() -> str | None:
    """The SLURM job this process belongs to (``<array job>_<task>`` for an array task), or None."""
    array = os.environ.get("SLURM_ARRAY_JOB_ID")
    if array:
        return f"{array}_{os.environ.get('SLURM_ARRAY_TASK_ID', '')}"
    return os.environ.get("SLURM_JOB_ID")


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe_holder(holder: dict) -> str:
    return (f"pid {holder.get('pid')} on {holder.get('host')}, started {holder.get('started')}"
            + (f", SLURM job {holder['slurm_job']}" if holder.get("slurm_job") else ""))


def is_stale(holder: dict) -> bool:
    """Whether the run that wrote ``holder`` (a lock's content) is gone."""
    job = slurm_job()
    if job and holder.get("slurm_job") == job and holder.get("pid") != os.getpid():
        return True  # this job was requeued: the holder is its earlier incarnation
    if holder.get("host") != platform.node():
        return False  # cannot tell from here
    pid = holder.get("pid")
    return not isinstance(pid, int) or not process_alive(pid, start=holder.get("proc_start"))  # gone or recycled


def read_holder(run_dir: str | os.PathLike, *, wait: bool = False, name: str = LOCK_FILE) -> dict | None:
    """The content of ``run_dir``'s lock: None if there is no lock; {} if it cannot be read (a
    holder between its O_EXCL create and its write, or a crash in between). With ``wait``, an
    unreadable lock is read again for half a second before it counts as unreadable."""
    path = Path(run_dir) / name
    for attempt in range(10 if wait else 1):
        if attempt:
            time.sleep(0.05)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            return data
    return {}


def _parent_pid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _ancestors() -> list[int]:
    """This process's parent, its parent's parent, ... (``/proc``; just the parent where there is none)."""
    chain, pid = [], os.getppid()
    while pid and pid > 1 and pid not in chain and len(chain) < 32:
        chain.append(pid)
        pid = _parent_pid(pid) if Path("/proc").is_dir() else None
    return chain


def held_for_us(holder: dict) -> bool:
    """Whether ``holder`` is a launcher's lock (``for_children``) held by this process or one above it."""
    if not holder.get("for_children") or holder.get("host") != platform.node():
        return False
    pid = holder.get("pid")
    return isinstance(pid, int) and (pid == os.getpid() or pid in _ancestors())


class RunDirLock:
    """``with RunDirLock(run_dir, command): ...``; see the module docstring."""

    def __init__(self, run_dir: str | os.PathLike, command: str = "", *, say=print, for_children: bool = False) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self.command = command
        self.say = say
        self.for_children = for_children  # a launcher's lock, held for the run it starts
        self.held = False
        self.inherited = False  # the lock is a launcher's above this process (held for it)
        self.took_over: dict | None = None

    def _content(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "host": platform.node(),
            "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "command": self.command,
            "proc_start": process_start(os.getpid()),
            "slurm_job": slurm_job(),
            **({"for_children": True} if self.for_children else {}),
        }

    def acquire(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for _ in range(5):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = read_holder(self.run_dir, wait=True, name=self.path.name)
                if holder is None:
                    continue  # released meanwhile: try again
                if held_for_us(holder):
                    self.inherited = True
                    return
                if holder and not is_stale(holder):
                    raise self.busy(holder)
                if self._take_over(holder):
                    self.took_over = holder
                    self.say(f"run directory {self.run_dir}: took over the stale lock of a run that is gone "
                             f"({describe_holder(holder) if holder else 'unreadable lock'})")
                continue
            self.held = True  # from the create on: a signal while it is written still removes it (release)
            with os.fdopen(fd, "w") as f:
                json.dump(self._content(), f)
                f.flush()
                os.fsync(f.fileno())
            return
        raise RunDirBusy(f"run directory {self.run_dir}: could not take {self.path} (other runs keep taking it); "
                         "try again")

    def busy(self, holder: dict) -> RunDirBusy:
        """The error for a lock another live process holds."""
        return RunDirBusy(
            f"run directory {self.run_dir} is in use by another run ({describe_holder(holder)}: "
            f"{_short(holder.get('command') or '?')}); wait for it to end, or choose another --run.root, "
            f"--run.variant or --seed_everything (if that run is gone, delete {self.path})"
        )

    def _take_over(self, holder: dict) -> bool:
        """Remove a stale lock whose content is ``holder``, unless another run replaced it meanwhile."""
        aside = self.path.with_name(f"{LOCK_FILE}.stale.{os.getpid()}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return False
        try:
            moved = json.loads(aside.read_text() or "{}")
        except (OSError, json.JSONDecodeError):
            moved = {}
        if moved != holder and moved and not is_stale(moved):  # a live run's fresh lock: put it back
            try:
                os.link(aside, self.path)
            except OSError:
                pass
            aside.unlink(missing_ok=True)
            return False
        aside.unlink(missing_ok=True)
        return True

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        try:
            holder = json.loads(self.path.read_text())
        except FileNotFoundError:
            return
        except (OSError, json.JSONDecodeError):
            holder = None  # ours, stopped while it was written
        if not isinstance(holder, dict) or (holder.get("pid") == os.getpid() and holder.get("host") == platform.node()):
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> "RunDirLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class ReportLock(RunDirLock):
    """One report at a time per sweep and profile: ``<experiment dir>/report-<profile>.lock``, the same rules as a
    run's lock (atomic create, stale when its process is gone). Two reports at once would write one W&B report
    run into two offline folders at the same step."""

    def __init__(self, experiment_dir: str | os.PathLike, profile: str, command: str = "", *, say=print) -> None:
        super().__init__(experiment_dir, command, say=say)
        self.path = self.run_dir / f"report-{profile}.lock"
        self.profile = profile

    def busy(self, holder: dict) -> RunDirBusy:
        return RunDirBusy(
            f"the {self.profile} report of {self.run_dir} is being written by another process ({describe_holder(holder)}: "
            f"{_short(holder.get('command') or '?')}); wait for it to end and run this one again (if that process is "
            f"gone, delete {self.path})"
        )


def check_root(root: str | os.PathLike, run_dir: str | os.PathLike) -> None:
    """UsageError unless ``run_dir`` (under ``root``) can be created and written: no regular file
    in the way, the first existing folder writable."""
    path = Path(run_dir)
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"--run.root {root}: {existing} is a file, not a directory; choose a --run.root "
                         "under a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"--run.root {root}: {existing} is not writable; choose a --run.root you can write to")


def finished_results(run_dir: str | os.PathLike) -> dict | None:
    """The finished run's results in ``run_dir`` (results.json with status finished), or None."""
    path = Path(run_dir) / "results.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) and data.get("status") == "finished" else None


def stale_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """Checkpoints and temporary files of an earlier attempt in ``<run_dir>/checkpoints``."""
    folder = Path(run_dir) / "checkpoints"
    if not folder.is_dir():
        return []
    return sorted([*folder.glob("best-*.ckpt"), *folder.glob("last.ckpt"), *folder.glob("last-v*.ckpt"),
                   *folder.glob(".*.tmp")])


#: what a run directory holds; a folder with two of them is one (``is_run_dir``)
RUN_MARKERS = ("config.yaml", "results.json", "checkpoints")


def is_run_dir(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` holds a run: two of its config.yaml, results.json and checkpoints/."""
    return sum((Path(folder) / name).exists() for name in RUN_MARKERS) >= 2


def checkpoint_run_dir(ckpt_path) -> Path | None:
    """``<run dir>/checkpoints/x.ckpt`` -> ``<run dir>``, where it lies; None for a checkpoint
    elsewhere, a keyword (``last``) or none."""
    if not ckpt_path:
        return None
    path = Path(str(ckpt_path))
    if path.parent.name != "checkpoints" or not is_run_dir(path.parent.parent):
        return None
    return path.parent.parent


def config_run_dir(config_paths: list) -> Path | None:
    """The run directory whose own ``config.yaml`` is among ``config_paths`` (the last such), or None."""
    for p in reversed(list(config_paths or [])):
        path = Path(str(p))
        if path.name == "config.yaml" and is_run_dir(path.parent):
            return path.parent
    return None


def existing_run_dir(subcommand: str, ckpt_path, config_paths: list) -> Path | None:
    """The run directory a command acts on, taken from where its checkpoint or its config lies (see
    the module docstring); None: the run directory is the one ``run.root`` and the names make."""
    by_ckpt, by_config = checkpoint_run_dir(ckpt_path), config_run_dir(config_paths)
    if subcommand == "fit":  # a checkpoint alone may be another run's, whose weights start a new run
        if by_ckpt is None or by_config is None or by_ckpt.resolve() != by_config.resolve():
            return None
    return by_ckpt or by_config


def recorded_experiment(run_dir: str | os.PathLike) -> str | None:
    """The experiment the run in ``run_dir`` recorded in its results.json, or None."""
    try:
        data = json.loads((Path(run_dir) / "results.json").read_text())
    except (OSError, ValueError):
        return None
    experiment = data.get("experiment") if isinstance(data, dict) else None
    return experiment if isinstance(experiment, str) and experiment else None


def experiment_name(config_paths: list) -> str:
    """``reproductions/vit/configs/digits.yaml`` -> ``vit/digits``; no config -> ``default``.

    The last config names the experiment, skipping overlays: files in a folder named
    ``overlays`` (e.g. ``vit/configs/overlays/fsdp.yaml``: how a run is executed) or ``sources``
    (e.g. ``bst/sources/movielens_1m.yaml``: which data it reads). So ``--config
    bst/configs/wdl.yaml --config bst/sources/movielens_1m.yaml`` is ``bst/wdl``, and two models
    given the same overlay never share a run directory.
    """
    experiments = [p for p in config_paths if not OVERLAY_FOLDERS & set(Path(str(p)).parts[:-1])]
    if not experiments:
        return "default" if not config_paths else Path(str(config_paths[-1])).stem
    path = Path(str(experiments[-1])).resolve()
    try:
        rel = path.relative_to(REPRODUCTIONS_DIR)
    except ValueError:
        return path.stem
    parts = [p for p in rel.with_suffix("").parts if p != "configs"]
    return "/".join(parts)



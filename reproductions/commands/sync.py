"""``repro sync PATH [--dry-run]``: upload the offline W&B runs under PATH.

    repro sync runs/vit/position-cpu            # a sweep: its runs and its report run
    repro sync runs/vit/position-cpu/pos_embed=none/seed0 --dry-run

Finds every offline W&B run under PATH (training runs, their ``test``/``validate`` runs and
report runs: each ``wandb/offline-run-*`` folder), prints what it will upload and what it skips,
and hands the rest to W&B's own ``wandb sync`` (one call, every folder named: no shell globbing).

- A run directory is one W&B run: a resumed run has one ``offline-run-*-<id>`` folder per
  process, all with the same id; ``wandb sync`` replays them in order of their start.
- Already uploaded: W&B marks an uploaded run file with ``<file>.synced``; such folders are skipped.
- Replaced: a fit that started over in its directory (``--run.overwrite true``, or a fresh attempt
  after an unfinished one) took a new id (``wandb/run_id``); the earlier attempt's folders are
  skipped unless ``--all``.
- Model artifacts of offline runs (``--run.log_model true``) wait in ``<run dir>/wandb/
  pending_artifacts.json`` with their checkpoints as paths relative to the run directory
  (``reproductions.run.artifacts``): after the runs are uploaded, each is logged into its run
  (resumed by id) from the files where they lie now, and marked uploaded. ``--dry-run`` lists
  them with their files (size, or missing).

Uploading needs a W&B key (``wandb login`` or ``WANDB_API_KEY``); ``--dry-run`` does not.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from reproductions.run.artifacts import DEFAULT_UPLOAD_TIMEOUT, entry_files, entry_state, find_pending, upload_pending
from reproductions.run.errors import RunFailed, UsageError
from reproductions.run.tracking import base_url, key_source, offline_folder, read_run_id
from utils.net import connection_problem



@dataclass
class OfflineRun:
    folder: Path  # <dir>/wandb/offline-run-<time>-<id>
    run_id: str
    started: str  # yyyymmdd_hhmmss
    state: str  # "to upload", "uploaded", "replaced", "no run file"

    @property
    def owner(self) -> Path:
        """The directory whose W&B run this is (the folder above ``wandb/``)."""
        return self.folder.parent.parent


def _state(folder: Path, run_id: str) -> str:
    files = sorted(folder.glob("*.wandb"))
    if not files:
        return "no run file"
    if all(Path(f"{f}.synced").exists() for f in files):
        return "uploaded"
    kept = read_run_id(folder.parent.parent)
    if kept is not None and kept != run_id:
        return "replaced"
    return "to upload"


def find_offline_runs(path: str | os.PathLike) -> list[OfflineRun]:
    """Every offline W&B run folder under ``path`` (``path`` itself may be one), by owner and start."""
    root = Path(path)
    folders = [root] if offline_folder(root.name) else sorted(root.rglob("offline-run-*"))
    runs = []
    for folder in folders:
        parsed = offline_folder(folder.name)
        if parsed is None or not folder.is_dir() or folder.parent.name != "wandb":
            continue
        started, run_id, _ = parsed
        runs.append(OfflineRun(folder, run_id, started, _state(folder, run_id)))
    return sorted(runs, key=lambda r: (str(r.owner), r.started, offline_folder(r.folder.name)[2]))


def _show(run: OfflineRun, base: Path) -> str:
    try:
        where = run.owner.relative_to(base)
    except ValueError:
        where = run.owner
    return f"{str(where) if str(where) != '.' else run.owner.name}  {run.run_id}  {run.started}  ({run.folder.name})"


def _wandb_command() -> list[str]:
    exe = Path(sys.executable).with_name("wandb")
    if exe.is_file():
        return [str(exe)]
    found = shutil.which("wandb")
    return [found] if found else [sys.executable, "-m", "wandb"]


def _size(n: int | None) -> str:
    return "missing" if n is None else f"{n / 1e6:.2f} MB"


def _show_artifact(owner: Path, entry: dict, base: Path) -> str:
    try:
        where = owner.relative_to(base).as_posix()
    except ValueError:
        where = str(owner)
    files = ", ".join(f"{p.relative_to(owner).as_posix() if p.is_relative_to(owner) else p} {_size(n)}"
                      for _, p, n in entry_files(owner, entry))  # fmt: skip
    aliases = ", ".join(entry.get("aliases") or [])
    return f"{where if where != '.' else owner.name}  {entry['name']} ({entry.get('type')}; {aliases}): {files}"


def run_wandb_sync(command: list[str], env: dict[str, str]) -> int:
    """``wandb sync`` in a child process; its exit status."""
    return subprocess.run(command, env=env).returncode


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    p = argparse.ArgumentParser(
        prog="repro sync",
        description="Upload the offline W&B runs under PATH (training, test/validate and report runs) with wandb sync.",
        allow_abbrev=False,
    )
    p.add_argument("path", help="a run directory, a sweep's directory (runs/vit/position-cpu), or runs/")
    p.add_argument("--dry-run", action="store_true", help="list what would be uploaded; upload nothing")
    p.add_argument("--all", action="store_true", help="also upload the runs of replaced attempts")
    p.add_argument("--project", default=None, help="upload into this W&B project instead of the runs' own")
    p.add_argument("--entity", default=None, help="upload into this W&B entity (team or user)")
    p.add_argument("--artifact-timeout", type=float, default=DEFAULT_UPLOAD_TIMEOUT, metavar="SECONDS",
                   help="seconds one pending model artifact may take to upload (default %(default)g)")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    root = Path(args.path)
    if not root.exists():
        raise UsageError(f"{root} does not exist; give a run directory or a sweep's directory (e.g. runs/)")
    runs = find_offline_runs(root)
    if not runs:
        raise UsageError(f"no offline W&B runs under {root} (folders wandb/offline-run-*); runs log to W&B "
                         "with --run.wandb true (sweep --wandb)")
    wanted = {"to upload", "replaced"} if args.all else {"to upload"}
    todo = [r for r in runs if r.state in wanted]
    skipped = [r for r in runs if r.state not in wanted]
    ids = {r.run_id for r in todo}
    verb = "would upload" if args.dry_run else "uploading"
    print(f"sync {root}: {len(runs)} offline run folder(s); {verb} {len(todo)} ({len(ids)} W&B run(s)), "
          f"skipping {len(skipped)}", file=out)
    for r in todo:
        print(f"  upload  {_show(r, root)}", file=out)
    for r in skipped:
        why = {"uploaded": "already uploaded", "replaced": "replaced attempt (--all uploads it)"}.get(r.state, r.state)
        print(f"  skip    {_show(r, root)}: {why}", file=out)
    pending = [(owner, entry, entry_state(owner, entry)) for owner, entry in find_pending(root)]
    art_todo = [(owner, entry) for owner, entry, state in pending if state == "to upload"]
    if pending:
        print(f"model artifacts of offline runs: {verb} {len(art_todo)}, skipping {len(pending) - len(art_todo)}",
              file=out)  # fmt: skip
    for owner, entry, state in pending:
        why = {"uploaded": "already uploaded", "replaced": "of a replaced attempt (its checkpoints were removed)",
               "files missing": "files missing"}.get(state)  # fmt: skip
        print(f"  {'artifact' if why is None else 'skip    '}  {_show_artifact(owner, entry, root)}"
              + (f": {why}" if why else ""), file=out)
    if args.dry_run or not (todo or art_todo):
        print("nothing to upload" if not (todo or art_todo) else "dry run: nothing uploaded", file=out)
        return 0
    url = base_url()
    source = key_source(url)
    if source is None or source.startswith("a key wandb refuses"):
        raise UsageError(f"{'no W&B key' if source is None else source} for {url} (WANDB_API_KEY, or wandb login; "
                         "WANDB_BASE_URL or wandb login --host for another server); log in first, or use --dry-run")
    why = connection_problem(url, timeout=10.0)
    if why is not None:
        raise RunFailed(f"W&B server {url} is not reachable ({why}); nothing uploaded: check the network or "
                        "WANDB_BASE_URL, then rerun")
    left: list[OfflineRun] = []
    if todo:
        command = [*_wandb_command(), "sync", "--yes", "--include-synced" if args.all else "--skip-synced"]
        command += [*(["--project", args.project] if args.project else []),
                    *(["--entity", args.entity] if args.entity else [])]  # fmt: skip
        command += [str(r.folder) for r in todo]
        env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}  # an offline default must not stop the upload
        status = run_wandb_sync(command, env)
        if status != 0:
            raise RunFailed(f"wandb sync exited with status {status}; see its output above, then rerun "
                            f"repro sync {root}")
        left = [r for r in find_offline_runs(root) if r.state == "to upload" and r.folder in {t.folder for t in todo}]
    # an artifact goes into its run once the run is uploaded
    waiting = {r.run_id for r in left}
    failed = []
    for owner, entry in art_todo:
        if entry["run_id"] in waiting:
            failed.append(f"{entry['name']} (its run is not uploaded)")
            continue
        try:
            upload_pending(owner, entry, project=args.project, entity=args.entity, timeout=args.artifact_timeout)
        except RunFailed as e:
            print(f"  {e}", file=out)
            failed.append(entry["name"])
    print(f"uploaded {len(todo) - len(left)} of {len(todo)} folder(s)" + (f"; not marked uploaded: "
          f"{', '.join(r.folder.name for r in left)} (rerun to retry)" if left else "")
          + (f"; {len(art_todo) - len(failed)} of {len(art_todo)} model artifact(s)" if art_todo else "")
          + (f"; not uploaded: {', '.join(failed)} (rerun to retry)" if failed else ""), file=out)
    return 0 if not (left or failed) else 1

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

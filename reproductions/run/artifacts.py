"""A run's model artifact (``--run.log_model true``) and a report run's tables: logged at once online,
kept pending offline.

Online, the last and the best checkpoint go into W&B as one model artifact (``model-<run id>``,
aliases ``last``, ``best``, ``variant-<name>``, ``seed-<k>``; the run's results summary as its
metadata) when the fit ends.

Offline, W&B itself would stage the files and record their absolute paths in the offline run
file, which a copy of the run directory elsewhere could not upload. So an offline run logs no
artifact; it records the pending one in ``<run dir>/wandb/pending_artifacts.json`` (name, type,
aliases, metadata, run id and project, and the checkpoint files as paths relative to the run
directory), and ``repro sync`` logs it after uploading the run: it resumes the
uploaded run (``resume="must"``), logs the artifact from the files where they are now, waits for
it within a bounded time, finishes, and marks the entry uploaded (``"uploaded": <time>``).

A report run's tables go the same way (``keep_tables``): offline W&B would stage each ``wandb.Table``
as an artifact file recorded by absolute path, so they are kept as JSON files under
``<dir>/wandb/tables/`` with a pending entry of type ``tables``, and ``repro sync`` logs them into
the uploaded run.

A new pending entry replaces the entries not yet uploaded of the same name and those of an
earlier attempt's run id (a fresh fit removed their checkpoints).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from reproductions.run.errors import RunFailed
from reproductions.run.tracking import init_timeout, offline_folder, read_run_id, results_summary, wandb_runs
from utils.atomic import atomic_write_json

#: the file that keeps a run directory's model artifacts that are not uploaded yet, under it
PENDING_FILE = Path("wandb") / "pending_artifacts.json"
#: the pending entry type of an offline run's tables (``keep_tables``)
TABLES = "tables"
#: seconds ``sync`` waits for one artifact's files to upload (``--artifact-timeout``)
DEFAULT_UPLOAD_TIMEOUT = 600.0


def checkpoint_files(checkpoint_dir: Path, results: dict) -> dict[str, Path]:
    """The run's last and best checkpoints that exist, by alias."""
    files = {"last": Path(checkpoint_dir) / "last.ckpt"}
    best = (results.get("best") or {}).get("path")
    if best:
        files["best"] = Path(best)
    return {alias: path for alias, path in files.items() if path.is_file()}


def model_aliases(files: dict[str, Path], results: dict) -> list[str]:
    aliases = [*files, f"variant-{results.get('variant')}", f"seed-{results.get('seed')}"]
    return [a.replace("=", "-").replace("/", "-") for a in aliases]


def log_checkpoints(loggers, checkpoint_dir: Path, results: dict, run_dir: Path | None = None) -> None:
    """Log the run's last and best checkpoints as one W&B model artifact (``model-<run id>``) with
    the run's results summary as metadata; an offline run records it as pending under
    ``run_dir`` (default: the folder above ``checkpoint_dir``) for ``sync`` to log."""
    import wandb

    files = checkpoint_files(checkpoint_dir, results)
    if not files:
        return
    run_dir = Path(run_dir) if run_dir is not None else Path(checkpoint_dir).parent
    for run in wandb_runs(loggers):
        name, aliases, metadata = f"model-{run.id}", model_aliases(files, results), results_summary(results)
        if run.offline:
            keep_pending(run_dir, {"name": name, "type": "model", "run_id": run.id, "project": run.project,
                                   "entity": run.entity or None, "aliases": aliases, "metadata": metadata,
                                   "files": _relative_files(run_dir, files)})  # fmt: skip
            continue
        artifact = wandb.Artifact(name, type="model", metadata=metadata)
        for path in dict.fromkeys(files.values()):
            artifact.add_file(str(path), name=path.name)
        run.log_artifact(artifact, aliases=aliases)


def keep_tables(run, run_dir: str | os.PathLike, tables: dict[str, tuple[list[str], list[list[Any]]]]) -> None:
    """Keep ``tables`` (W&B key -> (columns, rows)) of the offline ``run`` as JSON files under
    ``<run_dir>/wandb/tables/`` and one pending entry of type ``TABLES`` (relative paths), which
    ``repro sync`` logs into the uploaded run as ``wandb.Table``s. Logged offline, W&B would stage
    each table as an artifact file recorded by absolute path, which a moved tree could not upload."""
    run_dir = Path(run_dir)
    folder = run_dir / "wandb" / "tables"
    paths = {}
    for key, (columns, rows) in tables.items():
        path = folder / f"{run.id}-{key.replace('/', '-')}.table.json"
        atomic_write_json(path, {"columns": list(columns), "data": [list(r) for r in rows]})
        paths[key] = path
    keep_pending(run_dir, {"name": f"tables-{run.id}", "type": TABLES, "run_id": run.id, "project": run.project,
                           "entity": run.entity or None, "aliases": [], "metadata": None,
                           "files": [{**f, "name": key} for key, f in zip(paths, _relative_files(run_dir, paths))]})


def read_table(path: str | os.PathLike) -> dict[str, Any]:
    """A table kept by ``keep_tables``: ``{"columns": [...], "data": [[...], ...]}``."""
    data = json.loads(Path(path).read_text())
    return {"columns": data["columns"], "data": data["data"]}


def _relative_files(run_dir: Path, files: dict[str, Path]) -> list[dict[str, Any]]:
    out = []
    for path in dict.fromkeys(files.values()):
        try:
            where = path.resolve().relative_to(run_dir.resolve()).as_posix()
        except ValueError:  # a checkpoint folder outside the run directory: it cannot move with it
            where = str(path.resolve())
        out.append({"name": path.name, "path": where, "bytes": path.stat().st_size})
    return out


# --------------------------------------------------------------------------- the pending file


def read_pending(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The artifact entries kept in ``run_dir`` (``wandb/pending_artifacts.json``), uploaded or not."""
    try:
        data = json.loads((Path(run_dir) / PENDING_FILE).read_text())
    except (OSError, ValueError):
        return []
    entries = data.get("artifacts") if isinstance(data, dict) else None
    return [e for e in entries or [] if isinstance(e, dict) and e.get("name") and e.get("run_id")]


def _write_pending(run_dir: Path, entries: list[dict[str, Any]]) -> None:
    atomic_write_json(Path(run_dir) / PENDING_FILE, {"artifacts": entries}, indent=1)


def keep_pending(run_dir: str | os.PathLike, entry: dict[str, Any]) -> None:
    """Add ``entry`` to the run directory's pending artifacts (see the module docstring)."""
    kept = [e for e in read_pending(run_dir)
            if e.get("uploaded") or (e["name"] != entry["name"] and e["run_id"] == entry["run_id"])]  # fmt: skip
    _write_pending(Path(run_dir), [*kept, {**entry, "recorded": _now(), "uploaded": None}])


def mark_uploaded(run_dir: str | os.PathLike, entry: dict[str, Any]) -> None:
    entries = read_pending(run_dir)
    for e in entries:
        if (e["name"], e["run_id"], e.get("recorded")) == (entry["name"], entry["run_id"], entry.get("recorded")):
            e["uploaded"] = _now()
    _write_pending(Path(run_dir), entries)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def entry_files(run_dir: str | os.PathLike, entry: dict[str, Any]) -> list[tuple[str, Path, int | None]]:
    """``(name in the artifact, path now, size or None if missing)`` for each file of ``entry``."""
    out = []
    for f in entry.get("files") or []:
        path = Path(run_dir) / f["path"]  # a relative path is under the run directory, wherever it is now
        out.append((f["name"], path, path.stat().st_size if path.is_file() else None))
    return out


def entry_state(run_dir: str | os.PathLike, entry: dict[str, Any]) -> str:
    """``to upload``, ``uploaded``, ``replaced`` (the directory's run id changed) or ``files missing``."""
    if entry.get("uploaded"):
        return "uploaded"
    kept = read_run_id(run_dir)
    if kept is not None and kept != entry["run_id"]:
        return "replaced"
    if any(size is None for _, _, size in entry_files(run_dir, entry)):
        return "files missing"
    return "to upload"


def find_pending(root: str | os.PathLike) -> list[tuple[Path, dict[str, Any]]]:
    """Every artifact entry kept under ``root`` (a run directory, a folder of them, or one offline
    run folder ``<dir>/wandb/offline-run-*``), as ``(run directory, entry)``."""
    root = Path(root)
    parsed = offline_folder(root.name)
    if parsed is not None and root.parent.name == "wandb":
        run_id = parsed[1]
        return [(root.parent.parent, e) for e in read_pending(root.parent.parent) if e["run_id"] == run_id]
    files = sorted(root.rglob(PENDING_FILE.name))
    return [(f.parent.parent, e) for f in files if f.parent.name == "wandb" for e in read_pending(f.parent.parent)]


# --------------------------------------------------------------------------- upload


def upload_pending(run_dir: str | os.PathLike, entry: dict[str, Any], *, project: str | None = None,
                   entity: str | None = None, timeout: float = DEFAULT_UPLOAD_TIMEOUT) -> None:
    """Log the pending artifact ``entry`` of ``run_dir`` into its (uploaded) W&B run, then mark it
    uploaded. Bounded: the resume waits ``init_timeout()`` seconds for the server, the artifact's
    upload ``timeout`` seconds. Raises ``RunFailed`` (nothing marked) if a file is missing or
    W&B fails."""
    import wandb

    files = entry_files(run_dir, entry)
    missing = [str(path) for _, path, size in files if size is None]
    if missing:
        raise RunFailed(f"artifact {entry['name']}: missing {', '.join(missing)}")
    settings = wandb.Settings(init_timeout=init_timeout(), console="off", x_disable_stats=True, disable_git=True,
                              save_code=False, silent=True)  # fmt: skip (sync says what happened, in its own lines)
    # the resumed run's own files go to a temporary folder: the run directory keeps only the offline run
    with tempfile.TemporaryDirectory(prefix="wandb-artifact-") as tmp:
        try:
            run = wandb.init(id=entry["run_id"], project=project or entry.get("project"),
                             entity=entity or entry.get("entity") or None, resume="must", mode="online", dir=tmp,
                             reinit="finish_previous", settings=settings)  # fmt: skip
        except Exception as e:  # noqa: BLE001 - no such run, a refused key, a timeout
            raise RunFailed(f"artifact {entry['name']}: W&B did not resume run {entry['run_id']} ({_why(e)})") from e
        try:
            if entry.get("type") == TABLES:
                # the tables W&B would have staged offline: read from where they lie now, logged into the run
                run.log({name: wandb.Table(**read_table(path)) for name, path, _ in files})
            else:
                artifact = wandb.Artifact(entry["name"], type=entry.get("type") or "model",
                                          metadata=entry.get("metadata"))
                for name, path, _ in files:
                    # immutable: uploaded from where it lies, with no staged copy
                    artifact.add_file(str(path), name=name, policy="immutable", skip_cache=True)
                run.log_artifact(artifact, aliases=list(entry.get("aliases") or [])).wait(timeout=int(timeout))
        except Exception as e:  # noqa: BLE001 - an upload that failed or did not finish in time
            raise RunFailed(f"artifact {entry['name']}: not uploaded ({_why(e)})") from e
        finally:
            run.finish()
    mark_uploaded(run_dir, entry)


def _why(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__

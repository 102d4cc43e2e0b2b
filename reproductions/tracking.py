"""Weights & Biases: one W&B run per run directory, kept with it, and what goes into it.

One run directory is one W&B run. Its id is chosen when a W&B-logging fit first uses the
directory and kept in ``<run dir>/wandb/run_id`` (written atomically, by global rank 0 only);
every later process that resumes the run (``--ckpt_path`` of this directory, a SLURM requeue)
continues that W&B run (``id=..., resume="allow"``), and logs at the trainer's step, so the
step axis goes on where the checkpoint left it. A fit that starts from step 0 (``--run.overwrite
true``, or a fresh attempt after an unfinished one, whose checkpoints are removed) takes a new id.
``validate``/``test`` on a run's checkpoint make a run of their own in the same group, named
``<experiment>/<variant>/seed<k>/<command>``, with the fit's run id in its config
(``fit_run_id``): an evaluation never rewrites the fit run's history or summary.

Everything the run's W&B records refer to lies under the run directory, by relative path, so a
copy of the directory elsewhere uploads completely: the offline run files (``wandb/offline-run-*``,
with copies of the run's files in ``files/``, ``save_with_run``), W&B's data folder (``wandb/data``:
``WANDB_DATA_DIR``), its cache and downloads (``wandb/cache``, ``wandb/artifacts``), and an offline
run's pending model artifact (``wandb/pending_artifacts.json``, ``reproductions.artifacts``).

Mode: offline unless the user has a W&B key (env or netrc) or chose a mode via WANDB_MODE. An
online run whose server does not answer within ``WANDB_INIT_TIMEOUT`` seconds (default 30)
says so in one line and goes on offline under the same id (``repro sync``
uploads it later); with ``WANDB_MODE=online`` it stops with one error line instead.

Summary: ``results_summary`` maps the fields of results.json onto flat summary keys, so the W&B
runs table can sort and group by test accuracy, fit time, throughput or FLOPs like the report.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

from reproductions.errors import RunFailed
from utils.atomic import atomic_write_text

#: the file that keeps a directory's W&B run id, under the directory
RUN_ID_FILE = Path("wandb") / "run_id"
#: seconds an online run waits for the W&B server before it goes on offline (WANDB_INIT_TIMEOUT)
DEFAULT_INIT_TIMEOUT = 30.0
_ID = re.compile(r"^[a-z0-9]{1,64}$")


def wandb_offline() -> bool:
    """Offline unless the user has a W&B key (env or netrc) or chose a mode via WANDB_MODE."""
    mode = os.environ.get("WANDB_MODE")
    if mode:
        return mode in ("offline", "dryrun")
    if os.environ.get("WANDB_API_KEY"):
        return False
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        return "api.wandb.ai" not in netrc.read_text()
    except OSError:
        return True


def online_only() -> bool:
    """The user asked for online and nothing else (``WANDB_MODE=online``)."""
    return os.environ.get("WANDB_MODE") == "online"


def init_timeout() -> float:
    """``WANDB_INIT_TIMEOUT`` seconds, else ``DEFAULT_INIT_TIMEOUT``."""
    try:
        return float(os.environ.get("WANDB_INIT_TIMEOUT") or DEFAULT_INIT_TIMEOUT)
    except ValueError:
        return DEFAULT_INIT_TIMEOUT


# --------------------------------------------------------------------------- ids and files


#: an offline run folder: ``offline-run-<date>_<time>-<id>``, and ``-<n>`` when one of the same run
#: started in the same second already had the name (a quick resume, a second report)
_OFFLINE_FOLDER = re.compile(r"^offline-run-(\d{8}_\d{6})-([a-z0-9]+)(?:-(\d+))?$")


def offline_folder(name: str) -> tuple[str, str, int] | None:
    """``(start yyyymmdd_hhmmss, run id, n)`` of an offline W&B run folder's name (n: the ``-<n>``
    suffix, 0 without), or None if ``name`` is not one."""
    m = _OFFLINE_FOLDER.match(name)
    if m is None:
        return None
    return m.group(1), m.group(2), int(m.group(3) or 0)


def read_run_id(directory: str | os.PathLike) -> str | None:
    """The W&B run id kept in ``directory`` (``wandb/run_id``), or None."""
    try:
        text = (Path(directory) / RUN_ID_FILE).read_text().strip()
    except OSError:
        return None
    return text if _ID.match(text) else None


def keep_run_id(directory: str | os.PathLike, *, fresh: bool = False) -> str:
    """The directory's W&B run id: the kept one, or (none kept, or ``fresh``) a new one, written
    atomically to ``wandb/run_id``. Call it on global rank 0 only."""
    from wandb.sdk.lib.runid import generate_id

    kept = None if fresh else read_run_id(directory)
    if kept is not None:
        return kept
    new = generate_id()
    atomic_write_text(Path(directory) / RUN_ID_FILE, new + "\n")
    return new


def keep_files_under(wandb_dir: str | os.PathLike) -> None:
    """Point W&B's data, cache and artifact folders into ``wandb_dir`` (the run's own), so the
    staged copies of artifact files and everything else a run refers to stay with the run. W&B
    reads these when it stages a file; its login settings (WANDB_CONFIG_DIR) stay the user's."""
    wandb_dir = Path(wandb_dir).resolve()
    for var, sub in (("WANDB_DATA_DIR", "data"), ("WANDB_CACHE_DIR", "cache"), ("WANDB_ARTIFACT_DIR", "artifacts")):
        os.environ[var] = str(wandb_dir / sub)
        (wandb_dir / sub).mkdir(parents=True, exist_ok=True)


def init_run(init: dict[str, Any], *, say=None):
    """``wandb.init(**init)`` that never hangs on an unreachable server: online, it waits
    ``init_timeout()`` seconds, then says so in one line and starts the same run offline (or,
    with ``WANDB_MODE=online``, raises ``RunFailed``). ``init["dir"]`` is the folder that holds
    ``wandb/``; W&B's data and cache folders are pointed under it first."""
    import wandb

    say = say or (lambda m: print(m, file=sys.stderr, flush=True))
    keep_files_under(Path(init["dir"]) / "wandb")
    settings = init.pop("settings", None) or wandb.Settings()
    settings.init_timeout = init_timeout()
    try:
        run = wandb.init(**init, settings=settings)
    except Exception as e:  # noqa: BLE001 - W&B's CommError, a timeout, a refused key: all mean "not now"
        if init.get("mode") == "offline":
            raise
        where = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")
        why = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        try:  # the service still holds the run that did not start (and prints its farewell now, not last)
            wandb.teardown()
        except Exception:  # noqa: BLE001
            pass
        if online_only():
            raise RunFailed(f"W&B server {where} did not start the run within {settings.init_timeout:g} s ({why}); "
                            "WANDB_MODE=online asks for online only: check the server and key, or unset WANDB_MODE "
                            "to go on offline") from e
        say(f"W&B: server {where} did not start the run within {settings.init_timeout:g} s ({why}); going on "
            f"offline under {Path(init['dir']) / 'wandb'}; upload later: repro sync "
            f"{init['dir']}")
        run = wandb.init(**{**init, "mode": "offline"}, settings=settings)
    relative_links(run.settings.sync_dir)
    return run


def run_facts(trainer=None) -> dict[str, Any]:
    """What the config does not say about a run: the code (git commit), the hardware and host,
    the versions; the W&B config's ``facts``."""
    import platform

    from reproductions.results import git_state, hardware, package_versions

    try:
        device = trainer.strategy.root_device.type if trainer is not None else None
    except Exception:  # noqa: BLE001 - a strategy that is not set up yet: the default device
        device = None
    git = git_state()
    return {"git_commit": git.get("commit"), "git_dirty": git.get("dirty"), "hardware": hardware(device),
            "host": platform.node(), "versions": package_versions()}


def _logger_class():
    from lightning.pytorch.loggers import WandbLogger
    from lightning.pytorch.loggers.logger import rank_zero_experiment
    from lightning.pytorch.utilities import rank_zero_only

    class RunLogger(WandbLogger):
        """Lightning's WandbLogger for a run directory (see the module docstring): the id kept in
        ``id_dir`` (None: a new run each time), the init that never hangs (``init_run``), history
        at the trainer's step, and the config only as ``log_config`` gives it (Lightning's own
        ``log_hyperparams`` of the module's hyper-parameters would put a flat second copy of
        lr, net, batch size beside the resolved config)."""

        def __init__(self, *, id_dir: Path | None = None, fresh: bool = False, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self._id_dir = id_dir
            self._fresh = fresh

        @property
        @rank_zero_experiment
        def experiment(self):
            if self._experiment is None:
                if self._id_dir is not None:
                    self._wandb_init["id"] = keep_run_id(self._id_dir, fresh=self._fresh)
                    self._fresh = False
                init = {k: v for k, v in self._wandb_init.items() if not (k == "anonymous" and v is None)}
                self._experiment = init_run(init)  # (W&B warns about an "anonymous" it no longer uses)
                self._id = self._experiment.id
                self._experiment.define_metric("trainer/global_step")
                self._experiment.define_metric("*", step_metric="trainer/global_step", step_sync=True)
            return self._experiment

        @rank_zero_only
        def log_hyperparams(self, params, *args, **kwargs) -> None:
            """Ignored: the run config is the resolved config, given once by ``log_config``."""

        @rank_zero_only
        def log_config(self, config: dict[str, Any]) -> None:
            self.experiment.config.update(config, allow_val_change=True)

        @rank_zero_only
        def log_metrics(self, metrics, step: int | None = None) -> None:
            if step is None:
                self.experiment.log(dict(metrics))
                return
            # at the trainer's step: a resumed run goes on where its checkpoint stopped, not at 0
            self.experiment.log({**metrics, "trainer/global_step": step}, step=int(step))

    return RunLogger


def run_logger(*, project: str, group: str, name: str, tags: list[str], log_dir: Path, job_type: str,
               id_dir: Path | None, fresh: bool = False, config: dict[str, Any] | None = None):
    """The W&B logger of a run that writes into ``log_dir`` (see the module docstring)."""
    return _logger_class()(
        project=project, group=group, name=name, tags=tags, save_dir=str(log_dir), job_type=job_type,
        mode="offline" if wandb_offline() else "online", id_dir=id_dir, fresh=fresh, config=config,
        # a run left open in this process (an earlier in-process run, a notebook) is closed first;
        # wandb's default would hand that old run back instead
        reinit="finish_previous",
    )


def save_with_run(run, run_dir: str | os.PathLike, names: list[str]) -> None:
    """Save the files ``names`` of the run directory (results.json, config.yaml, metrics.csv) with
    the run: copied into the run's files folder (``run.dir``) and saved from there. W&B's own
    ``run.save`` of a file elsewhere leaves a symlink to its absolute path, which a copy of the
    run directory on another machine would not resolve."""
    import shutil

    run_dir, files = Path(run_dir), Path(run.dir)
    for name in names:
        path = run_dir / name
        if path.is_file():
            kept = files / name
            kept.unlink(missing_ok=True)  # a link left by an earlier save: replace it, never write through it
            shutil.copyfile(path, kept)
            run.save(str(kept), base_path=str(files), policy="now")


def relative_links(folder: str | os.PathLike) -> None:
    """Make the symlinks W&B leaves in ``folder`` (its ``logs/debug-core.log`` points by absolute
    path into ``wandb/cache``) relative, so they resolve in a copy of the run directory too."""
    for link in Path(folder).rglob("*"):
        if link.is_symlink() and os.path.isabs(target := os.readlink(link)):
            link.unlink()
            link.symlink_to(os.path.relpath(target, link.parent))


#: results.json fields (dotted paths) that go into the W&B run summary, under ``results/<name>``
_SUMMARY_FIELDS = {
    "fit_time_s": "training.fit_time_s",
    "samples_per_sec": "training.samples_per_sec",
    "flops_per_sample": "model.flops_per_sample",
    "total_train_flops": "training.total_train_flops",
    "params": "model.params",
    "epochs": "training.epochs",
    "steps": "training.steps",
    "global_batch_size": "training.global_batch_size",
    "devices": "training.devices",
    "precision": "training.precision",
    "effective_lr": "training.effective_lr",
    "best_score": "best.score",
    "best_monitor": "best.monitor",
    "test_ckpt": "test_ckpt",
    "variant": "variant",
    "seed": "seed",
    "git_commit": "git.commit",
}


def _get(data: dict, path: str) -> Any:
    for key in path.split("."):
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def results_summary(results: dict) -> dict[str, Any]:
    """The W&B run summary of a run: what its results.json says, as flat keys.

    ``status``; the test metrics at the tested checkpoint under their own keys (``test/acc``,
    ``test/auc``, ...); the metrics at the end of training as ``final/<key>``; and
    ``results/<name>`` for fit time, throughput, FLOPs, parameters and the rest of
    ``_SUMMARY_FIELDS``. Missing values are left out.
    """
    summary: dict[str, Any] = {"status": results.get("status")}
    summary.update(results.get("test") or {})
    summary.update({f"final/{k}": v for k, v in (results.get("final") or {}).items()})
    summary.update({f"results/{name}": _get(results, path) for name, path in _SUMMARY_FIELDS.items()})
    return {k: v for k, v in summary.items() if v is not None}


def wandb_runs(loggers) -> list:
    """The live W&B runs among a trainer's loggers (rank zero holds them)."""
    from lightning.pytorch.loggers import WandbLogger

    return [logger.experiment for logger in loggers if isinstance(logger, WandbLogger)]


#: the run directory's files that go with its W&B run
RUN_FILES = ["results.json", "config.yaml", "metrics.csv", "hparams.yaml"]


def log_results(loggers, results: dict, run_dir: str | os.PathLike | None = None) -> None:
    """Put ``results_summary(results)`` into the summary of every W&B run among ``loggers``;
    with ``run_dir``, save its ``RUN_FILES`` with the run (``save_with_run``)."""
    summary = results_summary(results)
    for run in wandb_runs(loggers):
        run.summary.update(summary)
        if run_dir is not None:
            save_with_run(run, run_dir, RUN_FILES)


def log_status(loggers, status: str) -> None:
    """Mark the W&B runs among ``loggers`` with ``status`` (a run that did not finish)."""
    for run in wandb_runs(loggers):
        run.summary["status"] = status

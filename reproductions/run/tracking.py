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
run's pending model artifact (``wandb/pending_artifacts.json``, ``reproductions.run.artifacts``).

Mode (``wandb_mode``): ``WANDB_MODE`` when set; else online when wandb itself has a key for the
server in force (``WANDB_BASE_URL``, ``wandb login --host``, or the library's default host;
``key_source`` asks wandb's own credential readers), offline when it has none. Every run says
which and why in one line as it starts. Before an online start one TCP probe of the server
(``utils.net``): a server known to be down goes offline at once (``WANDB_MODE=online``: one error
line). An online run whose server does not start it within ``WANDB_INIT_TIMEOUT`` seconds
(default 30) says so in one line and goes on offline under the same id (``repro sync`` uploads it
later); with ``WANDB_MODE=online`` it stops with one error line instead.

Summary: ``results_summary`` maps the fields of results.json onto flat summary keys, so the W&B
runs table can sort and group by test accuracy, fit time, throughput or FLOPs like the report.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from reproductions.run.errors import RunFailed
from utils.atomic import atomic_write_text
from utils.stop import pause_at

#: the file that keeps a directory's W&B run id, under the directory
RUN_ID_FILE = Path("wandb") / "run_id"
#: seconds an online run waits for the W&B server before it goes on offline (WANDB_INIT_TIMEOUT)
DEFAULT_INIT_TIMEOUT = 30.0
#: seconds the connection probe before an online run waits at most (a refused connection answers at once)
PROBE_TIMEOUT = 5.0
_ID = re.compile(r"^[a-z0-9]{1,64}$")


def base_url() -> str:
    """The W&B server in force, as wandb itself resolves it: ``WANDB_BASE_URL``, else the host of
    ``wandb login --host`` (its settings file), else the library's default."""
    if os.environ.get("WANDB_BASE_URL"):
        return os.environ["WANDB_BASE_URL"].rstrip("/")
    try:
        from wandb.sdk import wandb_setup

        return str(wandb_setup.singleton().settings.base_url).rstrip("/")
    except Exception:  # noqa: BLE001 - a wandb that cannot set up: its documented default
        return "https://api.wandb.ai"


def key_source(url: str | None = None) -> str | None:
    """Where wandb would take a key for the server ``url`` (default ``base_url()``) from, or None
    when it has none: ``WANDB_API_KEY``, ``WANDB_IDENTITY_TOKEN_FILE``, this process's login, the
    netrc entry for that host (``wandb login`` writes it), or wandb's settings. Asked through
    wandb's own credential readers, so a login to the library's default host or to a
    self-hosted server counts, whatever host name that is."""
    from wandb.errors import AuthenticationError
    from wandb.sdk.lib import wbauth

    url = url or base_url()
    for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE"):
        if os.environ.get(var):
            return var
    try:
        host = wbauth.HostUrl(url)
        if wbauth.session_credentials(host=host) is not None:
            return "this process's wandb.login()"
        if wbauth.read_netrc_auth(host=host):
            return f"the netrc entry for {urlsplit(host.url).netloc}"
    except (AuthenticationError, ValueError) as e:
        return f"a key wandb refuses ({e})"
    try:
        from wandb.sdk import wandb_setup

        settings = wandb_setup.singleton().settings
        if settings.api_key and wbauth.HostUrl(str(settings.base_url)).is_same_url(url):
            return "wandb's settings"
    except Exception:  # noqa: BLE001 - no settings: no key there
        pass
    return None


@dataclass(frozen=True)
class Mode:
    """How a W&B run logs and why, in the words of its one line (``Mode.line``)."""

    offline: bool
    why: str
    url: str

    @property
    def name(self) -> str:
        return "offline" if self.offline else "online"

    def line(self, where: str | os.PathLike | None = None) -> str:
        text = f"W&B: {self.name} ({self.why})"
        if self.offline and where is not None:
            text += f"; upload later: repro sync {where}"
        return text


def wandb_mode(*, probe: bool = False) -> Mode:
    """Online or offline, and why. ``WANDB_MODE`` decides when set; else online when wandb has a
    key for the server in force (``key_source``), offline when it has none. With ``probe``, an
    online choice is checked by one TCP connection first (``utils.net.connection_problem``): a
    server known to be down (refused, unknown host) makes it offline at once, or, with
    ``WANDB_MODE=online``, raises ``RunFailed``, instead of waiting out the init timeout."""
    url = base_url()
    mode = os.environ.get("WANDB_MODE")
    if mode in ("offline", "dryrun", "disabled"):
        return Mode(True, f"WANDB_MODE={mode}", url)
    if mode == "online":
        chosen = Mode(False, f"WANDB_MODE=online, server {url}", url)
    else:
        source = key_source(url)
        if source is None or source.startswith("a key wandb refuses"):
            why = f"no W&B key for {url}" if source is None else f"{source} for {url}"
            return Mode(True, f"{why}; wandb login, or WANDB_API_KEY, to log online", url)
        chosen = Mode(False, f"server {url}, key from {source}", url)
    if probe:
        from utils.net import connection_problem

        problem = connection_problem(url, min(PROBE_TIMEOUT, init_timeout()))
        if problem is not None:
            if online_only():
                raise RunFailed(f"W&B server {url} is not reachable ({problem}); WANDB_MODE=online asks for online "
                                "only: check the server (WANDB_BASE_URL) and network, or unset WANDB_MODE to go on "
                                "offline")
            return Mode(True, f"server {url} is not reachable: {problem}", url)
    return chosen


def wandb_offline() -> bool:
    """Whether a run logs offline now (``wandb_mode``, without the server probe)."""
    return wandb_mode().offline


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
    """``wandb.init(**init)`` that says how it logs and never hangs on an unreachable server.

    Without ``init["mode"]`` the mode is chosen here (``wandb_mode(probe=True)``) and said in one
    line (``W&B: online (server ..., key from ...)`` or ``W&B: offline (why); upload later: repro
    sync <dir>``). Online, it waits ``init_timeout()`` seconds, then says so in one line and starts
    the same run offline (or, with ``WANDB_MODE=online``, raises ``RunFailed``); the online
    attempt's own folder (``wandb/run-*``, logs only) is removed, so the tree holds the offline
    run alone. ``init["dir"]`` is the folder that holds ``wandb/``; W&B's data and cache folders
    are pointed under it first."""
    import time

    import wandb

    say = say or (lambda m: print(m, file=sys.stderr, flush=True))
    wandb_dir = Path(init["dir"]) / "wandb"
    keep_files_under(wandb_dir)
    settings = init.pop("settings", None) or wandb.Settings()
    settings.init_timeout = init_timeout()
    if init.get("mode") is None:
        mode = wandb_mode(probe=True)
        init["mode"] = mode.name
        say(mode.line(init["dir"]))
    started = time.time()
    try:
        pause_at("wandb")  # the test hook (utils/stop.py): a signal while W&B starts
        run = wandb.init(**init, settings=settings)
    except Exception as e:  # noqa: BLE001 - W&B's CommError, a timeout, a refused key: all mean "not now"
        if init.get("mode") == "offline":
            raise
        where = base_url()
        why = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        try:  # the service still holds the run that did not start (and prints its farewell now, not last)
            wandb.teardown()
        except Exception:  # noqa: BLE001
            pass
        remove_failed_starts(wandb_dir, since=started)
        if online_only():
            raise RunFailed(f"W&B server {where} did not start the run within {settings.init_timeout:g} s ({why}); "
                            "WANDB_MODE=online asks for online only: check the server and key, or unset WANDB_MODE "
                            "to go on offline") from e
        say(f"W&B: server {where} did not start the run within {settings.init_timeout:g} s ({why}); going on "
            f"offline under {wandb_dir}; upload later: repro sync {init['dir']}")
        run = wandb.init(**{**init, "mode": "offline"}, settings=settings)
    relative_links(run.settings.sync_dir, within=wandb_dir)
    return run


def remove_failed_starts(wandb_dir: str | os.PathLike, *, since: float) -> list[Path]:
    """Remove the online run folders (``run-<time>-<id>``, not ``offline-run-*``) that a failed
    start made in ``wandb_dir`` at or after ``since`` (epoch seconds): they hold W&B's logs of the
    attempt only, with links by absolute path, and nothing to upload. Returns what was removed."""
    import shutil

    removed = []
    for folder in Path(wandb_dir).glob("run-*"):
        try:
            if folder.is_dir() and not folder.is_symlink() and folder.stat().st_mtime >= since - 1:
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
        except OSError:
            continue
    for link in Path(wandb_dir).glob("latest-run"):
        if link.is_symlink() and not link.exists():
            link.unlink()
    return removed


def run_facts(trainer=None) -> dict[str, Any]:
    """What the config does not say about a run: the code (git commit), the hardware and host,
    the versions; the W&B config's ``facts``."""
    import platform

    from reproductions.run.results import git_state, hardware, package_versions

    try:
        device = trainer.strategy.root_device.type if trainer is not None else None
    except Exception:  # noqa: BLE001 - a strategy that is not set up yet: the default device
        device = None
    git = git_state()
    return {"git_commit": git.get("commit"), "git_dirty": git.get("dirty"), "hardware": hardware(device),
            "host": platform.node(), "versions": package_versions()}


#: metric names (the last part of the key) whose best value is the smallest, and the largest
_LOWER_IS_BETTER = frozenset({"loss", "logloss", "nll"})
_HIGHER_IS_BETTER = frozenset({"acc", "auc", "gauc", "top1", "top5"})


def summary_ops(key: str) -> str | None:
    """What the W&B summary keeps of a logged metric (``define_metric(summary=...)``): for the
    training and validation metrics whose direction is known, the best and the last value
    (``"min,last"`` for losses, ``"max,last"`` for accuracy, AUC, GAUC, few-shot accuracy;
    counts such as ``val/gauc_users`` are not scores), so the
    runs table can compare the best validation accuracy rather than the last logged one; None
    (W&B's default, the last value) for the rest: throughput, clocks, learning rate, and the test
    metrics, whose summary is the tested checkpoint's value (``results_summary``)."""
    if not key.startswith(("val/", "train/")):
        return None
    leaf = key.rsplit("/", 1)[-1]
    if leaf in _LOWER_IS_BETTER:
        return "min,last"
    if leaf in _HIGHER_IS_BETTER or re.fullmatch(r"fewshot_\d+", leaf):
        return "max,last"
    return None


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
            self._defined: set[str] = set()

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
            for key in metrics:
                if key not in self._defined:
                    self._defined.add(key)
                    if (ops := summary_ops(key)) is not None:
                        self.experiment.define_metric(key, step_metric="trainer/global_step", summary=ops)
            if step is None:
                self.experiment.log(dict(metrics))
                return
            # at the trainer's step: a resumed run goes on where its checkpoint stopped, not at 0
            self.experiment.log({**metrics, "trainer/global_step": step}, step=int(step))

    return RunLogger


def run_logger(*, project: str, group: str, name: str, tags: list[str], log_dir: Path, job_type: str,
               id_dir: Path | None, fresh: bool = False, config: dict[str, Any] | None = None):
    """The W&B logger of a run that writes into ``log_dir`` (see the module docstring). W&B is given the
    folder by absolute path: the ``wandb sync <folder>`` it prints at the end works from any directory."""
    return _logger_class()(
        project=project, group=group, name=name, tags=tags, save_dir=str(Path(log_dir).absolute()), job_type=job_type,
        mode=None, id_dir=id_dir, fresh=fresh, config=config,  # chosen and said by init_run
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


def relative_links(folder: str | os.PathLike, within: str | os.PathLike | None = None) -> None:
    """Make the symlinks W&B leaves in ``folder`` (its ``logs/debug-core.log`` points by absolute
    path into ``wandb/cache``) relative, so they resolve in a copy of the run directory too. With
    ``within``, a link to a file outside that folder is removed instead: W&B's service is shared by
    every run of one process, so a later run's core-log link points into the first run's folder,
    which does not move with it (the link is a debug log pointer, nothing is uploaded from it)."""
    within = Path(within).resolve() if within is not None else None
    for link in Path(folder).rglob("*"):
        if not link.is_symlink():
            continue
        target = os.readlink(link)
        absolute = Path(target) if os.path.isabs(target) else (link.parent / target)
        if within is not None and not Path(os.path.abspath(absolute)).is_relative_to(within):
            link.unlink()
        elif os.path.isabs(target):
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

"""LightningCLI for every experiment: ``python -m reproductions fit|validate|test --config X.yaml``.

On top of Lightning's CLI this adds the ``run`` group (``--run.*``), which decides where a run
writes and how it reports:

    runs/<experiment>/<variant>/seed<k>/
        config.yaml       the fully resolved config (replays the run)
        metrics.csv       CSV logs (train/loss, val/acc, ...)
        hparams.yaml      the module's hyper-parameters, parameter count, FLOPs per image
        checkpoints/      last.ckpt and the best by the module's monitored metric
        wandb/            the W&B run, when --run.wandb true
        results.json      written last and atomically, only when fit (and test) finished

``validate`` and ``test`` write their logs into ``<run dir>/<subcommand>/`` so they never
overwrite the training logs.

Reliability (what a run guarantees; reproductions/run/errors.py and reproductions/run/rundir.py):

- A bad config or flag fails before any data is loaded, with one ``error:`` line naming the
  value (exit status 2); so does a ``--ckpt_path`` that is missing or not a checkpoint, checked
  before anything in the run directory is touched; and a global batch that does not divide over
  the DDP processes, checked before any process is started.
- A run directory is locked (``run.lock``) while a run uses it; ``fit`` into a finished run
  refuses unless ``--run.overwrite true`` (resuming its own checkpoint is allowed); a fresh
  attempt removes the checkpoints of an earlier unfinished one.
- A NaN/inf training loss stops the run at once (``--run.nonfinite_patience`` steps tolerated).
- A failed or interrupted fit writes results.json with ``status`` ``failed`` / ``interrupted``,
  the error and the step (never ``finished``).
- SIGTERM / SIGINT / SIGUSR1 at any moment from the process's start stop the run with one line,
  exit 128 + the signal's number and no ``run.lock`` left: before training at once ("before
  training started; nothing to resume", ``utils/stop.py``: no ``except Exception`` swallows it);
  once training started they save ``checkpoints/last.ckpt`` at the current step (every process
  stops at the same step; reproductions/run/signals.py) and exit with the command that resumes
  (results.json ``interrupted``, also for a signal during the test); under SLURM
  the job requeues itself (SIGUSR1) and resumes from Lightning's
  ``hpc_ckpt_*.ckpt``. Checkpoints are written atomically (``AtomicCheckpointIO``) and read
  with ``weights_only=True``.
- Resuming keeps ``metrics.csv``'s earlier rows and the clock's totals (fit time, samples/s).
- Integer ``limit_*_batches`` / ``overfit_batches`` are batch counts (``1`` is one batch, ``1.0``
  all of them), as Lightning documents.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
from pathlib import Path

from lightning import LightningDataModule, LightningModule, Trainer
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import Logger

from lightning_modules.callbacks import CheckpointOnSignal, ExactResume, StopOnNonFiniteLoss, TrainingClock
from lightning_modules.checkpoint_io import AtomicCheckpointIO
from lightning_modules.csv_logger import ResumableCSVLogger
from reproductions.run.ckpt_paths import (
    check_max_epochs,
    is_keyword,
    keyword_checkpoint,
    merge_model,
    read_checkpoint,
    resume_point,
)
from reproductions.run.errors import UsageError, config_message
from reproductions.run.errors import config_files, parser_error, yaml_syntax_message
from reproductions.run.quiet import silence_lightning_noise
from reproductions.run.rendezvous import bound_rendezvous, check_launch, exit_on_signal
from reproductions.run.failures import RecordsFailures
from reproductions.run.finish import WritesResults
from reproductions.run.options import RunOptions
from reproductions.run.results import RESULTS_FILE
from reproductions.run.run_config import SaveAndLogConfig, count_limits_as_ints
from reproductions.run.rundir import (
    RunDirLock,
    check_root,
    existing_run_dir,
    experiment_name,
    finished_results,
    recorded_experiment,
    stale_checkpoints,
)
from reproductions.run.signals import StopAtTheSameStep, StopSignals, slurm_requeue
from reproductions.run.tracking import read_run_id, run_logger
from utils.process import is_rank_zero
from utils.stop import pause_at


def _as_list(value) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


class ReproductionCLI(RecordsFailures, WritesResults, LightningCLI):
    """LightningCLI with run directories, results.json, a W&B switch and the guarantees above."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("save_config_callback", SaveAndLogConfig)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("seed_everything_default", 0)
        kwargs.setdefault("subclass_mode_model", True)
        kwargs.setdefault("subclass_mode_data", True)
        kwargs.setdefault("auto_configure_optimizers", False)  # modules bind their own optimiser
        # errors raise (and reproductions/run/errors.py prints one line) instead of exiting in jsonargparse
        kwargs["parser_kwargs"] = {"exit_on_error": False, **(kwargs.get("parser_kwargs") or {})}
        given = kwargs.get("args")
        self.cli_args = [str(a) for a in (sys.argv[1:] if given is None else given)] if not isinstance(
            given, dict) else []
        self.resume_from: Path | None = None  # a checkpoint of this run directory that fit resumes
        self.checkpoint: dict | None = None  # the --ckpt_path checkpoint, read once (weights only)
        self.resume_step: int | None = None
        self.git_at_start: dict | None = None  # set when fit starts (before_fit)
        self.signals = StopSignals(self)
        super().__init__(LightningModule, LightningDataModule, *args, **kwargs)

    def subcommands(self) -> dict[str, set[str]]:  # type: ignore[override]  # Lightning's is static
        """Lightning's subcommands narrowed to the one the arguments start with (``fit``): its parser
        alone is built, a quarter of the parsing at every start, for the same config and the same
        ``fit --help``; all of them when none is named (``--help``, a misspelt subcommand)."""
        everyone = LightningCLI.subcommands()
        named = self.cli_args[0] if self.cli_args else None
        return {named: everyone[named]} if named in everyone else everyone

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_class_arguments(RunOptions, "run")

    # ------------------------------------------------------------------ parsing
    def setup_parser(self, add_subcommands: bool, main_kwargs: dict, subparser_kwargs: dict) -> None:
        super().setup_parser(add_subcommands, main_kwargs, subparser_kwargs)
        for parser in [self.parser, *getattr(self, "_subcommand_parsers", {}).values()]:
            count_limits_as_ints(parser)

    def _option_names(self) -> list[str]:
        names = set()
        for parser in [self.parser, *getattr(self, "_subcommand_parsers", {}).values()]:
            for action in getattr(parser, "_actions", []):
                names.update(o for o in getattr(action, "option_strings", []) if o.startswith("--"))
        return sorted(names)

    def parse_arguments(self, parser, args) -> None:
        pause_at("parse")
        try:
            super().parse_arguments(parser, args)
        except argparse.ArgumentError as e:
            syntax = yaml_syntax_message(e, config_files(self.cli_args))  # a --config file that is not YAML
            raise UsageError(syntax or parser_error(e, self._option_names())) from e

    def _parse_ckpt_path(self) -> None:
        """Check ``--ckpt_path`` (exists, is a checkpoint, loads weights-only) before anything is
        touched; then take the model it fixes (reproductions/run/ckpt_paths.py)."""
        subcommand = self.config.get("subcommand")
        if not subcommand:
            return
        ckpt_path = self.config[subcommand].get("ckpt_path")
        if not ckpt_path or is_keyword(ckpt_path):
            return
        self.checkpoint = read_checkpoint(ckpt_path)
        self.config = merge_model(self.parser, self.config, subcommand, ckpt_path, self.checkpoint)

    # ------------------------------------------------------------------ run directory
    def before_instantiate_classes(self) -> None:
        silence_lightning_noise(self.subcommand)  # Lightning's warnings that do not apply (--debug: all)
        cfg = self.config[self.subcommand]
        run = cfg.run
        self.experiment = run.experiment or experiment_name(cfg.get("config") or [])
        self.seed = int(cfg.seed_everything)
        self.run_dir = Path(run.root) / self.experiment / run.variant / f"seed{self.seed}"
        # a run's own checkpoint or config.yaml: that run, where it lies now (never its copied run.root)
        existing = existing_run_dir(self.subcommand, cfg.get("ckpt_path"), cfg.get("config") or [])
        if existing is not None:
            self.run_dir = existing
            self.experiment = recorded_experiment(existing) or self.experiment
        self.log_dir = self.run_dir if self.subcommand == "fit" else self.run_dir / self.subcommand
        check_root(run.root if existing is None else existing, self.log_dir)
        if self.subcommand != "fit" and is_rank_zero():
            print(f"{self.subcommand}: writing into {self.log_dir}", file=sys.stderr, flush=True)
        if not run.rendezvous_timeout > 0:
            raise UsageError(f"--run.rendezvous_timeout={run.rendezvous_timeout} must be > 0 (seconds a multi-process "
                             "run waits for all its processes at the start)")
        if run.nonfinite_patience < 0:
            raise UsageError(f"--run.nonfinite_patience={run.nonfinite_patience} must be >= 0 (steps with a NaN/inf "
                             "loss tolerated in a row; 0 stops at the first)")
        keyword = cfg.get("ckpt_path")
        if keyword in ("last", "best"):  # this run directory's; checked like a path
            path = keyword_checkpoint(keyword, self.run_dir)
            checkpoint = read_checkpoint(path, what=f"--ckpt_path {keyword}")
            self.checkpoint = checkpoint
            self.config = merge_model(self.parser, self.config, self.subcommand, path, checkpoint)
            cfg = self.config[self.subcommand]
            cfg.ckpt_path = str(path)
        if self.subcommand == "fit":
            self.resume_from, self.resume_step = resume_point(cfg.get("ckpt_path"), self.run_dir,
                                                              requeued=slurm_requeue())
            check_max_epochs(cfg.get("ckpt_path"), self.checkpoint, cfg.trainer.get("max_epochs"))

    def instantiate_classes(self) -> None:
        """Lightning's, with every error in building the classes turned into one line (exit 2)."""
        try:
            pause_at("model")
            self.config_init = self.parser.instantiate_classes(self.config)
        except Exception as e:  # noqa: BLE001 - a config that cannot be built is a usage error
            raise UsageError(config_message(e)) from e
        self.datamodule = self._get(self.config_init, "data")
        self.model = self._get(self.config_init, "model")
        self._add_configure_optimizers_method_to_model(self.subcommand)
        try:
            self.trainer = self.instantiate_trainer()
        except UsageError:
            raise
        except Exception as e:  # noqa: BLE001 - Lightning's MisconfigurationException, bad trainer values
            raise UsageError(config_message(e)) from e

    def _run_options(self) -> RunOptions:
        return RunOptions(**self.config[self.subcommand].run.as_dict())

    def _loggers(self, configured) -> list[Logger] | bool:
        if configured is False:
            return False
        run = self._run_options()
        csv = ResumableCSVLogger(save_dir=str(self.log_dir), name="", version="",
                                 resume_step=self.resume_step if self.resume_from is not None else None)
        loggers: list[Logger] = [csv]
        if run.wandb:
            tags = list(dict.fromkeys([self.experiment, run.variant, *run.tags, f"seed{self.seed}"]))
            name = f"{self.experiment}/{run.variant}/seed{self.seed}"
            fit = self.subcommand == "fit"
            # fit: the run directory's one W&B run, continued on resume, new when starting at step 0;
            # validate/test: a run of their own, linked to the fit's by group, name and fit_run_id
            loggers.append(run_logger(
                project=run.project, group=run.group or self.experiment, tags=tags, log_dir=self.log_dir,
                name=name if fit else f"{name}/{self.subcommand}", job_type=self.subcommand,
                id_dir=self.run_dir if fit else None, fresh=fit and self.resume_from is None,
                config=None if fit else {"fit_run_id": read_run_id(self.run_dir)},
            ))
        if isinstance(configured, Logger):
            loggers.append(configured)
        elif isinstance(configured, (list, tuple)):
            loggers.extend(configured)
        return loggers

    def instantiate_trainer(self, **kwargs) -> Trainer:
        trainer_cfg = self._get(self.config_init, "trainer", default={})
        callbacks: list[Callback] = list(trainer_cfg.get("callbacks") or [])
        self.clock = TrainingClock()
        run = self._run_options()
        self.on_signal = CheckpointOnSignal(self.run_dir / "checkpoints" / "last.ckpt")
        callbacks += [self.clock, ExactResume(self.seed), StopOnNonFiniteLoss(run.nonfinite_patience)]
        monitor, mode = getattr(self.model, "monitor", ("val/loss", "min"))
        if self.subcommand == "fit":
            callbacks += [StopAtTheSameStep(self.signals), self.on_signal]
        if self.subcommand == "fit" and not any(isinstance(c, ModelCheckpoint) for c in callbacks):
            ckpt_dir = str(self.run_dir / "checkpoints")
            # Two callbacks: Lightning's save_last only refreshes last.ckpt in epochs that also
            # save a new best, which would make resuming restart from an older epoch.
            callbacks += [
                ModelCheckpoint(  # first: trainer.checkpoint_callback, ckpt_path="best"
                    dirpath=ckpt_dir, filename="best-epoch{epoch:03d}", auto_insert_metric_name=False,
                    monitor=monitor, mode=mode, save_top_k=1,
                ),
                ModelCheckpoint(  # every epoch end, overwritten: what --ckpt_path resumes from
                    dirpath=ckpt_dir, filename="last", monitor=None, save_top_k=1,
                    enable_version_counter=False,
                ),
            ]
        if self.subcommand != "fit" and not any(isinstance(c, ModelCheckpoint) for c in callbacks):
            # a test or validation saves nothing: no default ModelCheckpoint (it would take over the
            # training checkpoint's state and re-point it at <run dir>/<subcommand>/checkpoints)
            kwargs.setdefault("enable_checkpointing", False)
        kwargs.setdefault("callbacks", callbacks)
        kwargs.setdefault("logger", self._loggers(trainer_cfg.get("logger")))
        kwargs.setdefault("default_root_dir", str(self.run_dir))
        kwargs.setdefault("plugins", self._plugins(trainer_cfg))
        trainer = super().instantiate_trainer(**kwargs)
        self.signals.follow(trainer)
        return trainer

    def _plugins(self, trainer_cfg) -> list:
        """The configured plugins plus atomic checkpoint IO and, in a SLURM batch job, Lightning's
        SLURM environment with auto-requeue on SIGUSR1 (submit with ``--signal=SIGUSR1@90``)."""
        plugins = _as_list(trainer_cfg.get("plugins"))
        strategy = str(trainer_cfg.get("strategy") or "")
        if not any(isinstance(p, CheckpointIO) for p in plugins) and "deepspeed" not in strategy.lower():
            plugins.append(AtomicCheckpointIO())
        if slurm_requeue() and not any(isinstance(p, SLURMEnvironment) for p in plugins):
            plugins.append(SLURMEnvironment(auto_requeue=True, requeue_signal=signal.SIGUSR1))
        return plugins

    # ------------------------------------------------------------------ running a subcommand
    def command(self, ckpt_path: str | Path | None = None) -> str:
        """This command as one shell line; with ``ckpt_path``, the one that resumes from it."""
        args = list(self.cli_args)
        if ckpt_path is not None:
            out, skip = [], False
            for a in args:
                if skip:
                    skip = False
                    continue
                if a == "--ckpt_path":
                    skip = True
                    continue
                if a.startswith("--ckpt_path="):
                    continue
                out.append(a)
            args = [*out, "--ckpt_path", str(ckpt_path)]
        return shlex.join(["python", "-m", "reproductions", *args])

    def _check_batch_divides(self) -> None:
        """The global batch must split evenly over the processes: checked before any is started."""
        trainer, data = self.trainer, self.datamodule
        try:
            world = int(trainer.num_nodes) * int(trainer.num_devices)
        except (TypeError, ValueError):
            return
        if world <= 1 or data is None:
            return
        for name in ("batch_size", "eval_batch_size"):
            value = getattr(data, name, None)
            if isinstance(value, int) and value % world:
                multiple = max(world, (value // world) * world)
                raise UsageError(
                    f"data.{name}={value} does not divide over the {world} processes ({trainer.num_devices} "
                    f"device(s) x {trainer.num_nodes} node(s)): the global batch is split evenly; use a multiple of "
                    f"{world} "
                    f"(e.g. --data.{name} {multiple})"
                )

    def _prepare_fit_dir(self) -> None:
        """Rank zero, lock held: refuse to replace a finished run, then clear what a fresh attempt replaces."""
        run = self._run_options()
        finished = finished_results(self.run_dir)
        if finished is not None and not run.overwrite and self.resume_from is None:
            shown = ", ".join(f"{k} = {v:.4f}" for k, v in sorted((finished.get("test") or {}).items())
                              if isinstance(v, (int, float)))
            raise UsageError(
                f"run directory {self.run_dir} holds a finished run ({shown or 'results.json'}, finished "
                f"{finished.get('finished_at', '?')}); pass --run.overwrite true to replace it, resume it with "
                f"--ckpt_path {self.run_dir / 'checkpoints' / 'last.ckpt'}, or choose another --run.variant, "
                "--run.root or --seed_everything"
            )
        # a rerun must not leave an old result looking current
        (self.run_dir / RESULTS_FILE).unlink(missing_ok=True)
        if self.resume_from is None:
            stale = stale_checkpoints(self.run_dir)
            for path in stale:
                path.unlink(missing_ok=True)
            if stale:
                print(f"starting afresh in {self.run_dir}: removed {len(stale)} checkpoint file(s) of an earlier "
                      f"attempt ({', '.join(p.name for p in stale)})", file=sys.stderr, flush=True)

    def _run_subcommand(self, subcommand: str) -> None:
        self._check_batch_divides()
        check_launch(self.trainer)
        rank_zero = is_rank_zero()
        lock = RunDirLock(self.log_dir, self.command(), say=lambda m: print(m, file=sys.stderr, flush=True))
        self.signals.install()  # before the lock: a signal from here on releases it
        try:
            if rank_zero:
                lock.acquire()
            launcher = getattr(self.trainer.strategy, "launcher", None)
            bound_rendezvous(self.trainer.strategy, self._run_options().rendezvous_timeout,
                             on_signal=lambda signum: exit_on_signal(signum, release=lock.release,
                                                                     children=getattr(launcher, "procs", ()),
                                                                     say=rank_zero))
            if subcommand == "fit" and rank_zero and not self.trainer.fast_dev_run:
                self._prepare_fit_dir()  # a smoke test (fast_dev_run) writes nothing there: no rules
            try:
                super()._run_subcommand(subcommand)
            except BaseException as e:
                error = self._failed(subcommand, e)
                if error is e:
                    raise
                raise error from e
        finally:
            self.signals.stopping = True  # a signal now is noted, never raised into the release of the lock
            lock.release()
            self.signals.restore()

def main(args: list[str] | None = None) -> ReproductionCLI:
    return ReproductionCLI(args=args)


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])

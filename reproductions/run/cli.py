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

Reliability (what a run guarantees; reproductions/errors.py and reproductions/rundir.py):

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
- SIGTERM / SIGUSR1 save ``checkpoints/last.ckpt`` at the current step (every process stops at
  the same step; reproductions/signals.py) and exit with the command that resumes; under SLURM
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from lightning import LightningDataModule, LightningModule, Trainer
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import Logger, WandbLogger
from lightning.pytorch.utilities import rank_zero_info

from analysis.callback import add_attention_analysis
from lightning_modules.callbacks import (
    CheckpointOnSignal,
    ExactResume,
    NonFiniteLossError,
    StopOnNonFiniteLoss,
    TrainingClock,
)
from lightning_modules.checkpoint_io import AtomicCheckpointIO, CheckpointWriteError
from lightning_modules.csv_logger import ResumableCSVLogger
from reproductions.artifacts import log_checkpoints
from reproductions.ckpt_paths import (
    check_max_epochs,
    is_keyword,
    keyword_checkpoint,
    merge_model,
    read_checkpoint,
    resume_point,
)
from reproductions.errors import RunFailed, RunInterrupted, UsageError, config_message, exception_chain, one_line
from reproductions.errors import config_files, parser_error, yaml_syntax_message
from reproductions.quiet import silence_lightning_noise
from reproductions.rendezvous import bound_rendezvous, check_launch, exit_on_signal
from reproductions.results import RESULTS_FILE, environment, fit_record, git_at_end, git_state, write_results
from reproductions.run_config import SaveAndLogConfig, count_limits_as_ints
from reproductions.rundir import (
    RunDirLock,
    check_root,
    experiment_name,
    finished_results,
    is_rank_zero,
    stale_checkpoints,
)
from reproductions.signals import StopAtTheSameStep, StopSignals, slurm_requeue
from reproductions.tracking import (
    RUN_FILES, log_results, log_status, read_run_id, run_logger, save_with_run, wandb_runs,
)


@dataclass
class RunOptions:
    """Where a run writes, how it is named and how it reports.

    Args:
        root: directory that holds all runs.
        experiment: experiment name, the first level under ``root``; default: the config
            file's path under reproductions/ without ``configs/`` and the suffix
            (``reproductions/vit/configs/digits.yaml`` -> ``vit/digits``).
        variant: the ablation variant (a sweep sets it, e.g. ``pos_embed=learned_2d``).
        wandb: also log to Weights & Biases. Runs offline (files under the run directory,
            ``wandb sync`` later) unless an API key is configured or WANDB_MODE says otherwise.
        project: W&B project.
        group: W&B group; default: the experiment name, so a sweep's runs group together.
        tags: extra W&B tags; the experiment and variant are always added.
        log_model: at the end of a finished fit, log the last and the best checkpoint to W&B
            as one model artifact (aliases ``last``, ``best``, the variant and the seed). Offline
            runs keep it with the run and upload it on ``wandb sync``. Needs ``wandb: true``.
        test_after_fit: after ``fit``, evaluate on the test split and write results.json.
        test_ckpt: which weights the test after fit uses: ``final`` (the weights at the end
            of training) or ``best`` (the checkpoint with the best monitored validation metric).
        overwrite: let ``fit`` replace a finished run in its run directory (results.json says
            finished). Without it such a fit refuses; resuming the run's own checkpoint
            (``--ckpt_path <run dir>/checkpoints/last.ckpt``) needs no overwrite.
        nonfinite_patience: training steps in a row with a NaN or infinite loss tolerated before
            the run stops as failed (0: stop at the first).
        rendezvous_timeout: seconds a multi-process run waits for all its processes to join at the
            start (DDP, FSDP, several nodes) before it fails naming who is missing.
        attention_analysis: at the end of a ViT's fit, the mean attention distance per layer and head
            on 128 validation images, with its figure (and the position-embedding similarity), in
            ``<run dir>/analysis/``, the logged metrics and W&B (about 1% of a digits fit).
    """

    root: str = "runs"
    experiment: str | None = None
    variant: str = "default"
    wandb: bool = False
    project: str = "attention-repro"
    group: str | None = None
    tags: list[str] = field(default_factory=list)
    log_model: bool = False
    test_after_fit: bool = True
    test_ckpt: Literal["final", "best"] = "final"
    overwrite: bool = False
    nonfinite_patience: int = 0
    rendezvous_timeout: float = 60.0
    attention_analysis: bool = True


def _as_list(value) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


class ReproductionCLI(LightningCLI):
    """LightningCLI with run directories, results.json, a W&B switch and the guarantees above."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("save_config_callback", SaveAndLogConfig)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("seed_everything_default", 0)
        kwargs.setdefault("subclass_mode_model", True)
        kwargs.setdefault("subclass_mode_data", True)
        kwargs.setdefault("auto_configure_optimizers", False)  # modules bind their own optimiser
        # errors raise (and reproductions/errors.py prints one line) instead of exiting in jsonargparse
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
        try:
            super().parse_arguments(parser, args)
        except argparse.ArgumentError as e:
            syntax = yaml_syntax_message(e, config_files(self.cli_args))  # a --config file that is not YAML
            raise UsageError(syntax or parser_error(e, self._option_names())) from e

    def _parse_ckpt_path(self) -> None:
        """Check ``--ckpt_path`` (exists, is a checkpoint, loads weights-only) before anything is
        touched; then take the model it fixes (reproductions/ckpt_paths.py)."""
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
        self.log_dir = self.run_dir if self.subcommand == "fit" else self.run_dir / self.subcommand
        check_root(run.root, self.log_dir)
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
        if self.subcommand == "fit" and run.attention_analysis:
            add_attention_analysis(trainer, self.model)
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
        if rank_zero:
            lock.acquire()
        launcher = getattr(self.trainer.strategy, "launcher", None)
        bound_rendezvous(self.trainer.strategy, self._run_options().rendezvous_timeout,
                         on_signal=lambda signum: exit_on_signal(signum, release=lock.release,
                                                                 children=getattr(launcher, "procs", ()),
                                                                 say=rank_zero))
        try:
            if subcommand == "fit" and rank_zero and not self.trainer.fast_dev_run:
                self._prepare_fit_dir()  # a smoke test (fast_dev_run) writes nothing there: no rules
            self.signals.install()
            try:
                super()._run_subcommand(subcommand)
            except BaseException as e:
                error = self._failed(subcommand, e)
                if error is e:
                    raise
                raise error from e
            finally:
                self.signals.restore()
        finally:
            lock.release()

    def _failed(self, subcommand: str, exc: BaseException) -> BaseException:
        """What a failed subcommand raises: a signal becomes RunInterrupted with the resume command,
        a non-finite loss or a failed checkpoint write RunFailed; the rest as is. A fit that had
        started leaves results.json with status ``failed`` or ``interrupted``."""
        chain = exception_chain(exc)
        trainer = getattr(self, "trainer", None)
        signum = self.signals.received
        sigterm_exc = any(type(e).__name__ == "SIGTERMException" for e in chain)
        lightning_ctrl_c = (isinstance(exc, SystemExit) and not sigterm_exc and trainer is not None
                            and trainer.interrupted)
        if isinstance(exc, KeyboardInterrupt) or (lightning_ctrl_c and signum is None):
            signum = signal.SIGINT
        interrupted = sigterm_exc or isinstance(exc, (RunInterrupted, KeyboardInterrupt)) or lightning_ctrl_c
        if interrupted:
            error: BaseException = self._interrupted(subcommand, int(signum or signal.SIGTERM))
        else:
            named = next((e for e in chain if isinstance(e, (NonFiniteLossError, CheckpointWriteError))), None)
            error = RunFailed(str(named)) if named is not None else exc
        if subcommand == "fit":
            self._record_failure("interrupted" if interrupted else "failed", error, exc)
        return error

    def _interrupted(self, subcommand: str, signum: int) -> RunInterrupted:
        name = signal.Signals(signum).name
        saved = getattr(getattr(self, "on_signal", None), "saved", None)
        if subcommand != "fit":
            return RunInterrupted(f"stopped by {name} during {subcommand}; rerun the same command: {self.command()}",
                                  signum=signum)
        last = self.run_dir / "checkpoints" / "last.ckpt"
        if saved:
            where = (f"at step {self.on_signal.step} (epoch {self.on_signal.epoch}); saved {saved}")
            ckpt = saved
        elif last.is_file():
            where, ckpt = f"before a checkpoint at this step could be saved; the last one is {last}", str(last)
        else:
            return RunInterrupted(f"stopped by {name} before the first checkpoint; rerun the same command to start "
                                  f"again: {self.command()}", signum=signum)
        return RunInterrupted(f"stopped by {name} {where}; resume with: {self.command(ckpt)}", signum=signum)

    def _record_failure(self, status: str, error: BaseException, original: BaseException) -> None:
        """results.json with ``status`` (never ``finished``) for a fit that had started; W&B told too."""
        trainer = getattr(self, "trainer", None)
        clock = getattr(self, "clock", None)
        if trainer is None or clock is None or not clock.started or trainer.fast_dev_run:
            return
        if not trainer.is_global_zero:
            return
        run = self._run_options()
        first = one_line(str(error), limit=10_000) or type(error).__name__
        text = first if isinstance(error, (RunFailed, RunInterrupted)) else f"{type(error).__name__}: {first}"
        nonfinite = next((e for e in exception_chain(original) if isinstance(e, NonFiniteLossError)), None)
        record = {
            "status": status,
            "error": text,
            "step": nonfinite.step if nonfinite is not None else trainer.global_step,
            "epoch": nonfinite.epoch if nonfinite is not None else trainer.current_epoch,
            "experiment": self.experiment,
            "variant": run.variant,
            "seed": self.seed,
            "run_dir": str(self.run_dir),
            "training": {"epochs": trainer.current_epoch, "steps": trainer.global_step, **clock.summary()},
            **self._environment(),
        }
        record["ended_at"] = record.pop("finished_at", None)
        if status == "interrupted":
            record["checkpoint"] = getattr(self.on_signal, "saved", None)
        try:
            write_results(self.run_dir, record)
        except OSError:
            pass  # e.g. the disk is full: the error line still says what happened
        try:
            log_status(trainer.loggers, status)
            self._finish_wandb()
        except Exception:  # noqa: BLE001 - reporting must not hide the run's own error
            pass

    # ------------------------------------------------------------------ fit -> test -> results
    def before_fit(self) -> None:
        self.git_at_start = git_state()  # the code this run trains with, whatever the checkout does meanwhile
        rank_zero_info(f"run directory: {self.run_dir}")

    def _environment(self) -> dict:
        start = self.git_at_start
        trainer = getattr(self, "trainer", None)
        try:
            device = trainer.strategy.root_device.type if trainer is not None else None
        except Exception:  # noqa: BLE001 - a strategy that never set up: the default device
            device = None
        return environment(git=None if start is None else git_at_end(start), device=device)

    def _finish_wandb(self) -> None:
        """Close this run's W&B run (flushes its files; the next run in this process gets its own)."""
        for logger in self.trainer.loggers:
            # a run that never started W&B (failed before setup) does not start it now to close it
            if isinstance(logger, WandbLogger) and self.trainer.is_global_zero and logger._experiment is not None:
                logger.experiment.finish()

    def _keep_files_with_evaluation(self) -> None:
        """An evaluation's W&B run gets copies of the run directory's files it evaluated (the fit's
        config.yaml, results.json, metrics.csv), as a fit's run has them."""
        if self.trainer.is_global_zero:
            for run in wandb_runs(self.trainer.loggers):
                save_with_run(run, self.run_dir, RUN_FILES)

    def after_validate(self) -> None:
        try:
            self._keep_files_with_evaluation()
        finally:
            self._finish_wandb()

    def after_test(self) -> None:
        try:
            self._keep_files_with_evaluation()
        finally:
            self._finish_wandb()

    def after_fit(self) -> None:
        try:
            self._after_fit()
        finally:
            self._finish_wandb()

    def _after_fit(self) -> None:
        trainer = self.trainer
        if trainer.interrupted or trainer.state.status.value != "finished":
            rank_zero_info("fit did not finish: no results.json written")
            log_status(trainer.loggers, "interrupted" if trainer.interrupted else "failed")
            return
        run = self._run_options()
        if trainer.fast_dev_run:
            if run.test_after_fit:
                trainer.test(self.model, datamodule=self.datamodule, verbose=False)
            rank_zero_info("fast_dev_run: a smoke test, so no results.json is written")
            return
        # trainer.test resets callback_metrics: keep the end-of-training values first
        final_metrics = {
            k: float(v)
            for k, v in trainer.callback_metrics.items()
            if k.startswith(("train/", "val/")) and not k.endswith("samples_per_sec")  # timing is in "training"
        }
        # the fit's totals now: a test at the best checkpoint restores the callbacks' state from it
        # (the training clock's samples, times and throughput of an earlier epoch)
        fit = fit_record(self.trainer, self.model, self.datamodule, self.clock)
        test_metrics: dict = {}
        if run.test_after_fit:
            self._say_test_padding()
            ckpt = "best" if run.test_ckpt == "best" else None
            outputs = trainer.test(self.model, datamodule=self.datamodule, ckpt_path=ckpt, verbose=False)
            test_metrics = dict(outputs[0]) if outputs else {}
        if trainer.is_global_zero:
            results = self.collect_results(test_metrics, final_metrics, fit)
            write_results(self.run_dir, results)
            log_results(trainer.loggers, results, self.run_dir)  # the same numbers (and files) into W&B
            if run.log_model:
                log_checkpoints(trainer.loggers, self.run_dir / "checkpoints", results, self.run_dir)
            shown = ", ".join(f"{k} = {v:.4f}" for k, v in sorted(test_metrics.items()))
            print(f"\n{self.experiment}/{run.variant}/seed{self.seed}: {shown or 'no test run'}")
            print(f"results: {self.run_dir / RESULTS_FILE}", flush=True)

    def _say_test_padding(self) -> None:
        """Under DDP, Lightning's distributed sampler pads the test set to a multiple of the processes: say
        how many images it repeats (and so counts twice in the test metrics), if any."""
        world = self.trainer.world_size
        try:
            n = len(self.datamodule.test_dataset)
        except (AttributeError, TypeError):
            return
        if world > 1 and n % world and self.trainer.is_global_zero:
            print(f"test on {n} examples over {world} processes: the distributed sampler repeats "
                  f"{world - n % world} of them (counted twice in the test metrics); a 1-process "
                  "`repro test --ckpt_path ...` counts each once", file=sys.stderr, flush=True)

    def collect_results(self, test_metrics: dict, final_metrics: dict, fit: dict) -> dict:
        """results.json of a finished fit; ``fit``: ``fit_record`` taken when training ended."""
        run = self._run_options()
        return {
            "status": "finished",
            "experiment": self.experiment,
            "variant": run.variant,
            "seed": self.seed,
            "run_dir": str(self.run_dir),
            "test": {k: float(v) for k, v in test_metrics.items()},
            "test_ckpt": run.test_ckpt,
            "final": final_metrics,
            **fit,
            **self._environment(),
        }


def main(args: list[str] | None = None) -> ReproductionCLI:
    return ReproductionCLI(args=args)


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])

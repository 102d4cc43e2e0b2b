"""What a failed or interrupted subcommand becomes: the error it raises (a signal: ``RunInterrupted``
with the command that resumes; a non-finite loss or a failed checkpoint write: ``RunFailed``) and,
for a fit that had started, results.json with status ``failed`` or ``interrupted`` (never
``finished``). A part of ``ReproductionCLI`` (``reproductions/run/cli.py``)."""

from __future__ import annotations

import signal

from lightning_modules.callbacks import NonFiniteLossError
from lightning_modules.checkpoint_io import CheckpointWriteError
from reproductions.run.errors import RunFailed, RunInterrupted, exception_chain, one_line
from reproductions.run.results import write_results
from utils.process import is_rank_zero
from reproductions.run.signals import stop_children
from reproductions.run.tracking import log_status
from utils.stop import StopRequested


class RecordsFailures:
    """``ReproductionCLI``'s failure handling: ``_failed`` is called with whatever a subcommand raised."""

    def _failed(self, subcommand: str, exc: BaseException) -> BaseException:
        """What a failed subcommand raises: a signal becomes RunInterrupted with the resume command,
        a non-finite loss or a failed checkpoint write RunFailed; the rest as is. A fit that had
        started leaves results.json with status ``failed`` or ``interrupted``."""
        self.signals.stopping = True  # a second signal must not cut the cleanup short
        chain = exception_chain(exc)
        trainer = getattr(self, "trainer", None)
        signum = self.signals.received
        sigterm_exc = any(type(e).__name__ == "SIGTERMException" for e in chain)
        requested = next((e for e in chain if isinstance(e, StopRequested)), None)
        lightning_ctrl_c = (isinstance(exc, SystemExit) and not sigterm_exc and trainer is not None
                            and trainer.interrupted)
        if requested is not None:
            signum = requested.signum
        elif isinstance(exc, KeyboardInterrupt) or (lightning_ctrl_c and signum is None):
            signum = signal.SIGINT
        interrupted = (sigterm_exc or requested is not None or lightning_ctrl_c
                       or isinstance(exc, (RunInterrupted, KeyboardInterrupt)))
        if interrupted:
            signum = int(signum or signal.SIGTERM)
            if not self.signals.trained and trainer is not None:
                stop_children(trainer, signum)  # before training nothing tells the other processes: stop them
            error: BaseException = self._interrupted(subcommand, signum)
        else:
            named = next((e for e in chain if isinstance(e, (NonFiniteLossError, CheckpointWriteError))), None)
            error = RunFailed(str(named)) if named is not None else exc
        if subcommand == "fit":
            self._record_failure("interrupted" if interrupted else "failed", error, exc)
        if trainer is not None:
            try:  # W&B's farewell before the error line, not after it
                self._finish_wandb()
            except Exception:  # noqa: BLE001 - reporting must not hide the run's own error
                pass
        return error

    def _interrupted(self, subcommand: str, signum: int) -> RunInterrupted:
        """The one line of a stopped run (said by the first process; the others stop quietly); for a fit
        ``self.resume_ckpt``, the checkpoint it names (also results.json's ``checkpoint``)."""
        name = signal.Signals(signum).name
        quiet = not is_rank_zero()
        saved = getattr(getattr(self, "on_signal", None), "saved", None)
        if subcommand != "fit":
            return RunInterrupted(f"stopped by {name} during {subcommand}; rerun the same command: {self.command()}",
                                  signum=signum, quiet=quiet)
        last = self.run_dir / "checkpoints" / "last.ckpt"
        self.resume_ckpt = None
        if saved:
            where = (f"at step {self.on_signal.step} (epoch {self.on_signal.epoch}); saved {saved}")
            ckpt = saved
        elif getattr(self, "training_done", False) and last.is_file():
            where, ckpt = (f"after training finished (step {self.trainer.global_step}), before the test and "
                           f"results.json (resuming tests and writes them); the checkpoint is {last}"), str(last)
        elif self.resume_from is not None and not self.signals.trained:
            where, ckpt = f"before training resumed from {self.resume_from}", str(self.resume_from)
        elif last.is_file() and self.signals.trained:
            where, ckpt = f"before a checkpoint at this step could be saved; the last one is {last}", str(last)
        else:
            return RunInterrupted(f"stopped by {name} before training started; nothing to resume; rerun the same "
                                  f"command to start again: {self.command()}", signum=signum, quiet=quiet)
        self.resume_ckpt = ckpt
        return RunInterrupted(f"stopped by {name} {where}; resume with: {self.command(ckpt)}", signum=signum,
                              quiet=quiet)

    def _record_failure(self, status: str, error: BaseException, original: BaseException) -> None:
        """results.json with ``status`` (never ``finished``) for a fit that had started, or that was stopped
        with a checkpoint to resume from; W&B told too."""
        trainer = getattr(self, "trainer", None)
        clock = getattr(self, "clock", None)
        if trainer is None or clock is None or trainer.fast_dev_run:
            return
        if not clock.started and not (status == "interrupted" and getattr(self, "resume_ckpt", None)):
            return  # stopped before fit started: no results.json, unless it names the checkpoint to resume from
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
            record["checkpoint"] = getattr(self, "resume_ckpt", None)
        try:
            write_results(self.run_dir, record)
        except OSError:
            pass  # e.g. the disk is full: the error line still says what happened
        try:
            log_status(trainer.loggers, status)
        except Exception:  # noqa: BLE001 - reporting must not hide the run's own error
            pass

"""SIGTERM and SIGUSR1 while a command runs: stop cleanly, at the same step on every process.

A cluster stops a job by a signal: SIGTERM at preemption or the time limit, SIGUSR1 ahead of it
when the job asked (``--signal=SIGUSR1@90``). What a run does with it:

- Before training (setting up, loading data) and between fit and test, the command stops at once
  with ``RunInterrupted`` (one line, exit 128 + the signal number).
- During training the signal is only noted; at the end of the current training step every process
  learns whether any of them got one (one all-reduce of a flag, ``StopAtTheSameStep``), and if so all
  of them stop there together: Lightning raises its ``SIGTERMException`` at the end of that batch on
  every rank and ``CheckpointOnSignal`` saves the checkpoint the run resumes from. This replaces
  Lightning's own SIGTERM handler while training: that one runs a collective (a broadcast) inside
  the signal handler and forwards the signal to the other local processes, so a signal that reaches
  every rank of a DDP job (as a scheduler sends it) leaves the ranks in different collectives and
  the job hangs.
- During ``validate``/``test`` (and fit's sanity check) Lightning's handler stops the stage.

Under SLURM, SIGUSR1 stays Lightning's: it requeues the job from ``hpc_ckpt_*.ckpt``.
"""

from __future__ import annotations

import signal
import threading

from lightning import Callback, LightningModule, Trainer
from lightning.fabric.plugins.environments import SLURMEnvironment

from reproductions.run.errors import RunInterrupted


def slurm_requeue() -> bool:
    """Whether this process runs as a SLURM batch job (Lightning then requeues on SIGUSR1)."""
    return SLURMEnvironment.detect()


def _running(trainer) -> bool:
    return trainer is not None and str(getattr(trainer.state.status, "value", "")) == "running"


class StopSignals:
    """The command's handler of SIGTERM and SIGUSR1 (see the module docstring).

    ``cli`` is the object whose ``trainer`` attribute is the run's trainer (once built).
    ``received`` is the first signal this process got; ``pending`` whether one arrived during
    training and was not yet acted on.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self, cli) -> None:
        self.cli = cli
        self.received: int | None = None
        self.pending = False
        self.training = False
        self._previous: dict = {}

    def signals(self) -> list[int]:
        # under SLURM SIGUSR1 is Lightning's requeue signal: it installs its handler only if none is there
        return [s for s in self.SIGNALS if not (s == signal.SIGUSR1 and slurm_requeue())]

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in self.signals():
            self._previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self.handle)

    def take_over(self) -> None:
        """Handle the signals again after Lightning registered its own for the stage (training)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in self.signals():
            signal.signal(signum, self.handle)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}

    def handle(self, signum: int, frame) -> None:
        self.received = self.received or signum
        if self.training:
            self.pending = True  # acted on at the end of the step, on every process at once
            return
        trainer = getattr(self.cli, "trainer", None)
        lightning_handles = signal.getsignal(signal.SIGTERM) != self.handle
        if lightning_handles and _running(trainer):  # validate / test / the sanity check
            connector = getattr(trainer, "_signal_connector", None)
            if connector is not None:
                connector.received_sigterm = True  # SIGUSR1: stop at the end of the batch as for SIGTERM
            return
        raise RunInterrupted(f"stopped by {signal.Signals(signum).name}", signum=signum)


class StopAtTheSameStep(Callback):
    """While training: take the signals over from Lightning and stop every process at the same step."""

    def __init__(self, signals: StopSignals) -> None:
        self.signals = signals

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.signals.training = True
        self.signals.take_over()

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        stop = self.signals.pending
        if trainer.world_size > 1:
            stop = trainer.strategy.reduce_boolean_decision(stop, all=False)  # any process got one
        if stop:
            trainer._signal_connector.received_sigterm = True  # the loop raises SIGTERMException after this batch
            if self.signals.received is None:
                self.signals.received = int(signal.SIGTERM)  # another process got it: stop as for SIGTERM

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.signals.training = False

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self.signals.training = False

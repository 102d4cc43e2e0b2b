"""SIGTERM, SIGINT and SIGUSR1 while a run runs: stop cleanly, at the same step on every process.

A cluster stops a job by a signal: SIGTERM at preemption or the time limit, SIGUSR1 ahead of it
when the job asked (``--signal=SIGUSR1@90``); a user by Ctrl-C (SIGINT) or ``kill``. From the
process's start to the run's own handler the signal raises ``utils.stop.StopRequested`` (set by
``reproductions/__main__.py``). What a run does with it:

- Before training (parsing, building the model, preparing the data, starting W&B, counting FLOPs)
  the command stops at once with ``RunInterrupted`` (one line, exit 128 + the signal number): it
  raises ``StopRequested``, which no ``except Exception`` on the way swallows; in a multi-process
  run the first process stops the processes it started (``stop_children``).
- During training the signal is only noted; at the end of the current training step every process
  learns whether any of them got one (one all-reduce of a flag, ``StopAtTheSameStep``), and if so all
  of them stop there together: Lightning raises its ``SIGTERMException`` at the end of that batch on
  every rank and ``CheckpointOnSignal`` saves the checkpoint the run resumes from. This replaces
  Lightning's own SIGTERM handler while training: that one runs a collective (a broadcast) inside
  the signal handler and forwards the signal to the other local processes, so a signal that reaches
  every rank of a DDP job (as a scheduler sends it) leaves the ranks in different collectives and
  the job hangs.
- During ``validate``/``test`` (and fit's sanity check) Lightning's handler stops the stage; a
  signal that came at the last training step or the test's last batch stops the run after the
  stage (``WritesResults`` checks ``received``): results.json is never ``finished`` after a stop.
- A second Ctrl-C while the first waits for the end of the step stops at once.

Under SLURM, SIGUSR1 stays Lightning's: it requeues the job from ``hpc_ckpt_*.ckpt``.
"""

from __future__ import annotations

import signal
import subprocess
import threading

from lightning import Callback, LightningModule, Trainer
from lightning.fabric.plugins.environments import SLURMEnvironment

from utils import stop


def slurm_requeue() -> bool:
    """Whether this process runs as a SLURM batch job (Lightning then requeues on SIGUSR1)."""
    return SLURMEnvironment.detect()


def _running(trainer) -> bool:
    return trainer is not None and str(getattr(trainer.state.status, "value", "")) == "running"


class StopSignals:
    """The command's handler of SIGTERM, SIGINT and SIGUSR1 (see the module docstring).

    ``cli`` is the object whose ``trainer`` attribute is the run's trainer (once built).
    ``received`` is the first signal this process got; ``pending`` whether one arrived during
    training and was not yet acted on; ``trained`` whether training started in this process.
    """

    SIGNALS = stop.STOP_SIGNALS

    def __init__(self, cli) -> None:
        self.cli = cli
        self.received: int | None = None
        self.pending = False
        self.training = False
        self.trained = False
        self.stopping = False  # the run is ending (failed, stopped or done): a signal is only noted
        self._previous: dict = {}

    def signals(self) -> list[int]:
        # under SLURM SIGUSR1 is Lightning's requeue signal: it installs its handler only if none is there
        return [s for s in self.SIGNALS if not (s == signal.SIGUSR1 and slurm_requeue())]

    def install(self) -> None:
        self._previous = stop.install(self.handle, self.signals())  # an ignored signal (nohup) stays ignored

    def take_over(self) -> None:
        """Handle the signals again after Lightning registered its own for the stage (training)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in self._previous:
            signal.signal(signum, self.handle)

    def restore(self) -> None:
        stop.restore(self._previous)
        self._previous = {}

    def handle(self, signum: int, frame) -> None:
        again = self.received is not None
        self.received = self.received or signum
        if self.stopping:
            stop.note(signum)
            return
        if self.training and not (again and signum == signal.SIGINT and self.pending):
            self.pending = True  # acted on at the end of the step, on every process at once
            stop.note(signum)
            return
        trainer = getattr(self.cli, "trainer", None)
        lightning_handles = signal.getsignal(signal.SIGTERM) != self.handle
        if not self.training and lightning_handles and _running(trainer):  # validate / test / the sanity check
            connector = getattr(trainer, "_signal_connector", None)
            if connector is not None:
                connector.received_sigterm = True  # SIGUSR1, SIGINT: stop at the end of the batch as for SIGTERM
            stop.note(signum)
            return
        raise stop.StopRequested(signum)  # not an Exception: no `except Exception` on the way swallows it

    def follow(self, trainer) -> None:
        """Wrap ``trainer``'s registration of Lightning's signal handlers (at the start of each stage, just
        before its first barrier) so that ``seen_first`` runs the moment Lightning's handler is in place:
        from then on a signal is noted before Lightning's handler runs its collective, whatever the process
        is doing (a hook that checked later left a window in which the collective's failure, raised inside
        the signal handler, read as an unrelated error)."""
        connector = getattr(trainer, "_signal_connector", None)
        register = getattr(connector, "register_signal_handlers", None)
        if register is None or getattr(register, "notes_first", False):
            return

        def register_then_note_first() -> None:
            register()
            self.seen_first()

        register_then_note_first.notes_first = True  # type: ignore[attr-defined]
        connector.register_signal_handlers = register_then_note_first

    def seen_first(self) -> None:
        """Outside training Lightning's SIGTERM handler acts (it was set for this stage), and under DDP it runs
        a collective, which raises when the other process has already stopped: before it, note the signal
        (``received``, ``utils.stop.noted``), so the stop is still known for what it is (one line, said by
        the first process) rather than taken for a failure of the collective."""
        if threading.current_thread() is not threading.main_thread():
            return
        then = signal.getsignal(signal.SIGTERM)
        if getattr(then, "notes_first", False) or then == self.handle:
            return

        def first(signum: int, frame) -> None:
            self.received = self.received or signum
            stop.note(signum)
            if callable(then):
                then(signum, frame)

        first.notes_first = True  # type: ignore[attr-defined]
        signal.signal(signal.SIGTERM, first)

    def check(self) -> None:
        """Raise ``StopRequested`` if a signal came that nothing acted on yet (between stages)."""
        if self.received is not None:
            raise stop.StopRequested(self.received)


def stop_children(trainer, signum: int, grace_s: float = 5.0) -> None:
    """Stop the processes this one started for a multi-process run (Lightning's launcher's), which
    may not have got the signal: ``signum`` first, SIGKILL after ``grace_s`` (a process blocked in a
    collective waiting for this one never runs its handler)."""
    launcher = getattr(getattr(trainer, "strategy", None), "launcher", None)
    procs = [p for p in getattr(launcher, "procs", ()) or () if p.poll() is None]
    for proc in procs:
        try:
            proc.send_signal(signum)
        except OSError:
            pass
    for proc in procs:
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class StopAtTheSameStep(Callback):
    """While training: take the signals over from Lightning and stop every process at the same step.
    Also the test hook's ``first_step`` and ``test`` phases (``utils.stop.pause_at``)."""

    def __init__(self, signals: StopSignals) -> None:
        self.signals = signals
        self._first = False  # the next training batch is the first of this process (the test hook's first_step)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.signals.training = self.signals.trained = True
        self.signals.take_over()
        self._first = True

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int) -> None:
        if self._first:
            self._first = False
            stop.pause_at("first_step")

    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        stop.pause_at("test")

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        stopping = self.signals.pending
        if trainer.world_size > 1:
            stopping = trainer.strategy.reduce_boolean_decision(stopping, all=False)  # any process got one
        if stopping:
            trainer._signal_connector.received_sigterm = True  # the loop raises SIGTERMException after this batch
            if self.signals.received is None:
                self.signals.received = int(signal.SIGTERM)  # another process got it: stop as for SIGTERM

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.signals.training = False

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self.signals.training = False

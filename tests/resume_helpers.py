"""A callback that tests attach through the CLI to stop a run at a chosen training step
(``--trainer.callbacks+=tests.resume_helpers.SignalAtStep --trainer.callbacks.step N``)."""

from __future__ import annotations

import os
import signal

from lightning import Callback


class SignalAtStep(Callback):
    """Send ``signal`` (``SIGTERM`` or ``SIGUSR1``) when training step ``step`` ends.

    Deterministic, unlike a signal sent from outside at a random moment: the signal is real (the
    CLI's handlers take it, as they take a scheduler's), and it lands after the optimiser step that
    makes ``global_step == step``, inside training. A resumed run starts past ``step`` and never
    signals again. ``ranks``: ``all`` (every process signals itself, as a scheduler signals every
    task of a job) or ``first`` (only global rank 0, as ``kill`` of the command a user started).
    """

    def __init__(self, step: int, signal: str = "SIGTERM", ranks: str = "all") -> None:
        if ranks not in ("all", "first"):
            raise ValueError(f"ranks={ranks!r}: all or first")
        self.step = int(step)
        self.signal = signal
        self.ranks = ranks

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step != self.step or (self.ranks == "first" and trainer.global_rank != 0):
            return
        os.kill(os.getpid(), getattr(signal, self.signal))

"""A callback that tests attach through the CLI to stop a run at a chosen training step
(``--trainer.callbacks+=tests.resume_helpers.SignalAtStep --trainer.callbacks.step N``)."""

from __future__ import annotations

import os
import signal
import time

from lightning import Callback


class SignalAtStep(Callback):
    """Send ``signal`` (``SIGTERM`` or ``SIGUSR1``) when training step ``step`` ends.

    Deterministic, unlike a signal sent from outside at a random moment: the signal is real (the
    CLI's and Lightning's handlers take it, as they take a scheduler's), and it lands after the
    optimiser step that makes ``global_step == step``, inside training. A resumed run starts past
    ``step`` and never signals again.

    With several processes, as a scheduler would: SIGTERM goes to rank 0, whose Lightning handler
    forwards it to the other ranks and broadcasts it (a collective inside the handler), so the other
    ranks wait here, at the same step, until their forwarded SIGTERM has arrived and been handled;
    SIGUSR1 (which the CLI turns into the same stop, without a collective) goes to every rank.
    """

    def __init__(self, step: int, signal: str = "SIGTERM", timeout_s: float = 60.0) -> None:
        self.step = int(step)
        self.signal = signal
        self.timeout_s = timeout_s

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step != self.step:
            return
        if self.signal == "SIGTERM" and trainer.world_size > 1 and trainer.global_rank != 0:
            deadline = time.monotonic() + self.timeout_s
            while not trainer.received_sigterm and time.monotonic() < deadline:
                time.sleep(0.01)  # the handler runs between these sleeps
            return
        os.kill(os.getpid(), getattr(signal, self.signal))

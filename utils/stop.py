"""Stopping a command by a signal, from the moment the process starts: the exception and the test hook.

SIGTERM (a scheduler, ``kill``), SIGINT (Ctrl-C) and SIGUSR1 (a scheduler's warning) stop every
``repro`` command. ``install`` makes them raise ``StopRequested`` in the main thread; the
command's entry point installs it first thing (``reproductions/__main__.py``), so there is no
moment in which a signal kills the process silently or is lost. A fit replaces the handler
while it trains (``reproductions/run/signals.py``: the signal is then acted on at the end of the
training step, on every process at once).

``StopRequested`` derives from ``BaseException``, like ``KeyboardInterrupt``: the ``except
Exception`` of code that treats a failure as optional (a FLOP count, a W&B start, an optional
import) lets it through, so a stop is never taken for such a failure and swallowed.

``pause_at(phase)`` is a hook for tests: with ``REPRO_PAUSE_AT=<phase>[,<phase>...]`` set, the
process prints ``pause at <phase>`` to stderr and sleeps ``REPRO_PAUSE_SECONDS`` (default 30)
there, so a test can send a signal inside that phase; the sleep ends early once a stop was
noted (``note``). With ``REPRO_PAUSE_SIGNAL=SIGTERM`` (or another) the process sends itself that
signal after the line (a test in this process). Unset, it returns at once. The phases of a fit: ``parse``, ``model``,
``data``, ``wandb``, ``flops``, ``first_step``, ``test``, ``report``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator

#: the signals that stop a command
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
PAUSE_ENV = "REPRO_PAUSE_AT"
PAUSE_SECONDS_ENV = "REPRO_PAUSE_SECONDS"
PAUSE_SIGNAL_ENV = "REPRO_PAUSE_SIGNAL"

_noted: list[int] = []  # signals noted by a handler that defers the stop (see ``note``)


class StopRequested(BaseException):
    """A stop signal arrived (``signum``); not an ``Exception``, so no ``except Exception`` swallows it."""

    def __init__(self, signum: int) -> None:
        self.signum = int(signum)
        super().__init__(f"stopped by {self.name}")

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


def raise_stop(signum: int, frame) -> None:
    """The handler ``install`` sets: raise ``StopRequested``."""
    raise StopRequested(signum)


def install(handler: Callable = raise_stop, signals: Iterable[int] = STOP_SIGNALS) -> dict[int, object]:
    """Set ``handler`` for ``signals`` (main thread only; elsewhere nothing is changed); return the
    previous handlers, for ``restore``. A signal the parent process ignores (``nohup``, a
    background job of a non-interactive shell) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {}
    for signum in signals:
        old = signal.getsignal(signum)
        if old == signal.SIG_IGN:
            continue
        previous[signum] = old
        signal.signal(signum, handler)
    return previous


def restore(previous: dict[int, object]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


@contextlib.contextmanager
def deferred(signals: Iterable[int] = STOP_SIGNALS) -> Iterator[None]:
    """Within the block a stop signal is held back and handled (raised) at its end: for a step that
    must not be cut in two (starting a worker pool whose half-started workers would print tracebacks)."""
    held: list[int] = []
    previous = install(lambda signum, frame: held.append(signum), signals)
    try:
        yield
    finally:
        restore(previous)
        if held:
            signal.raise_signal(held[0])


def note(signum: int) -> None:
    """A handler that defers the stop says it got ``signum`` (ends a ``pause_at`` sleep early)."""
    _noted.append(int(signum))


def noted() -> int | None:
    """The first stop signal a deferring handler noted in this process, if any."""
    return _noted[0] if _noted else None


def pause_at(phase: str) -> None:
    """The test hook of the module docstring: free when ``REPRO_PAUSE_AT`` is unset."""
    wanted = os.environ.get(PAUSE_ENV)
    if not wanted or phase not in wanted.split(","):
        return
    print(f"pause at {phase}", file=sys.stderr, flush=True)
    seen = len(_noted)
    if os.environ.get(PAUSE_SIGNAL_ENV):
        os.kill(os.getpid(), getattr(signal, os.environ[PAUSE_SIGNAL_ENV]))
    deadline = time.monotonic() + float(os.environ.get(PAUSE_SECONDS_ENV) or 30)
    while time.monotonic() < deadline and len(_noted) == seen:
        time.sleep(0.05)  # a handler that raises ends the sleep at once

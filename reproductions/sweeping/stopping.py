"""Stopping a local sweep by a signal: every run it started stops at its step and is told apart.

SIGTERM, SIGINT (Ctrl-C) or SIGUSR1 to the sweep, alone (``kill <pid>``) or with its runs
(``kill -- -<process group>``, a terminal's Ctrl-C, a scheduler): the sweep sends the signal on
to each run it started (a run that got it already notes it twice, no harm), starts no further
run, waits for the started ones to end (each stops at the end of its training step and saves
its checkpoint, or, before training, at once: ``reproductions/run/signals.py``), releases their
locks and prints one line per stopped run (``stopped <variant> seed<k>: ...``, with its
checkpoint or that it had not started training), then exits with 128 + the signal's number, as
a stopped ``fit`` does. Rerunning the same sweep resumes the stopped runs from their checkpoints.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
from pathlib import Path

from reproductions.run.results import RESULTS_FILE
from utils import stop


class SweepStop:
    """The sweep's handler of the stop signals (``install`` ... ``restore``) and the runs it forwards them to."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._procs: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self._previous: dict = {}

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    def install(self) -> None:
        self.signum = None
        self._previous = stop.install(self.handle)

    def restore(self) -> None:
        stop.restore(self._previous)
        self._previous = {}

    def handle(self, signum: int, frame) -> None:
        self.signum = self.signum or signum
        with self._lock:
            procs = list(self._procs)
        for proc in procs:
            _send(proc, signum)

    def started(self, proc: subprocess.Popen) -> None:
        """``proc`` (a run) started: it gets the signals from now on (and at once, if one came already)."""
        with self._lock:
            self._procs.add(proc)
        if self.signum is not None:
            _send(proc, self.signum)

    def ended(self, proc: subprocess.Popen) -> None:
        with self._lock:
            self._procs.discard(proc)


def _send(proc: subprocess.Popen, signum: int) -> None:
    try:
        if proc.poll() is None:
            proc.send_signal(signum)
    except OSError:
        pass


#: the stop of the sweep running in this process (one at a time: signals belong to the process)
SWEEP_STOP = SweepStop()


def stopped_line(label: str, run_dir: Path) -> str:
    """``stopped <label>: ...``: where the run's checkpoint is (results.json ``interrupted``), or that it
    had not started training."""
    try:
        res = json.loads((Path(run_dir) / RESULTS_FILE).read_text())
    except (OSError, ValueError):
        res = None
    ckpt = res.get("checkpoint") if isinstance(res, dict) and res.get("status") == "interrupted" else None
    if ckpt:
        return (f"stopped {label}: at step {res.get('step')} (epoch {res.get('epoch')}), checkpoint {ckpt}; "
                "the rerun resumes it")
    return f"stopped {label}: it had not started training; the rerun starts it"

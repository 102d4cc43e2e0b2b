"""A stop signal at any moment of a fit or a sweep (``utils/stop.py``, ``reproductions/run/signals.py``,
``reproductions/sweeping/stopping.py``): before training the command stops at once with one line and leaves
no lock; once training started it stops at the step with a checkpoint and results.json ``interrupted``.
The moment is chosen by the test hook ``REPRO_PAUSE_AT=<phase>`` (the process pauses there; with
``REPRO_PAUSE_SIGNAL`` it sends itself the signal, else the test sends it from outside)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning.pytorch  # noqa: F401 - its log handlers bound to the real stderr, not to one test's capture
import pytest

from tests.cli_helpers import DIGITS, REPO, RUN, TINY, cli_env, no_traceback, repro_here

BEFORE = "before training started; nothing to resume; rerun the same command to start again"
#: phase -> (signal, extra arguments, what the line says after "stopped by SIG")
PHASES = {
    "parse": ("SIGTERM", [], BEFORE),
    "model": ("SIGINT", [], BEFORE),
    "data": ("SIGUSR1", [], BEFORE),
    "wandb": ("SIGTERM", ["--run.wandb", "true"], BEFORE),
    "flops": ("SIGINT", [], BEFORE),  # once swallowed by the FLOP count's `except Exception`: trained to the end
    "first_step": ("SIGTERM", [], "at step 1 (epoch 0); saved "),
    "test": ("SIGUSR1", [], "after training finished (step 3), before the test and results.json"),
    "report": ("SIGINT", [], "after training finished (step 3), before the test and results.json"),
}


def _left(root: Path) -> tuple[list[Path], dict | None]:
    """The locks left under ``root`` and the run's results.json (None if there is none)."""
    results = root / RUN / "results.json"
    return list(root.rglob("*.lock")), json.loads(results.read_text()) if results.is_file() else None


@pytest.mark.parametrize("phase", list(PHASES))
def test_a_signal_at_each_phase_of_a_fit_stops_it_cleanly(phase, tmp_path, capfd, monkeypatch):
    name, extra, says = PHASES[phase]
    root = tmp_path / "runs"
    result = repro_here("fit", "--config", DIGITS, "--run.root", str(root), *TINY, "--trainer.max_epochs", "1", *extra,
                        case=f"{name} at {phase}", capfd=capfd, monkeypatch=monkeypatch,
                        REPRO_PAUSE_AT=phase, REPRO_PAUSE_SIGNAL=name, REPRO_PAUSE_SECONDS="30")
    assert f"pause at {phase}" in result.output
    assert result.returncode == 128 + getattr(signal, name), result.output[-3000:]
    assert result.last.startswith(f"error: stopped by {name} {says}"), result.last
    assert sum(line.startswith("error:") for line in result.lines) == 1
    no_traceback(result)
    locks, results = _left(root)
    assert locks == []
    if says == BEFORE:  # nothing trained: nothing to resume, no results
        assert results is None and not (root / RUN / "checkpoints" / "last.ckpt").exists()
    else:  # resumable: the checkpoint is named in the line and in results.json, never "finished"
        last = root / RUN / "checkpoints" / "last.ckpt"
        assert last.is_file() and f"--ckpt_path {last}" in result.last
        assert results["status"] == "interrupted" and results["checkpoint"] == str(last)


def _wait_for(text: str, path: Path, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not (path.is_file() and text in path.read_text(errors="replace")):
        assert proc.poll() is None, path.read_text(errors="replace")[-3000:] if path.is_file() else "no output"
        assert time.monotonic() < deadline, f"{text!r} did not appear in {path}"
        time.sleep(0.1)


def _start(args: list[str], log: Path, **env: str) -> subprocess.Popen:
    with open(log, "w") as f:  # its own process group, as a terminal or a scheduler starts a job
        return subprocess.Popen([sys.executable, "-m", "reproductions", *args], cwd=REPO, stdout=f,
                                stderr=subprocess.STDOUT, env=cli_env(**env), start_new_session=True)


def _end(proc: subprocess.Popen, timeout: float = 120) -> int:
    try:
        return proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def _stop_at(phase: str, args: list[str], log: Path, *, watch: Path | None = None, group: bool = True) -> tuple[int, str]:
    """Start ``args`` paused at ``phase``; once ``pause at <phase>`` shows in ``watch`` (the log by default) send
    SIGTERM to its process group (``group``) or to it alone; (exit status, output)."""
    proc = _start(args, log, REPRO_PAUSE_AT=phase, REPRO_PAUSE_SECONDS="60")
    try:
        _wait_for(f"pause at {phase}", watch or log, proc)
        os.killpg(proc.pid, signal.SIGTERM) if group else proc.send_signal(signal.SIGTERM)
        return _end(proc), log.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def _no_process_left(marker: str, within: float = 0.5) -> None:
    """No process whose command line holds ``marker`` runs ``within`` seconds from now (an orphan would)."""
    deadline = time.monotonic() + within
    while True:
        time.sleep(0.5)
        left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
        if not left or time.monotonic() > deadline:
            break
    assert not left, f"processes left running: {left}"


@pytest.mark.distributed
@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.parametrize("phase, to_all, line", [
    ("flops", False, f"stopped by SIGTERM {BEFORE}"),
    ("test", True, "stopped by SIGTERM after training finished"),
])  # fmt: skip
def test_sigterm_to_a_ddp_fit_stops_both_processes_with_one_line(tmp_path, phase, to_all, line):
    """``flops``: only the command the user started gets the signal (``kill <pid>``) while every process is
    set up but none trains: the first stops and stops the other, which never got it. ``test``: a scheduler
    signals every task while the test runs (Lightning's own handler acts then, with a collective that fails
    once the first process has stopped). Either way one line, from the first process; no lock, no process
    left; after training, results.json interrupted and the checkpoint to resume from."""
    root, log = tmp_path / "runs", tmp_path / "out.log"
    code, out = _stop_at(phase, ["fit", "--config", DIGITS, "--run.root", str(root), *TINY, "--trainer.max_epochs", "2",
                                 "--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp"],
                         log, group=to_all)
    assert code == 128 + signal.SIGTERM, out[-3000:]
    errors = [x for x in out.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {line}"), out[-3000:]
    assert "Traceback" not in out
    run = root / "vit" / "digits" / "default" / "seed0"
    if phase == "flops":
        assert _left(root) == ([], None)
    else:
        assert json.loads((run / "results.json").read_text())["status"] == "interrupted"
        assert (run / "checkpoints" / "last.ckpt").is_file() and not (run / "run.lock").exists()
    _no_process_left(str(root), within=20)  # the second process may end a little after the first


@pytest.mark.subprocess
@pytest.mark.slow
def test_sigterm_to_a_sweeps_process_group_stops_its_run_with_a_checkpoint_and_releases_every_lock(tmp_path):
    root, log = tmp_path / "runs", tmp_path / "sweep.log"
    run = root / "vit" / "patch_size-smoke" / "patch_size=4" / "seed0"
    # the sweep and its run signalled, as a scheduler or a terminal signals a job
    code, out = _stop_at("first_step", ["sweep", "vit/patch_size", "--profile", "smoke", "--root", str(root), "--no-report"],
                         log, watch=run / "stdout.log")
    assert code == 128 + signal.SIGTERM, out[-3000:]
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    ckpt = run / "checkpoints" / "last.ckpt"
    assert [x for x in lines if x.startswith("stopped ")] == [
        f"stopped patch_size=4 seed0: at step 1 (epoch 0), checkpoint {ckpt}; the rerun resumes it"], out
    assert lines[-1].startswith("error: sweep vit/patch_size-smoke stopped by SIGTERM: 1 run(s) stopped, 0 finished, "
                                "2 not started; rerun the same command to continue"), lines[-1]
    assert "Traceback" not in out and "FAILED" not in out
    assert ckpt.is_file() and json.loads((run / "results.json").read_text())["status"] == "interrupted"
    assert list(root.rglob("*.lock")) == []
    assert not (root / "vit" / "patch_size-smoke" / "patch_size=2").exists()  # never started
    _no_process_left(str(root))


def test_a_signal_is_noted_before_lightnings_handler_from_the_moment_lightning_registers_it():
    """Lightning registers its SIGTERM handler at each stage's start; under DDP it runs a collective inside
    the handler, which raises once the other process has stopped, wherever the process is (inside
    ``inspect.getfullargspec`` that became "TypeError: unsupported callable"). From registration on the
    handler notes the signal first, so the stop is still known for what it is."""
    from lightning import Trainer

    from reproductions.run.signals import StopSignals
    from utils import stop

    class Cli:
        trainer = None

    signals = StopSignals(Cli())
    before = {s: signal.getsignal(s) for s in signals.signals()}
    noted = list(stop._noted)
    try:
        signals.install()
        trainer = Cli.trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                                        enable_checkpointing=False, enable_model_summary=False)
        signals.follow(trainer)
        wrapped = trainer._signal_connector.register_signal_handlers
        signals.follow(trainer)
        assert trainer._signal_connector.register_signal_handlers is wrapped  # a second call does not wrap twice

        def collective_of_a_stopped_peer(signum, frame):
            raise RuntimeError("Connection closed by peer")

        trainer._signal_connector._sigterm_notifier_fn = collective_of_a_stopped_peer
        trainer._signal_connector.register_signal_handlers()
        handler = signal.getsignal(signal.SIGTERM)
        assert getattr(handler, "notes_first", False)
        stop._noted.clear()
        with pytest.raises(RuntimeError, match="closed by peer"):
            handler(signal.SIGTERM, None)
        assert stop.noted() == signal.SIGTERM and signals.received == signal.SIGTERM
        trainer._signal_connector.teardown()
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
        stop._noted[:] = noted

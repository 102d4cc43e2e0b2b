"""Running a plan's runs: locally (subprocesses, ``jobs`` at a time, with progress and an
estimate of the time left) or as a SLURM job array script.

Each run is ``python -m reproductions fit ...`` in a subprocess started in the repository root
(``cwd``), so it imports this repository from any working directory even without ``pip install
-e .``; its output goes to ``<run dir>/stdout.log`` (streamed as it runs, so not an atomic
write). A run whose ``results.json`` says finished counts as done; a failed run is logged,
never stops the others, and is listed with the most telling line of its log (``last_error``).
A run's files are touched only under its lock (``reproductions/run/rundir.py``): the launcher takes
it before writing the log and holds it for the run it starts; a run whose lock another process
holds (a second sweep of the same root) is left alone, its log untouched, and reported as held,
and a run that another process finished after this plan was made is not run again, so two sweeps
of the same root share its runs.

Why a hand-written runner rather than W&B sweeps (or another scheduler): a W&B sweep needs a
W&B server to hand out the grid, and the runs must work offline; here each run is a plain CLI
subprocess whose ``results.json`` is the record of what it did (what is done, what to skip on a
rerun, what the report reads); and the same commands go unchanged into a SLURM job array, where
the cluster's scheduler replaces the local loop.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from reproductions.run.results import metric_value, read_results, results_state
from reproductions.run.rundir import LOCK_FILE, RunDirBusy, RunDirLock, describe_holder, read_holder
from reproductions.sweeping.plan import Plan, Run, run_path
from reproductions.sweeping.spec import REPO_ROOT, Sweep, SweepError
from reproductions.sweeping.stopping import SWEEP_STOP, stopped_line


# --------------------------------------------------------------------------- progress


def format_duration(seconds: float) -> str:
    """0:00:42, 1:02:03 (h:mm:ss)."""
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def estimate_remaining(durations: Sequence[float], remaining_runs: int, jobs: int = 1) -> float | None:
    """Mean duration of the runs finished so far x the runs still to finish, over parallel jobs."""
    if not durations:
        return None
    if remaining_runs <= 0:
        return 0.0
    return sum(durations) / len(durations) * math.ceil(remaining_runs / max(1, jobs))


def progress_line(k: int, n: int, label: str, elapsed: float, durations: Sequence[float], jobs: int = 1) -> str:
    """``[run 3/26] learned_2d-stem seed1 | elapsed 0:01:23 | remaining ~0:05:10 (mean 41.5 s/run over 2)``.

    ``k`` counts this invocation's runs (skipped finished runs are not in ``n``); the estimate is
    the mean duration of the runs that ended so far times the runs not yet ended.
    """
    eta = estimate_remaining(durations, n - len(durations), jobs)
    if eta is None:
        remaining = "remaining ? (no run finished yet)"
    else:
        mean = sum(durations) / len(durations)
        remaining = f"remaining ~{format_duration(eta)} (mean {mean:.1f} s/run over {len(durations)})"
    return f"[run {k}/{n}] {label} | elapsed {format_duration(elapsed)} | {remaining}"


# --------------------------------------------------------------------------- running


@dataclass
class RunOutcome:
    run: Run
    returncode: int
    seconds: float
    finished: bool  # results.json says finished
    held_by: str | None = None  # another process held the run's lock: not run here, nothing touched
    stopped: bool = False  # a signal stopped the sweep (and this run): reproductions/sweeping/stopping.py

    @property
    def failed(self) -> bool:
        return not self.finished and self.held_by is None and not self.stopped


def run_env(jobs: int = 1, threads: int | None = None) -> dict[str, str]:
    """The runs' environment: this process's, unbuffered, with the CPU threads per run
    (OMP_NUM_THREADS, unless already set): the profile's ``threads``, else with parallel jobs
    the cores split between them, since oversubscribed threads make small models many times
    slower. The import path is left alone: the runs start in the repository root."""
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if "OMP_NUM_THREADS" not in env:
        if threads:
            env["OMP_NUM_THREADS"] = str(threads)
        elif jobs > 1:
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // jobs))
    return env


def subprocess_runner(run: Run, env: dict[str, str]) -> int:
    """Run one command as a subprocess in the repository root (isolates failures and memory;
    imports this repository from any working directory); output to its stdout.log (appended to
    the interrupted attempt's when the run resumes, so the log tells the whole run)."""
    run.run_dir.mkdir(parents=True, exist_ok=True)
    with open(run.log_path, "a" if run.resumes_at is not None else "w") as log:
        if run.resumes_at is not None:
            log.write(f"\nsweep: resuming the interrupted attempt from step {run.resumes_at}\n")
        log.write(f"$ {shlex.join(run.command)}\n")
        log.flush()
        proc = subprocess.Popen(run.command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)
        SWEEP_STOP.started(proc)  # a signal to the sweep reaches the run (stopping.py)
        try:
            return proc.wait()
        except BaseException:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
        finally:
            SWEEP_STOP.ended(proc)


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b.*")


def last_error(log_path: Path, limit: int = 300) -> str:
    """The most telling line of a failed run's log: the last ``XxxError: message`` line (skipping
    jsonargparse's generic wrapper around a constructor's error), else the last non-empty line."""
    try:
        lines = [line.rstrip() for line in log_path.read_text(errors="replace").splitlines()]
    except OSError:
        return "no log"
    errors = [ln for ln in lines if _EXCEPTION_LINE.match(ln) and "Does not validate against any of the" not in ln]
    text = (errors or [ln for ln in lines if ln.strip()] or ["empty log"])[-1]
    return text if len(text) <= limit else text[: limit - 3] + "..."


def earlier_attempt(run: Run) -> tuple[Run, str | None]:
    """How ``run`` starts, given what an earlier attempt left in its directory: ``(run resuming
    from its own checkpoint, None)`` when the attempt was interrupted (results.json
    ``interrupted``, or none at all: a process killed outright) and left a readable
    ``checkpoints/last.ckpt`` or SLURM ``hpc_ckpt_*.ckpt`` made by this same command (the first
    ``$ ...`` line of its stdout.log); else ``(run, why it starts afresh)``, the reason None when
    there was no earlier attempt. Afresh, the run itself removes the old checkpoints."""
    from lightning_modules.checkpoint_io import checkpoint_step  # torch: only for a run with files
    from reproductions.run.ckpt_paths import hpc_checkpoint, read_checkpoint
    from reproductions.run.errors import RunFailed
    from reproductions.run.rundir import stale_checkpoints

    state, _ = results_state(run.run_dir)
    last = run.run_dir / "checkpoints" / "last.ckpt"
    found = [p for p in (last, hpc_checkpoint(run.run_dir)) if p is not None and p.is_file()]
    if not found:
        if stale_checkpoints(run.run_dir):
            return run, "the earlier attempt left no last.ckpt to continue from"
        return run, None if state == "missing" else f"the earlier attempt ({state}) left no checkpoint"
    if state not in ("interrupted", "missing"):
        return run, f"the earlier attempt {state}; its checkpoints are not continued"
    first = _first_command(run.log_path)
    if first is None or first[-len(run.args):] != run.args:
        return run, "its checkpoint was made by another command (the sweep file, profile or overrides changed)"
    ckpt = max(found, key=lambda p: p.stat().st_mtime_ns)
    try:
        step = checkpoint_step(read_checkpoint(ckpt, what=f"{run.label}'s checkpoint", error=RunFailed))
    except RunFailed as e:
        return run, f"its checkpoint cannot be read ({e})"
    return run.resuming(ckpt, step), None


SUPERSEDED_DIR = "superseded"


def supersede(runs: Sequence[Run], root: str | os.PathLike, *, stamp: str | None = None) -> Path:
    """Move the directories of finished ``runs`` that were made with another command than the plan's
    (``Plan.changed``: the sweep file, the profile or the overrides changed since) to
    ``<root>/superseded/<UTC time>/<experiment>/<variant>/seed<k>/``, so the sweep runs them again and
    neither its report nor ``repro registry add`` of the experiment reads the old ones (their records in
    ``results/`` stay until removed: ``repro registry check --definitions`` names them). Returns that
    folder. Each run directory's lock (``RunDirLock``) is taken before anything moves and held while it
    moves, so a run another live process holds stops it with nothing moved (``RunDirBusy``)."""
    root = Path(root).resolve()
    locks: list[RunDirLock] = []
    try:
        for run in runs:
            lock = RunDirLock(run.run_dir, "repro sweep --rerun-changed (moving it aside)")
            try:
                lock.acquire()
            except RunDirBusy as e:
                raise RunDirBusy(f"--rerun-changed: nothing was moved: {e}") from e
            locks.append(lock)
        dest = root / SUPERSEDED_DIR / (stamp or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
        for run in runs:
            target = dest / run.run_dir.resolve().relative_to(root)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(run.run_dir, target)
            (target / LOCK_FILE).unlink(missing_ok=True)  # this lock, moved with its directory
    finally:
        for lock in locks:
            lock.release()  # the directories not moved (a moved one's lock is gone with it)
    return dest


def resumable_first(runs: Sequence[Run]) -> tuple[list[Run], int]:
    """``runs`` with those that continue an interrupted attempt (``earlier_attempt``) first, each group in
    its own order, and how many those are: a sweep stopped again (a session's end, a preemption) has
    then finished the runs it had begun before it spends time on new ones."""
    resumes = {id(r) for r in runs if r.run_dir.is_dir() and earlier_attempt(r)[0].resumes_at is not None}
    return [r for r in runs if id(r) in resumes] + [r for r in runs if id(r) not in resumes], len(resumes)


def _first_command(log_path: Path) -> list[str] | None:
    """The command of a run's first attempt: the ``$ ...`` line its stdout.log starts with (the
    interpreter's path may differ, e.g. on another machine: compare what follows it)."""
    try:
        with open(log_path, errors="replace") as log:
            first = log.readline()
    except OSError:
        return None
    try:
        return shlex.split(first[2:]) if first.startswith("$ ") else None
    except ValueError:
        return None


def _metric_text(sweep: Sweep, run: Run) -> str:
    res = read_results(run.run_dir) or {}
    value = metric_value(res, sweep.metric.key)
    return f", {sweep.metric.key} = {value:.4f}" if isinstance(value, (int, float)) else ""


def execute(
    plan: Plan,
    runs: Sequence[Run],
    *,
    runner: Callable[[Run, dict[str, str]], int] = subprocess_runner,
    out: TextIO | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> list[RunOutcome]:
    """Run ``runs`` (``plan.jobs`` at a time), printing progress; never stops at a failure. A stop signal
    stops the runs started and starts no more (``reproductions/sweeping/stopping.py``); ``SWEEP_STOP.signum``
    says which, and each stopped run's outcome is ``stopped``."""
    out = out or sys.stdout
    n = len(runs)
    env = run_env(plan.jobs, plan.profile.threads)
    lock = threading.Lock()
    durations: list[float] = []
    outcomes: list[RunOutcome] = []
    start = clock()

    def say(text: str) -> None:
        with lock:
            print(text, file=out, flush=True)

    def one(k: int, run: Run) -> RunOutcome | None:
        if SWEEP_STOP.signum is not None:
            return None  # stopping: no further run starts
        with lock:
            line = progress_line(k, n, run.label, clock() - start, durations, plan.jobs)
        t0 = clock()
        run_lock = RunDirLock(run.run_dir, shlex.join(run.command), say=say, for_children=True)
        try:
            run_lock.acquire()
        except RunDirBusy:
            holder = read_holder(run.run_dir) or {}
            outcome = RunOutcome(run, -1, 0.0, False, held_by=describe_holder(holder) if holder else "another process")
            with lock:
                outcomes.append(outcome)
            say(f"{line}\n    HELD {run.label}: {run.run_dir} is in use by {outcome.held_by}; not run here, "
                "its files left as they are")
            return outcome
        if read_results(run.run_dir) is not None:  # finished meanwhile by another sweep of this root
            run_lock.release()
            outcome = RunOutcome(run, 0, 0.0, True)
            with lock:
                outcomes.append(outcome)
            say(f"{line}\n    done {run.label} meanwhile by another process; not run again")
            return outcome
        started, afresh = earlier_attempt(run)
        if started.resumes_at is not None:
            line += f"\n    resuming {run.label} from step {started.resumes_at} (the checkpoint of its interrupted attempt)"
        elif afresh:
            line += f"\n    starting {run.label} afresh: {afresh}"
        say(f"{line}\n    log: {run.log_path}")
        try:
            try:
                rc = runner(started, env)
            except Exception as e:  # a runner that cannot start the run (e.g. no such executable)
                run.run_dir.mkdir(parents=True, exist_ok=True)
                with open(run.log_path, "a") as log:
                    log.write(f"\nsweep: could not run: {type(e).__name__}: {e}\n")
                rc = -1
        finally:
            run_lock.release()
        seconds = clock() - t0
        finished = read_results(run.run_dir) is not None
        outcome = RunOutcome(run, rc, seconds, finished)
        with lock:
            durations.append(seconds)
            outcomes.append(outcome)
        if finished and rc == 0:
            resumed = f" (resumed from step {started.resumes_at})" if started.resumes_at is not None else ""
            say(f"    done {run.label} in {seconds:.1f} s{resumed}{_metric_text(plan.sweep, run)}")
        elif SWEEP_STOP.signum is not None:
            outcome.stopped = True
            say(f"    {stopped_line(run.label, run.run_dir)}")
        else:
            why = f"exit status {rc}" if rc != 0 else "exit status 0 but no finished results.json"
            say(f"    FAILED {run.label} ({why}) after {seconds:.1f} s: {last_error(run.log_path)}")
        return outcome

    SWEEP_STOP.install()  # a stop signal from here on is sent on to the runs, never raised into this loop
    try:
        if plan.jobs == 1:
            for k, run in enumerate(runs, 1):
                one(k, run)
        else:
            with ThreadPoolExecutor(max_workers=plan.jobs) as pool:
                futures = [pool.submit(one, k, run) for k, run in enumerate(runs, 1)]
                try:
                    for f in futures:
                        f.result()
                except BaseException:
                    for f in futures:
                        f.cancel()
                    raise
    finally:
        SWEEP_STOP.restore()
    order = {id(r): i for i, r in enumerate(runs)}
    return sorted(outcomes, key=lambda o: order[id(o.run)])


# --------------------------------------------------------------------------- slurm


def slurm_script(plan: Plan, runs: Sequence[Run], devices: int | None = None, sbatch: Sequence[str] = ()) -> str:
    """A job-array script: one array task per pending run, ``devices`` GPUs (and tasks) per run.

    Lightning reads the ranks from SLURM (``srun``, one task per GPU). A task whose run finished
    meanwhile (results.json says so) exits at once, and one whose run was interrupted (its
    results.json ``interrupted``, or none) resumes from its ``last.ckpt`` when the same command
    made it, so the script can be resubmitted as is. The
    script changes to the repository root, where the runs run (as local ones do).
    """
    if not runs:
        raise SweepError("no pending runs: nothing to put in a job array")
    if devices is not None and devices < 1:
        raise SweepError(f"devices={devices} must be at least 1")
    gpus = 1 if devices is None else devices
    exp_dir = plan.experiment_dir
    lines = [
        "#!/bin/bash",
        f"# Sweep {plan.sweep.id}, profile {plan.profile.name}: {len(runs)} pending runs of {len(plan.runs)}",
        f"# (experiment {plan.experiment}), one array task per run, {gpus} GPU(s) per task.",
        f"# Submit:      sbatch {shlex.quote(str(exp_dir / 'sweep.sbatch'))}",
        f"# When done:   {plan.sweep_command('report')}",
        f"#SBATCH --job-name={plan.experiment.replace('/', '-')}",
        f"#SBATCH --array=0-{len(runs) - 1}",
        "#SBATCH --nodes=1",
        f"#SBATCH --ntasks-per-node={gpus}",
        f"#SBATCH --gpus-per-node={gpus}",
        f"#SBATCH --output={exp_dir}/slurm/%A_%a.out",
        # SIGUSR1 90 s before the time limit: the run saves a checkpoint and requeues itself
        "#SBATCH --signal=SIGUSR1@90",
        "#SBATCH --requeue",
        *[f"#SBATCH {opt}" for opt in sbatch],
        "set -euo pipefail",
        f"cd {shlex.quote(str(REPO_ROOT))}",
        "",
        "RUN_DIRS=(",
        *[f"  {shlex.quote(run_path(r.run_dir))}" for r in runs],
        ")",
        "COMMANDS=(",
        *[f"  {shlex.quote(shlex.join(r.command))}" for r in runs],
        ")",
        "",
        'RUN_DIR="${RUN_DIRS[$SLURM_ARRAY_TASK_ID]}"',
        'CMD="${COMMANDS[$SLURM_ARRAY_TASK_ID]}"',
        # parses results.json: finished -> skip; a corrupt file is named and the task fails
        f'STATE=0; SAID=$({shlex.quote(sys.executable)} -m reproductions.run.results "$RUN_DIR") || STATE=$?',
        'if [ "$STATE" -eq 0 ]; then echo "already finished: $RUN_DIR"; exit 0; fi',
        'if [ "$STATE" -eq 2 ]; then exit 1; fi',
        'mkdir -p "$RUN_DIR"',
        # an interrupted attempt of this same command (a preemption, a cancelled job) continues from its
        # last.ckpt, as a local sweep's does (launch.earlier_attempt); else the run starts afresh
        'LAST="$RUN_DIR/checkpoints/last.ckpt"',
        'if [ -f "$LAST" ] && [ "$(head -n 1 "$RUN_DIR/stdout.log" 2>/dev/null)" = "$ $CMD" ] && '
        '{ [ "$SAID" = "$RUN_DIR: interrupted" ] || [ "$SAID" = "$RUN_DIR: missing" ]; }; then',
        '  echo "sweep: resuming the interrupted attempt from $LAST" | tee -a "$RUN_DIR/stdout.log"',
        '  CMD="$CMD --ckpt_path $(printf %q "$LAST")"',
        'else',
        '  echo "$ $CMD" > "$RUN_DIR/stdout.log"',
        'fi',
        'srun bash -c "$CMD" >> "$RUN_DIR/stdout.log" 2>&1',
        "",
    ]  # fmt: skip
    return "\n".join(lines)

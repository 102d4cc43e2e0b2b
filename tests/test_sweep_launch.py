"""Running (reproductions/sweeping/launch.py): progress and estimate, the runs' environment and
working directory, and SLURM job-array scripts."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from reproductions.run.results import RESULTS_FILE, atomic_write_json
from reproductions.commands.sweep import main as sweep_main
from reproductions.sweeping.launch import (
    estimate_remaining,
    execute,
    format_duration,
    progress_line,
    run_env,
    slurm_script,
    subprocess_runner,
)
from reproductions.sweeping.plan import Run, make_plan
from reproductions.sweeping.spec import Variant, load_sweep
from tests.sweep_helpers import REPO, fake_result


# --------------------------------------------------------------------------- progress


def test_progress_line_format_and_estimate():
    assert format_duration(83) == "0:01:23" and format_duration(3723) == "1:02:03"
    assert progress_line(1, 10, "none-stem seed0", 0.0, []) == (
        "[run 1/10] none-stem seed0 | elapsed 0:00:00 | remaining ? (no run finished yet)"
    )
    # 2 of 10 ended, mean 41.5 s: 8 left -> 332 s; with 2 jobs at once, 4 rounds -> 166 s
    assert progress_line(3, 10, "learned_2d-stem seed1", 83.0, [40.0, 43.0]) == (
        "[run 3/10] learned_2d-stem seed1 | elapsed 0:01:23 | remaining ~0:05:32 (mean 41.5 s/run over 2)"
    )
    assert estimate_remaining([40.0, 43.0], 8, jobs=2) == pytest.approx(166.0)
    assert estimate_remaining([10.0], 0) == 0.0 and estimate_remaining([], 5) is None


# --------------------------------------------------------------------------- slurm


def test_slurm_script_is_a_job_array_of_the_pending_runs(tmp_path, capsys):
    root = tmp_path / "runs"
    plan = make_plan("vit/attention", "smoke", root=root, seeds=2, launcher="slurm", devices=4)
    atomic_write_json(plan.runs[0].run_dir / RESULTS_FILE, fake_result(plan.runs[0]))
    argv = ["vit/attention", "--profile", "smoke", "--seeds", "2", "--root", str(root), "--launcher", "slurm",
            "--devices", "4", "--sbatch=--partition=gpu", "--sbatch=--time=04:00:00"]  # fmt: skip
    assert sweep_main(argv) == 0
    out = capsys.readouterr().out
    script_path = root / "vit/attention-smoke/sweep.sbatch"
    assert f"sbatch {script_path}" in out
    script = script_path.read_text()
    assert script.startswith("#!/bin/bash")
    assert "#SBATCH --array=0-2" in script  # 4 runs, 1 finished: 3 array tasks
    for line in ("#SBATCH --ntasks-per-node=4", "#SBATCH --gpus-per-node=4", "#SBATCH --partition=gpu",
                 "#SBATCH --time=04:00:00", "#SBATCH --job-name=vit-attention-smoke"):  # fmt: skip
        assert line in script
    assert script.count("--trainer.devices 4 --trainer.strategy ddp") == 3
    run_dirs = script.split("RUN_DIRS=(")[1].split(")")[0].split()
    assert run_dirs == [str(r.run_dir) for r in plan.runs[1:]]  # dot seed0 finished: not in the array
    assert f"\ncd {shlex.quote(str(REPO))}\n" in script and "PYTHONPATH" not in script  # runs start in the repo root
    assert subprocess.run(["bash", "-n", str(script_path)]).returncode == 0
    assert os.access(script_path, os.X_OK)
    # dry run: the script on stdout, nothing written
    script_path.unlink()
    assert sweep_main([*argv, "--dry-run"]) == 0
    assert "#SBATCH --array=0-2" in capsys.readouterr().out and not script_path.exists()


def test_slurm_array_task_runs_its_command_into_the_run_directory(tmp_path):
    """Execute the script as SLURM would for task 1 (srun faked: it runs its arguments)."""
    root = tmp_path / "runs"
    plan = make_plan("vit/attention", "smoke", root=root, launcher="slurm", python="/bin/echo")
    script = tmp_path / "sweep.sbatch"
    script.write_text(slurm_script(plan, plan.runs, devices=1))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/bash\nexec "$@"\n')
    (bin_dir / "srun").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_ARRAY_TASK_ID": "1"}
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    log = (plan.runs[1].run_dir / "stdout.log").read_text()
    assert "-m reproductions fit" in log and "--run.variant additive" in log
    assert not (plan.runs[0].run_dir / "stdout.log").exists()
    # an interrupted attempt of the same command resumes from its last.ckpt, its log kept (the first
    # attempt's command line and output, then the resumed one's output: srun is faked by echo)
    run_dir = plan.runs[1].run_dir
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"ckpt")
    atomic_write_json(run_dir / RESULTS_FILE, {"status": "interrupted"})
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and "resuming the interrupted attempt" in proc.stdout, proc.stderr
    log = (run_dir / "stdout.log").read_text()
    assert log.count("-m reproductions fit") == 3 and f"--ckpt_path {run_dir / 'checkpoints' / 'last.ckpt'}" in log
    # ... but not one another command made: that starts afresh
    (run_dir / "stdout.log").write_text("$ python -m reproductions fit --other\n")
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert "resuming" not in proc.stdout and "--ckpt_path" not in (run_dir / "stdout.log").read_text()
    # a finished run's task exits at once
    atomic_write_json(plan.runs[1].run_dir / RESULTS_FILE, fake_result(plan.runs[1]))
    (plan.runs[1].run_dir / "stdout.log").unlink()
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and "already finished" in proc.stdout
    assert not (plan.runs[1].run_dir / "stdout.log").exists()
    # a results.json cut in half is not taken as finished: the task names it and fails
    path = plan.runs[1].run_dir / RESULTS_FILE
    path.write_text(path.read_text()[: len(path.read_text()) // 2])
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert proc.returncode == 1 and "is corrupt" in proc.stderr and "already finished" not in proc.stdout
    assert "#SBATCH --signal=SIGUSR1@90" in script.read_text()


def test_run_environment_threads_and_import_path(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert "OMP_NUM_THREADS" not in run_env(1)  # one run alone: torch's default
    assert run_env(2)["OMP_NUM_THREADS"] == str(max(1, (os.cpu_count() or 1) // 2))  # cores split over jobs
    assert run_env(1, threads=1)["OMP_NUM_THREADS"] == "1"  # the profile's choice
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    assert run_env(1)["PYTHONPATH"] == "/elsewhere"  # left alone: the runs start in the repository root
    monkeypatch.delenv("PYTHONPATH")
    assert "PYTHONPATH" not in run_env(1)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert run_env(2, threads=1)["OMP_NUM_THREADS"] == "3"  # the user's setting wins
    assert load_sweep("vit/attention").profile("cpu").threads == 1


def test_runs_start_in_the_repository_root_from_any_directory(tmp_path, monkeypatch):
    """A run is a subprocess in the repository root: it imports this checkout by its working
    directory alone (``-S``: no site-packages, so no installed copy), wherever the sweep runs."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    probe = "import os, reproductions; print(os.getcwd()); print(reproductions.__file__)"
    run = Run(Variant("probe", {}), 0, tmp_path / "runs" / "probe" / "seed0", [], [sys.executable, "-S", "-c", probe])
    assert subprocess_runner(run, run_env(1)) == 0
    cwd, module = run.log_path.read_text().splitlines()[1:3]  # after the "$ command" line
    assert Path(cwd).resolve() == REPO
    assert Path(module).resolve() == REPO / "reproductions" / "__init__.py"


# --------------------------------------------------------------------------- two sweeps of one root


_HOLD = """
import sys, time
from reproductions.run.rundir import RunDirLock
lock = RunDirLock(sys.argv[1], "repro sweep (the other one)", for_children=True)
lock.acquire()
print("held", flush=True)
time.sleep(120)
"""


def test_a_run_another_process_holds_is_left_alone_and_reported_as_held(tmp_path):
    """A second sweep of the same root: the run the first one is running keeps its log and files (the second
    does not truncate them), the second says which run is held and by whom, and does not count it finished."""
    import io

    from tests.sweep_helpers import fake_runner

    root = tmp_path / "runs"
    plan = make_plan(load_sweep("vit/patch_size"), "smoke", root=root)
    busy = plan.runs[0]
    busy.run_dir.mkdir(parents=True)
    busy.log_path.write_text("the first sweep's output\n")
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(busy.run_dir)], cwd=REPO, stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        calls, out = [], io.StringIO()
        rc = sweep_main(["vit/patch_size", "--profile", "smoke", "--root", str(root), "--no-report"],
                        runner=fake_runner(calls=calls), out=out)  # fmt: skip
    finally:
        holder.kill()
        holder.wait()
    text = out.getvalue()
    assert rc == 1 and busy.label not in calls and len(calls) == len(plan.runs) - 1
    assert busy.log_path.read_text() == "the first sweep's output\n"  # untouched
    assert not (busy.run_dir / RESULTS_FILE).exists()
    assert f"{len(plan.runs) - 1} finished, 0 failed" in text and "1 held by another process" in text
    assert f"{busy.run_dir} in use by pid {holder.pid}" in text, text


def test_a_run_another_sweep_finished_after_the_plan_is_not_run_again(tmp_path):
    """Two sweeps of one root share its runs: a run that another process finished after this
    sweep planned it is counted finished, not trained (and overwritten) a second time."""
    import io

    from tests.sweep_helpers import fake_runner

    plan = make_plan(load_sweep("vit/patch_size"), "smoke", root=tmp_path / "runs")
    first, second = plan.runs[0], plan.runs[1]
    calls, out = [], io.StringIO()
    train = fake_runner(calls=calls)

    def runner(run, env):  # while this sweep trains the first run, another one finishes the second
        if run is first:
            train(second, env)
        return train(run, env)

    outcomes = execute(plan, plan.runs, runner=runner, out=out)
    assert calls.count(second.label) == 1 and len(calls) == len(plan.runs)  # once, by "the other sweep"
    assert all(o.finished and not o.failed for o in outcomes)
    assert f"done {second.label} meanwhile by another process; not run again" in out.getvalue()


def test_the_run_a_sweep_starts_continues_under_the_sweeps_lock(tmp_path):
    """The launcher holds the lock for the run it starts: a process below it inherits the lock, one
    elsewhere is refused."""
    from reproductions.run.rundir import RunDirLock

    outer = RunDirLock(tmp_path, "sweep", for_children=True)
    outer.acquire()
    child = subprocess.run([sys.executable, "-c", "import sys; from reproductions.run.rundir import RunDirLock; "
                            "l = RunDirLock(sys.argv[1]); l.acquire(); print(l.inherited, l.held)", str(tmp_path)],
                           cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert child.stdout.split() == ["True", "False"], child.stderr[-2000:]
    assert (tmp_path / "run.lock").exists()  # the run's end does not release the launcher's lock
    outer.release()
    plain = RunDirLock(tmp_path / "b", "a run")
    plain.acquire()
    other = subprocess.run([sys.executable, "-c", "import sys; from reproductions.run.rundir import RunDirLock; "
                            "RunDirLock(sys.argv[1]).acquire()", str(tmp_path / "b")],
                           cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert other.returncode != 0 and "RunDirBusy" in other.stderr  # without for_children: refused as before
    plain.release()


def test_one_report_at_a_time_per_sweep_and_profile(tmp_path):
    """A second `repro report` of the same sweep and profile while one is writing: refused in one line naming the
    holder (two at once would log one W&B report run into two offline folders at the same step); another
    profile's report is not held up."""
    from reproductions.commands.report import main as report_main
    from reproductions.run.rundir import ReportLock, RunDirBusy

    plan = make_plan(load_sweep("vit/patch_size"), "smoke", root=tmp_path / "runs")
    plan.experiment_dir.mkdir(parents=True)
    hold = _HOLD.replace("RunDirLock(sys.argv[1], \"repro sweep (the other one)\", for_children=True)",
                         "ReportLock(sys.argv[1], 'smoke', 'repro report (the other one)')").replace(
        "import RunDirLock", "import ReportLock")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(plan.experiment_dir)], cwd=REPO, stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunDirBusy, match=f"the smoke report of {plan.experiment_dir} is being written by another "
                                             f"process \\(pid {holder.pid} "):
            report_main(["vit/patch_size", "--profile", "smoke", "--root", str(tmp_path / "runs"), "--no-reference"])
        other = ReportLock(plan.experiment_dir, "cpu")
        other.acquire()  # another profile: its own lock
        other.release()
    finally:
        holder.kill()
        holder.wait()
    assert not (plan.experiment_dir / "report.md").exists()

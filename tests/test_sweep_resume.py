"""A rerun sweep resumes its interrupted runs from their own checkpoint (reproductions/sweeping/launch.py
``earlier_attempt``): the rules on prepared run directories, and end to end through ``repro sweep``, where
the resumed run's results and record equal the uninterrupted run's."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import torch
import yaml

from reproductions.run.results import RESULTS_FILE, atomic_write_json
from reproductions.sweeping.launch import earlier_attempt
from reproductions.sweeping.plan import make_plan, without_own_checkpoint
from reproductions.sweeping.records import make_record
from reproductions.sweeping.reuse import run_config
from reproductions.sweeping.spec import load_sweep
from tests.cli_helpers import repro
from tests.resume_helpers import VIT
from tests.sweep_helpers import DIGITS, write_sweep


def _plan(tmp_path: Path):
    sweep = load_sweep(write_sweep(tmp_path / "mini.yaml", variants=[{"name": "p2", "overrides": {}}]))
    return make_plan(sweep, "smoke", root=tmp_path / "runs")


def _attempt(run, *, status: str | None, ckpt: bool = True, command: list[str] | None = None, step: int = 7):
    """An earlier attempt's files: its log's command line, a last.ckpt at ``step``, a results.json."""
    run.run_dir.mkdir(parents=True, exist_ok=True)
    run.log_path.write_text(f"$ {shlex.join(command or run.command)}\nEpoch 0 ...\n")
    if ckpt:
        (run.run_dir / "checkpoints").mkdir(exist_ok=True)
        torch.save({"global_step": step, "state_dict": {}}, run.run_dir / "checkpoints" / "last.ckpt")
    if status is not None:
        atomic_write_json(run.run_dir / RESULTS_FILE, {"status": status, "step": step})


def test_an_interrupted_run_resumes_from_its_own_checkpoint(tmp_path):
    run = _plan(tmp_path).runs[0]
    assert earlier_attempt(run) == (run, None)  # nothing there: a plain first attempt
    _attempt(run, status="interrupted", step=7)
    started, afresh = earlier_attempt(run)
    assert afresh is None and started.resumes_at == 7
    ckpt = str(run.run_dir / "checkpoints" / "last.ckpt")
    assert started.command[-2:] == ["--ckpt_path", ckpt] and started.args[-2:] == ["--ckpt_path", ckpt]
    assert started.command[:-2] == run.command
    # a process killed outright writes no results.json: its checkpoint still continues it
    (run.run_dir / RESULTS_FILE).unlink()
    assert earlier_attempt(run)[0].resumes_at == 7


@pytest.mark.parametrize("case, why", [
    ("failed", "the earlier attempt failed"),
    ("other command", "made by another command"),
    ("no checkpoint", "left no checkpoint"),
    ("corrupt checkpoint", "cannot be read"),
    ("only a best checkpoint", "left no last.ckpt"),
])  # fmt: skip
def test_a_run_with_no_usable_checkpoint_starts_afresh_and_says_why(tmp_path, case, why):
    run = _plan(tmp_path).runs[0]
    if case == "failed":
        _attempt(run, status="failed")
    elif case == "other command":
        _attempt(run, status="interrupted", command=[*run.command[:-1], "--trainer.max_epochs", "99"])
    elif case == "no checkpoint":
        _attempt(run, status="interrupted", ckpt=False)
    elif case == "corrupt checkpoint":
        _attempt(run, status="interrupted")
        (run.run_dir / "checkpoints" / "last.ckpt").write_text("not a checkpoint")
    else:
        _attempt(run, status="interrupted")
        (run.run_dir / "checkpoints" / "last.ckpt").rename(run.run_dir / "checkpoints" / "best-epoch000.ckpt")
    started, afresh = earlier_attempt(run)
    assert started is run and started.resumes_at is None
    assert afresh is not None and why in afresh, afresh


def test_a_resumed_runs_recorded_command_is_not_another_command(tmp_path):
    plan = _plan(tmp_path)
    run = plan.runs[0]
    own = str(run.run_dir / "checkpoints" / "last.ckpt")
    recorded = "python -m reproductions " + " ".join(run.args)
    assert without_own_checkpoint(f"{recorded} --ckpt_path {own}", run.run_dir) == recorded
    other = str(tmp_path / "elsewhere" / "last.ckpt")  # another run's checkpoint: another start
    assert without_own_checkpoint(f"{recorded} --ckpt_path {other}", run.run_dir).endswith(other)
    atomic_write_json(run.run_dir / RESULTS_FILE, {"status": "finished", "command": f"{recorded} --ckpt_path {own}"})
    assert plan.changed() == []


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_sweep_stopped_mid_run_resumes_it_and_records_the_uninterrupted_result(tmp_path):
    """SIGTERM at step 8 of 18 (mid-epoch); the same sweep command again continues the run from
    step 8, and its results, curve and record equal those of a sweep that was never stopped."""
    overrides = dict(zip(VIT[0::2], VIT[1::2]))
    overrides = {k.removeprefix("--"): yaml.safe_load(v) for k, v in overrides.items()}
    sweep_file = write_sweep(tmp_path / "mini.yaml", base=str(DIGITS),
                             variants=[{"name": "p2", "overrides": {}}],
                             profiles={"smoke": {"seeds": 1, "overrides": overrides}})
    signal_at = ["--", "--trainer.callbacks+=tests.resume_helpers.SignalAtStep", "--trainer.callbacks.step", "8"]

    def sweep(root: str, *extra: str):
        return repro("sweep", str(sweep_file), "--profile", "smoke", "--root", str(tmp_path / root), "--no-report",
                     *extra, case=f"sweep into {root}")

    stopped = sweep("stopped", *signal_at)
    assert stopped.returncode == 1, stopped.output[-3000:]
    run_dir = tmp_path / "stopped" / "mini-smoke" / "p2" / "seed0"
    assert json.loads((run_dir / RESULTS_FILE).read_text())["status"] == "interrupted"

    resumed = sweep("stopped", *signal_at)
    assert resumed.returncode == 0, resumed.output[-3000:]
    assert "resuming p2 seed0 from step 8 (the checkpoint of its interrupted attempt)" in resumed.output
    assert "done p2 seed0 in" in resumed.output and "(resumed from step 8)" in resumed.output
    log = (run_dir / "stdout.log").read_text()
    assert "starting afresh" not in log and "sweep: resuming the interrupted attempt from step 8" in log
    assert "stopped by SIGTERM at step 8" in log  # the first attempt's output is kept

    straight = sweep("straight")
    assert straight.returncode == 0, straight.output[-3000:]
    straight_dir = tmp_path / "straight" / "mini-smoke" / "p2" / "seed0"
    a, b = (json.loads((d / RESULTS_FILE).read_text()) for d in (run_dir, straight_dir))
    assert a["status"] == b["status"] == "finished"
    assert a["training"]["steps"] == b["training"]["steps"] == 18
    assert a["test"] == b["test"] and a["best"]["score"] == b["best"]["score"]

    def record(d: Path, results: dict) -> dict:
        config = run_config(d)  # as ``repro registry add`` reads it
        return make_record(d, results, config, "vit/mini", "smoke", definition=config)

    ra, rb = record(run_dir, a), record(straight_dir, b)
    timing = [i for i, c in enumerate(ra["curve"]["columns"]) if c.startswith("time/")]
    rows = [[[v for i, v in enumerate(row) if i not in timing] for row in r["curve"]["rows"]] for r in (ra, rb)]
    assert rows[0] == rows[1] and len(rows[0]) == 3
    for key in ("test", "best", "final", "model", "plateau"):
        assert ra.get(key) == rb.get(key), key
    assert ra["plateau"] == a["plateau"] and ra["plateau"]["validations"] == 3  # the record keeps the run's
    # the interruption's callback aside, the resumed run's config is the uninterrupted run's
    differing = {k for k in set(ra["config"]) | set(rb["config"]) if ra["config"].get(k) != rb["config"].get(k)}
    assert differing and all(k.startswith("trainer.callbacks") for k in differing), differing


def test_a_rerun_sweep_resumes_its_interrupted_runs_before_it_starts_new_ones(tmp_path):
    """A sweep stopped again (a session's end, a preemption) should have finished what it had begun: the runs
    with an interrupted attempt to continue go first, the rest keep the sweep's order; a run whose attempt
    failed is not resumed, so it is not moved."""
    import io

    from reproductions.commands.sweep import main as sweep_main
    from tests.sweep_helpers import fake_runner

    root = tmp_path / "runs"
    runs = make_plan(load_sweep("vit/patch_size"), "smoke", seeds=2, root=root).runs
    assert len(runs) == 6
    _attempt(runs[-1], status="interrupted", step=5)
    _attempt(runs[-3], status=None, step=3)  # killed outright: no results.json
    _attempt(runs[1], status="failed", step=2)
    calls, out = [], io.StringIO()
    rc = sweep_main(["vit/patch_size", "--profile", "smoke", "--seeds", "2", "--root", str(root), "--no-report"],
                    runner=fake_runner(calls=calls), out=out)  # fmt: skip
    assert rc == 0, out.getvalue()
    assert calls == [runs[-3].label, runs[-1].label] + [r.label for r in runs if r not in (runs[-3], runs[-1])]
    assert "interrupted runs resume first: 2" in out.getvalue()
    text = out.getvalue()
    assert text.index(f"resuming {runs[-3].label} from step 3") < text.index(f"resuming {runs[-1].label} from step 5")

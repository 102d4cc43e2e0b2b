"""The sweep command (reproductions/commands/sweep.py): options, skip/continue/failure listing, parallel
jobs, and real sweeps at the smoke profile (in-process and as subprocesses)."""

from __future__ import annotations

import io
import json
import os
import platform
import re
import subprocess
import sys

import pytest
import yaml

from reproductions.__main__ import main as repro_main
from reproductions.run.errors import UsageError
from reproductions.run.rundir import RunDirBusy
from reproductions.commands.report import main as report_main
from reproductions.run.results import RESULTS_FILE, atomic_write_json, read_results
from reproductions.commands.sweep import main as sweep_main
from reproductions.sweeping.plan import make_plan
from reproductions.sweeping.reuse import resolve_config
from reproductions.sweeping.spec import SweepError
from tests.helpers import inprocess_runner
from tests.sweep_helpers import REPO, SWEEPS, config_value, fake_result, fake_runner, sets, write_sweep


def test_unknown_sweep_or_profile_or_option(tmp_path, capsys):
    assert sweep_main(["vit/nonesuch", "--dry-run"]) == 2
    assert "vit/position" in capsys.readouterr().err  # lists the sweeps there are
    assert sweep_main(["vit/position", "--profile", "tpu", "--dry-run"]) == 2
    assert "no profile 'tpu'; profiles: ['cpu', 'fmnist', 'fmnist-long', 'gpu', 'h200', 'imagenet', 'smoke']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sweep_main(["vit/position", "--sed", "3", "--dry-run"])  # a typo is not passed to the runs
    assert "after '--'" in capsys.readouterr().err


def test_extra_overrides_go_to_every_run_last(tmp_path, capsys):
    argv = ["vit/attention", "--profile", "smoke", "--root", str(tmp_path), "--dry-run", "--trainer.devices", "8",
            "--", "--trainer.max_epochs", "5"]  # fmt: skip
    assert sweep_main(argv) == 0
    commands = [line for line in capsys.readouterr().out.splitlines() if " fit " in line]
    assert len(commands) == 2
    for line in commands:
        assert line.endswith("--trainer.devices 8 --trainer.max_epochs 5")


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.parametrize("jobs", ["0", "-1"])
def test_jobs_below_one_is_refused_before_any_run(tmp_path, jobs):
    """--jobs 0 is a value given (not "the default"), --jobs -1 no pool size: one error line, exit 2,
    on the real command line, before any run starts and with nothing written."""
    root = tmp_path / "runs"
    cmd = [sys.executable, "-m", "reproductions", "sweep", "vit/patch_size", "--profile", "smoke", "--jobs", jobs,
           "--root", str(root)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
    env.pop("REPRO_DEBUG", None)
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    last = (proc.stdout + proc.stderr).strip().splitlines()[-1]
    assert last == (f"error: --jobs {jobs} is not a positive number; "
                    "give a positive number of parallel runs (e.g. --jobs 2)")  # fmt: skip
    assert "Traceback" not in proc.stderr and proc.stdout == ""  # no sweep header: nothing started
    assert not root.exists()


@pytest.mark.parametrize("option, value", [("--jobs", "0"), ("--jobs", "-3"), ("--seeds", "0"), ("--seeds", "-1"),
                                           ("--devices", "0"), ("--devices", "-2")])  # fmt: skip
def test_count_options_below_one_are_usage_errors(tmp_path, option, value):
    calls = []
    with pytest.raises(UsageError, match=re.escape(f"{option} {value} is not a positive number; give ")):
        sweep_main(["vit/patch_size", "--profile", "smoke", option, value, "--root", str(tmp_path / "runs")],
                   runner=fake_runner(calls=calls), out=io.StringIO())  # fmt: skip
    assert calls == [] and not (tmp_path / "runs").exists()
    if option == "--seeds":  # the report plans the same seeds
        with pytest.raises(UsageError, match=re.escape(f"--seeds {value} is not a positive number")):
            report_main(["vit/patch_size", "--profile", "smoke", "--seeds", value, "--root", str(tmp_path)])


def test_seed_option_runs_those_seeds_alone_and_the_report_names_them(tmp_path):
    """``--seed K`` (repeatable) adds seeds to a sweep without training the others again; the plan's
    command, printed in the report, gives the same seeds back."""
    root = tmp_path / "runs"
    calls = []
    argv = ["vit/patch_size", "--profile", "smoke", "--seed", "2", "--seed", "4", "--root", str(root), "--no-report"]
    assert sweep_main(argv, runner=fake_runner(calls=calls), out=io.StringIO()) == 0
    assert sorted(calls) == sorted(f"{v} seed{k}" for v in ("patch_size=1", "patch_size=2", "patch_size=4") for k in (2, 4))
    seeds = {p.name for p in (root / "vit/patch_size-smoke").glob("*/seed*")}
    assert seeds == {"seed2", "seed4"}
    plan = make_plan("vit/patch_size", "smoke", seeds=[2, 4], root=root)
    assert plan.seeds == [2, 4]
    assert plan.sweep_command().split()[5:9] == ["--seed", "2", "--seed", "4"]
    assert make_plan("vit/patch_size", "smoke", seeds=[0, 1, 2]).sweep_command().endswith("--seeds 3")  # a range: the count


def test_variant_option_runs_those_variants_alone(tmp_path, capsys):
    root = tmp_path / "runs"
    calls = []
    argv = ["vit/patch_size", "--profile", "smoke", "--variant", "patch_size=4", "--root", str(root), "--no-report"]
    assert sweep_main(argv, runner=fake_runner(calls=calls), out=io.StringIO()) == 0
    assert calls == ["patch_size=4 seed0"]
    plan = make_plan("vit/patch_size", "smoke", only=["patch_size=4", "patch_size=1"], root=root)
    order = [v.name for v in make_plan("vit/patch_size", "smoke").variants]
    kept = [name for name in order if name in ("patch_size=1", "patch_size=4")]
    assert [v.name for v in plan.variants] == kept  # the sweep's order, not the options'
    assert plan.sweep_command().split()[5:9] == ["--variant", kept[0], "--variant", kept[1]]
    every = make_plan("vit/patch_size", "smoke", only=["patch_size=1", "patch_size=2", "patch_size=4"])
    assert "--variant" not in every.sweep_command()  # all of them: the plain command
    assert sweep_main(["vit/patch_size", "--profile", "smoke", "--variant", "patch_size=3", "--root", str(root),
                       "--dry-run"]) == 2  # fmt: skip
    assert ("--variant 'patch_size=3' is not a variant of vit/patch_size at profile smoke; "
            f"its variants: {', '.join(order)}") in capsys.readouterr().err
    assert report_main(["vit/patch_size", "--profile", "smoke", "--variant", "nonesuch", "--root", str(root)]) == 2


def test_a_variant_subset_writes_the_whole_profiles_report(tmp_path):
    """The report after ``--variant`` is the profile's: a sweep whose check needs a variant that was not run (a
    baseline) still reports, and the other variants' rows say they were not run."""
    root = tmp_path / "runs"
    out = io.StringIO()
    assert sweep_main(["vit/patch_size", "--profile", "smoke", "--variant", "patch_size=4", "--root", str(root)],
                      runner=fake_runner(), out=out) == 0, out.getvalue()  # fmt: skip
    assert "report failed" not in out.getvalue()
    text = (root / "vit" / "patch_size-smoke" / "report.md").read_text()
    order = [v.name for v in make_plan("vit/patch_size", "smoke").variants]
    assert all(f"| {name} |" in text for name in order)
    assert "`repro report vit/patch_size --profile smoke --root" in text and "--variant" not in text.split("## Results")[0]
    assert [f"`{name}` seed 0: not run" in text for name in order] == [name != "patch_size=4" for name in order]


@pytest.mark.parametrize("argv, message", [
    (["--seed", "-1"], "--seed -1 is negative; seeds are 0, 1, 2, ..."),
    (["--seed", "3", "--seed", "3"], "--seed 3 is given twice; give each seed once"),
])  # fmt: skip
def test_bad_seed_options_are_usage_errors(tmp_path, argv, message):
    calls = []
    for main, kwargs in ((sweep_main, {"runner": fake_runner(calls=calls), "out": io.StringIO()}), (report_main, {})):
        with pytest.raises(UsageError, match=re.escape(message)):
            main(["vit/patch_size", "--profile", "smoke", *argv, "--root", str(tmp_path / "runs")], **kwargs)
    assert calls == [] and not (tmp_path / "runs").exists()
    with pytest.raises(SystemExit):  # argparse: --seeds and --seed exclude each other
        sweep_main(["vit/patch_size", "--profile", "smoke", "--seeds", "2", "--seed", "2", "--dry-run"])
    with pytest.raises(SweepError, match="distinct seeds >= 0"):
        make_plan("vit/patch_size", "smoke", seeds=[1, 1])


def test_make_plan_takes_jobs_zero_as_given_not_as_the_default():
    with pytest.raises(SweepError, match="jobs=0 must be at least 1"):
        make_plan("vit/patch_size", "smoke", jobs=0)
    assert make_plan("vit/patch_size", "smoke", jobs=3).jobs == 3
    assert make_plan("vit/patch_size", "smoke").jobs == 1  # not given: the profile's, else 1


# --------------------------------------------------------------------------- skip, continue, fail


def test_skips_finished_runs_continues_past_failures_and_lists_them(tmp_path):
    path = write_sweep(
        tmp_path / "p.yaml",
        aliases={"patch_size": "model.net.init_args.patch_size"},
        product={"patch_size": [2, 3, 4]},
        seeds=2,
        profiles={"smoke": {}},
    )
    root = tmp_path / "runs"
    plan = make_plan(path, "smoke", root=root)
    # a previous, interrupted sweep finished one run; another left no results.json
    atomic_write_json(plan.runs[0].run_dir / RESULTS_FILE, fake_result(plan.runs[0]))
    plan.runs[1].run_dir.mkdir(parents=True)
    calls, out = [], io.StringIO()
    rc = sweep_main([str(path), "--profile", "smoke", "--root", str(root), "--no-report"],
                    runner=fake_runner(fail={"patch_size=3"}, calls=calls), out=out)  # fmt: skip
    text = out.getvalue()
    assert rc == 1
    assert calls == ["patch_size=2 seed1", "patch_size=3 seed0", "patch_size=3 seed1",
                     "patch_size=4 seed0", "patch_size=4 seed1"]  # past the failures, finished one skipped
    assert "1 already finished (skipped), 5 to run" in text
    assert "[run 1/5] patch_size=2 seed1" in text and "[run 5/5] patch_size=4 seed1" in text
    assert re.search(r"\[run 2/5\] patch_size=3 seed0 \| elapsed \d:\d\d:\d\d \| remaining ~", text)
    assert "3 finished, 2 failed, 1 skipped" in text
    failed = text[text.index("failed runs"):]
    assert "patch_size=3 seed0: exit status 1; ValueError: patch_size=3 does not divide img_size=8" in failed
    assert str(plan.runs[2].log_path) in failed
    # rerun: only the failed runs run again
    calls.clear()
    rc = sweep_main([str(path), "--profile", "smoke", "--root", str(root), "--no-report"],
                    runner=fake_runner(calls=calls), out=io.StringIO())  # fmt: skip
    assert rc == 0 and calls == ["patch_size=3 seed0", "patch_size=3 seed1"]
    assert all(read_results(r.run_dir) for r in plan.runs)
    # everything finished: nothing runs
    calls.clear()
    assert sweep_main([str(path), "--profile", "smoke", "--root", str(root), "--no-report"],
                      runner=fake_runner(calls=calls), out=io.StringIO()) == 0 and calls == []  # fmt: skip


def test_exit_zero_without_results_counts_as_failed(tmp_path):
    path = write_sweep(tmp_path / "p.yaml", variants=[{"name": "a"}], profiles={"smoke": {}})

    def no_results(run, env):
        run.run_dir.mkdir(parents=True, exist_ok=True)
        run.log_path.write_text("fast_dev_run: a smoke test, so no results.json is written\n")
        return 0

    out = io.StringIO()
    assert sweep_main([str(path), "--profile", "smoke", "--root", str(tmp_path), "--no-report"],
                      runner=no_results, out=out) == 1  # fmt: skip
    assert "exit status 0 but no finished results.json" in out.getvalue()


def test_parallel_jobs_run_everything_and_report_in_order(tmp_path):
    path = write_sweep(tmp_path / "p.yaml", product={"x": [1, 2, 3, 4]}, profiles={"smoke": {"jobs": 2}})
    calls, out = [], io.StringIO()
    assert sweep_main([str(path), "--profile", "smoke", "--root", str(tmp_path), "--no-report"],
                      runner=fake_runner(fail={"x=3"}, calls=calls), out=out) == 1  # fmt: skip
    assert sorted(calls) == ["x=1 seed0", "x=2 seed0", "x=3 seed0", "x=4 seed0"]
    assert "3 finished, 1 failed" in out.getvalue()


# --------------------------------------------------------------------------- real runs


@pytest.mark.slow
@pytest.mark.parametrize("sweep", SWEEPS)
def test_every_sweep_runs_at_the_smoke_profile_and_reports(tmp_path, sweep):
    """Every sweep file's smoke profile through the real CLI (in this process, ~1 s a run) and
    its report: the runs' overrides reach the model, every run finishes, report.md and the
    figure exist and list no missing run."""
    root = tmp_path / "runs"
    out = io.StringIO()
    assert sweep_main([sweep, "--profile", "smoke", "--root", str(root)], runner=inprocess_runner, out=out) == 0, out.getvalue()
    plan = make_plan(sweep, "smoke", root=root)
    for run in plan.runs:
        res = read_results(run.run_dir)
        assert res is not None, (run.label, run.log_path.read_text()[-2000:])
        assert res["variant"] == run.variant.name and res["seed"] == run.seed
        cfg = yaml.safe_load((run.run_dir / "config.yaml").read_text())
        for key, value in run.variant.overrides.items():
            assert sets(config_value(cfg, key), value), (run.label, key)
    report = (plan.experiment_dir / "report.md").read_text()
    assert all(f"| {v.name} |" in report for v in plan.variants)
    assert "None: every planned run finished." in report
    png = plan.experiment_dir / f"{plan.sweep.axis}.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "report.md" in out.getvalue()


@pytest.mark.subprocess
@pytest.mark.slow
def test_end_to_end_subprocess_sweep_with_a_failing_variant(tmp_path):
    """``python -m reproductions sweep`` for real: two good variants and one whose patch size does
    not divide the image. The sweep goes past the failure, lists it, exits 1, and writes the
    report with the failure listed; rerun, it retries only the failed run."""
    path = write_sweep(
        tmp_path / "e2e.yaml",
        title="End to end",
        aliases={"patch_size": "model.net.init_args.patch_size"},
        variants=[{"name": "p4", "overrides": {"patch_size": 4}}, {"name": "p3", "overrides": {"patch_size": 3}},
                  {"name": "p2", "overrides": {"patch_size": 2}}],  # fmt: skip
        report={"plot": "accuracy_vs_flops", "check": "halving", "param": "patch_size"},
    )
    root = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "reproductions", "sweep", str(path), "--profile", "smoke", "--root", str(root)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    assert "[run 3/3] p2 seed0" in out and "2 finished, 1 failed" in out
    assert "p3 seed0: exit status 2; " in out  # a usage error and "patch_size=3 does not divide img_size=8" in out
    exp = root / "e2e-smoke"
    assert "patch_size=3 does not divide img_size=8" in (exp / "p3/seed0/stdout.log").read_text()
    for name in ("p4", "p2"):
        res = read_results(exp / name / "seed0")
        assert res is not None and 0.0 <= res["test"]["test/acc"] <= 1.0
        assert (exp / name / "seed0/stdout.log").read_text().startswith("$ ")
    report = (exp / "report.md").read_text()
    assert "`p3` seed 0: failed or unfinished: " in report and "does not divide" in report
    assert re.search(r"\| p4 \| \d+\.\d\d (\(below floor\) )?\| 1 \|", report) and re.search(r"\| p3 \| – \| 0 \|", report)
    assert "patch_size 4 -> 2 (side x0.50): GFLOPs/image x" in report
    assert (exp / "patch_size.png").is_file()
    # rerun: the finished runs are skipped, the failed one is tried again (and fails again)
    proc = subprocess.run(cmd + ["--no-report"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1
    assert "2 already finished (skipped), 1 to run" in proc.stdout and "[run 1/1] p3 seed0" in proc.stdout


def test_main_dispatches_sweep_and_report(tmp_path, capsys):
    assert repro_main(["sweep", "vit/attention", "--profile", "smoke", "--dry-run", "--root", str(tmp_path)]) == 0
    assert "--run.variant additive" in capsys.readouterr().out
    assert repro_main(["report", "vit/attention", "--profile", "smoke", "--root", str(tmp_path)]) == 1
    assert "no runs under" in capsys.readouterr().err


def test_finished_runs_made_with_another_command_are_kept_with_a_warning(tmp_path):
    path = write_sweep(tmp_path / "p.yaml", variants=[{"name": "a"}, {"name": "b"}], profiles={"smoke": {}})
    plan = make_plan(path, "smoke", root=tmp_path)
    same, other = fake_result(plan.runs[0]), fake_result(plan.runs[1])
    same["command"] = "python -m reproductions " + " ".join(plan.runs[0].args)
    other["command"] = "python -m reproductions fit --config old.yaml --trainer.max_epochs 99"
    atomic_write_json(plan.runs[0].run_dir / RESULTS_FILE, same)
    atomic_write_json(plan.runs[1].run_dir / RESULTS_FILE, other)
    out, calls = io.StringIO(), []
    assert sweep_main([str(path), "--profile", "smoke", "--root", str(tmp_path), "--no-report"],
                      runner=fake_runner(calls=calls), out=out) == 0  # fmt: skip
    assert calls == [] and [r.label for r in plan.changed()] == ["b seed0"]
    assert "warning: 1 finished runs were made with another config" in out.getvalue()


def test_rerun_changed_moves_the_finished_runs_of_another_command_aside_and_runs_them_again(tmp_path):
    """A tuned value taken into a sweep file changes its runs' command: --rerun-changed moves the runs made
    before to <root>/superseded/<time>/<experiment>/ (whole, nothing lost) and runs them; the others stay."""
    path = write_sweep(tmp_path / "p.yaml", variants=[{"name": "a"}, {"name": "b"}], profiles={"smoke": {}})
    plan = make_plan(path, "smoke", root=tmp_path / "runs")
    same, other = fake_result(plan.runs[0]), fake_result(plan.runs[1], acc=0.5)
    # another command that computes the same: without its last option, the run's W&B tags (they name it)
    same["command"] = "python -m reproductions " + " ".join(plan.runs[0].args[:-2])
    (plan.runs[0].run_dir).mkdir(parents=True)
    (plan.runs[0].run_dir / "config.yaml").write_text(resolve_config(plan.runs[0].args))
    other["command"] = "python -m reproductions fit --config old.yaml --model.init_args.lr 0.1"
    atomic_write_json(plan.runs[0].run_dir / RESULTS_FILE, same)
    atomic_write_json(plan.runs[1].run_dir / RESULTS_FILE, other)
    (plan.runs[1].run_dir / "checkpoints").mkdir()
    (plan.runs[1].run_dir / "checkpoints" / "best.ckpt").write_text("old weights")
    argv = [str(path), "--profile", "smoke", "--root", str(tmp_path / "runs"), "--no-report", "--rerun-changed"]

    # a live process holding the old run's lock: nothing moves, nothing runs
    lock = plan.runs[1].run_dir / "run.lock"
    lock.write_text(json.dumps({"pid": os.getpid(), "host": platform.node(), "started": "now"}))
    calls = []
    with pytest.raises(RunDirBusy, match="nothing was moved"):
        sweep_main(argv, runner=fake_runner(calls=calls), out=io.StringIO())
    assert calls == [] and read_results(plan.runs[1].run_dir)["command"] == other["command"]
    lock.unlink()

    out = io.StringIO()
    assert sweep_main([*argv, "--dry-run"], runner=fake_runner(calls=calls), out=out) == 0
    assert "would move 1 finished runs made with another config" in out.getvalue() and "b seed0" in out.getvalue()
    assert calls == [] and read_results(plan.runs[1].run_dir)["command"] == other["command"]

    out = io.StringIO()
    assert sweep_main(argv, runner=fake_runner(calls=calls), out=out) == 0
    assert calls == ["b seed0"], out.getvalue()
    assert "1 already finished (skipped), 1 to run" in out.getvalue() and "warning" not in out.getvalue()
    moved = list((tmp_path / "runs" / "superseded").glob(f"*/{plan.experiment}/b/seed0"))
    assert len(moved) == 1 and read_results(moved[0])["command"] == other["command"]
    assert (moved[0] / "checkpoints" / "best.ckpt").read_text() == "old weights"
    assert not (moved[0] / "run.lock").exists()  # the lock held while it moved is not left behind
    assert read_results(plan.runs[1].run_dir)["test"]["test/acc"] == 0.9  # the run made again
    assert read_results(plan.runs[0].run_dir)["command"] == same["command"]  # the same config: kept
    assert [r.label for r in make_plan(path, "smoke", root=tmp_path / "runs").changed()] == ["a seed0"]

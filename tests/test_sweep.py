"""Sweeps (reproductions/sweep.py): grid expansion, skip/continue/failure listing, progress,
dry run, launchers, and real sweeps at the smoke profile (in-process and as subprocesses)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from reproductions.__main__ import main as repro_main
from tests.helpers import inprocess_runner
from reproductions.results import RESULTS_FILE, atomic_write_json, read_results
from reproductions.sweep import (
    SweepError,
    cli_value,
    estimate_remaining,
    format_duration,
    load_sweep,
    main as sweep_main,
    make_plan,
    progress_line,
    run_env,
    slurm_script,
    sweep_id,
)

REPO = Path(__file__).resolve().parents[1]
DIGITS = REPO / "reproductions/vit/configs/digits.yaml"
SWEEP_FILES = sorted((REPO / "reproductions").glob("*/sweeps/*.yaml"))
SWEEPS = [sweep_id(p) for p in SWEEP_FILES]
SMOKE = {
    "model.net.init_args.embed_dim": 16, "model.net.init_args.depth": 1, "model.net.init_args.num_heads": 2,
    "trainer.max_epochs": 1, "trainer.limit_train_batches": 2, "trainer.limit_val_batches": 2,
    "trainer.limit_test_batches": 2, "trainer.enable_progress_bar": False, "trainer.enable_model_summary": False,
}  # fmt: skip


def config_value(cfg: dict, key: str):
    """The value of an override key (``model.net.init_args.pool``) in a resolved config dict,
    where LightningCLI nests subclass arguments under ``init_args``."""
    parts = key.split(".")
    if parts[0] in ("model", "data") and parts[1] not in ("class_path", "init_args"):
        parts.insert(1, "init_args")
    for part in parts:
        cfg = cfg[part]
    return cfg


def sets(resolved, given) -> bool:
    """The resolved config value holds the override: equal scalars (or the scalar's word, where the
    type is a union with str); for mappings every given key
    (a callback's resolved init_args also carry its defaults); lists item by item."""
    if isinstance(given, dict):
        return isinstance(resolved, dict) and all(k in resolved and sets(resolved[k], v) for k, v in given.items())
    if isinstance(given, list):
        return isinstance(resolved, list) and len(resolved) == len(given) and all(map(sets, resolved, given))
    # a union type that takes strings first keeps the word (trainer.devices: "2"; Lightning reads it as 2)
    return resolved == given or (isinstance(resolved, str) and resolved == str(given))


def write_sweep(path: Path, **spec) -> Path:
    spec.setdefault("axis", "patch_size")
    spec.setdefault("base", str(DIGITS))
    spec.setdefault("profiles", {"smoke": {"seeds": 1, "overrides": SMOKE}})
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def fake_result(run, acc: float = 0.9) -> dict:
    return {
        "status": "finished", "variant": run.variant.name, "seed": run.seed, "test": {"test/acc": acc},
        "model": {"params": 1000, "flops_per_sample": 1e6},
        "training": {"total_train_flops": 3e9, "fit_time_s": 1.0, "samples_per_sec": 100.0},
    }  # fmt: skip


def fake_runner(fail=(), calls=None):
    """A runner that 'trains' instantly: writes a log and, unless the variant is in ``fail``, results."""

    def runner(run, env):
        if calls is not None:
            calls.append(run.label)
        run.run_dir.mkdir(parents=True, exist_ok=True)
        if run.variant.name in fail:
            run.log_path.write_text("Traceback ...\nValueError: patch_size=3 does not divide img_size=8\n")
            return 1
        run.log_path.write_text("ok\n")
        atomic_write_json(run.run_dir / RESULTS_FILE, fake_result(run))
        return 0

    return runner


# --------------------------------------------------------------------------- the sweep files


@pytest.mark.parametrize("sweep", SWEEPS)
def test_every_sweep_file_expands_and_dry_runs_every_profile(sweep, tmp_path, capsys):
    s = load_sweep(sweep)
    assert {"smoke", "cpu", "gpu"} <= set(s.profiles)
    for profile in s.profiles:
        plan = make_plan(sweep, profile, root=tmp_path)
        variants = s.profiles[profile].variants or s.variants
        assert len(plan.runs) == len(variants) * len(plan.seeds)
        assert plan.experiment == f"{sweep}-{profile}"  # the profile is part of the experiment: never mixed
        names = [r.variant.name for r in plan.runs]
        assert len(set(zip(names, (r.seed for r in plan.runs)))) == len(plan.runs)
        for run in plan.runs:
            assert run.run_dir == tmp_path / plan.experiment / run.variant.name / f"seed{run.seed}"
            assert run.args[:2] == ["fit", "--config"] and Path(run.args[2]).is_file()
            args = run.args
            assert args[args.index("--run.variant") + 1] == run.variant.name
            assert args[args.index("--seed_everything") + 1] == str(run.seed)
            assert args[args.index("--run.group") + 1] == plan.experiment
            assert s.axis in json.loads(args[args.index("--run.tags") + 1])
            for key, value in run.variant.overrides.items():  # the variant's overrides, after the profile's
                i = len(args) - 1 - args[::-1].index(f"--{key}")
                assert args[i + 1] == cli_value(value)
        assert sweep_main([sweep, "--profile", profile, "--dry-run", "--root", str(tmp_path)]) == 0
        out = capsys.readouterr().out
        assert out.count("-m reproductions fit --config") == len(plan.runs)
        assert f"{len(plan.runs)} to run" in out
    assert not list(tmp_path.iterdir())  # a dry run writes nothing


def test_position_sweep_is_table8_plus_our_extras_with_the_papers_numbers():
    s = load_sweep("vit/position")
    pairs = {(v.axes["pos_embed"], v.axes["pos_placement"]): v for v in s.variants}
    placements = ("stem", "every_layer", "every_layer_shared")
    table8 = {("none", "stem"), ("relative", "stem")} | {(k, p) for k in ("learned_1d", "learned_2d") for p in placements}
    extras = {("sincos_2d", p) for p in placements} | {("relative_2d", "stem")}
    assert set(pairs) == table8 | extras
    paper = {k: pairs[k].paper["table8"].value for k in table8}
    assert paper == {  # ../shared/PAPERS.md, Table 8
        ("none", "stem"): 0.61382, ("learned_1d", "stem"): 0.64206, ("learned_1d", "every_layer"): 0.63964,
        ("learned_1d", "every_layer_shared"): 0.64292, ("learned_2d", "stem"): 0.64001,
        ("learned_2d", "every_layer"): 0.64046, ("learned_2d", "every_layer_shared"): 0.64022,
        ("relative", "stem"): 0.64032,
    }  # fmt: skip
    assert all("table8" not in pairs[k].paper for k in extras)
    small = {k: v.paper["small_cifar10"].value for k, v in pairs.items() if "small_cifar10" in v.paper}
    assert small == {("none", "stem"): 79.63, ("learned_1d", "stem"): 86.52, ("sincos_2d", "stem"): 86.09,
                     ("relative", "stem"): 90.57}  # fmt: skip
    v = pairs[("learned_2d", "every_layer")]
    assert v.name == "learned_2d-every_layer"
    assert v.overrides == {"model.net.init_args.pos_embed": "learned_2d", "model.net.init_args.pos_placement": "every_layer"}
    assert {r.key: r.scale for r in s.references} == {"table8": "fraction", "small_cifar10": "percent"}
    assert "not directly comparable" in next(r.note for r in s.references if r.key == "table8").lower()


def test_patch_and_pooling_grids_fit_their_images():
    patch = load_sweep("vit/patch_size")
    assert [v.axes["patch_size"] for v in patch.variants] == [4, 2, 1]  # 8 px digits (cpu, smoke)
    assert [v.axes["patch_size"] for v in patch.profile("gpu").variants] == [8, 4, 2]  # 32 px CIFAR
    assert "cifar10" in patch.profile("gpu").base
    pooling = load_sweep("vit/pooling")
    assert {v.axes["pool"] for v in pooling.variants} == {"cls", "gap"}
    assert len(pooling.variants) == 2 * len({v.axes["lr"] for v in pooling.variants}) >= 6
    assert all(v.overrides["model.init_args.lr"] == v.axes["lr"] for v in pooling.variants)
    assert [v.name for v in load_sweep("vit/attention").variants] == ["dot", "additive"]


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_every_profile_builds_through_the_cli(profile, tmp_path):
    """Every run of the cpu and gpu profiles parses and instantiates (model, data, trainer) through
    ReproductionCLI without training: keys, types and the model's own checks (patch divides image,
    valid kind/placement) hold. CIFAR is not downloaded: nothing reads data before fit."""
    from reproductions.cli import ReproductionCLI

    class BuildOnly(ReproductionCLI):
        def _run_subcommand(self, subcommand):
            pass

    def plan_overrides(sweep, profile):
        s = load_sweep(sweep)
        return {**s.overrides, **s.profile(profile).overrides}

    for sweep in SWEEPS:
        for run in make_plan(sweep, profile, root=tmp_path, seeds=1).runs:  # seeds differ only in one number
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                cli = BuildOnly(args=run.args)
            cfg = cli.config["fit"].as_dict()
            for key, value in {**plan_overrides(sweep, profile), **run.variant.overrides}.items():
                assert sets(config_value(cfg, key), value), (sweep, run.label, key)
            assert cli.datamodule is not None
            if sweep.startswith("vit/"):
                assert cli.model.net.num_classes == 10


# --------------------------------------------------------------------------- expansion rules


def test_product_axes_aliases_seeds_and_profile_replacements(tmp_path):
    path = write_sweep(
        tmp_path / "grid.yaml",
        aliases={"pool": "model.net.init_args.pool", "lr": "model.init_args.lr"},
        product={"pool": ["cls", "gap"], "lr": [3.0e-4, 1.0e-3, 3.0e-3]},
        seeds=2,
        overrides={"trainer.max_epochs": 3},
        profiles={
            "smoke": {"overrides": {"trainer.max_epochs": 1, "lr": 0.5}},
            "cpu": {"seeds": [5, 7], "product": {"pool": ["gap"], "lr": [1.0e-2]}},
        },
    )
    plan = make_plan(path, "smoke", root=tmp_path / "runs")
    assert [v.name for v in plan.variants] == [
        "pool=cls,lr=0.0003", "pool=cls,lr=0.001", "pool=cls,lr=0.003",
        "pool=gap,lr=0.0003", "pool=gap,lr=0.001", "pool=gap,lr=0.003",
    ]  # fmt: skip
    assert plan.seeds == [0, 1] and len(plan.runs) == 12
    assert plan.experiment == "grid-smoke"
    v = plan.variants[4]
    assert v.overrides == {"model.net.init_args.pool": "gap", "model.init_args.lr": 0.001}
    assert v.axes == {"pool": "gap", "lr": 0.001}
    args = plan.runs[8].args  # variant 4, seed 0
    # one value per key; later ones win: sweep (max_epochs 3) < profile (1, lr 0.5) < variant (lr 0.001)
    assert [args[i + 1] for i, a in enumerate(args) if a == "--model.init_args.lr"] == ["0.001"]
    assert [args[i + 1] for i, a in enumerate(args) if a == "--trainer.max_epochs"] == ["1"]
    cpu = make_plan(path, "cpu", root=tmp_path)
    assert [r.label for r in cpu.runs] == ["pool=gap,lr=0.01 seed5", "pool=gap,lr=0.01 seed7"]
    assert make_plan(path, "cpu", seeds=3).seeds == [0, 1, 2]  # --seeds N: seeds 0..N-1


def test_variants_crossed_with_a_product_carry_both_axes_and_their_own_base(tmp_path):
    """``variants`` + ``product``: every variant at every product point (the data-size study: each
    model at each training-set size), named ``<variant>,<axis>=<value>``, with the variant's base
    config, its declared ``axes`` and the point's; a profile's ``product`` crosses the sweep's variants."""
    resnet = REPO / "reproductions" / "vit" / "configs" / "resnet_fashion_mnist.yaml"
    path = write_sweep(
        tmp_path / "cross.yaml",
        aliases={"n": "data.init_args.train_samples", "dim": "model.net.init_args.embed_dim"},
        variants=[
            {"name": "ViT-S", "axes": {"model": "ViT", "size": "S"}, "overrides": {"dim": 32}},
            {"name": "ResNet-S", "axes": {"model": "ResNet", "size": "S"}, "base": str(resnet)},
        ],
        product={"n": [100, 300]},
        profiles={"smoke": {"seeds": 1}, "gpu": {"product": {"n": [1000]}}},
    )
    plan = make_plan(path, "smoke", root=tmp_path / "runs")
    assert [v.name for v in plan.variants] == ["ViT-S,n=100", "ViT-S,n=300", "ResNet-S,n=100", "ResNet-S,n=300"]
    vit, res = plan.variants[1], plan.variants[2]
    assert vit.axes == {"dim": 32, "model": "ViT", "size": "S", "n": 300}
    assert vit.overrides == {"model.net.init_args.embed_dim": 32, "data.init_args.train_samples": 300}
    assert vit.base is None and res.base == str(resnet)
    assert res.overrides == {"data.init_args.train_samples": 100}
    gpu = make_plan(path, "gpu", root=tmp_path / "runs")
    assert [v.name for v in gpu.variants] == ["ViT-S,n=1000", "ResNet-S,n=1000"]


def test_cli_values_parse_back():
    assert cli_value(0.001) == "0.001" and cli_value(3) == "3" and cli_value(False) == "false"
    assert cli_value("learned_2d") == "learned_2d" and cli_value(None) == "null"
    assert cli_value("true") == '"true"' and cli_value("1") == '"1"'  # strings that YAML would retype
    assert yaml.safe_load(cli_value([1, 2])) == [1, 2]


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"variants": [{"name": "a", "overrides": {"x": 2}}], "product": {"x": [1]}}, "sets ['x'], an axis of 'product'"),
        ({}, "give 'variants' (a list), 'product' (axes) or both"),
        ({"variants": [{"name": "a", "axes": [1]}]}, "expected a mapping"),
        ({"variants": [{"name": "a/b"}]}, "no '/'"),
        ({"variants": [{"name": "a"}, {"name": "a"}]}, "repeat"),
        ({"variants": [{"name": "a", "overide": {}}]}, "unknown keys ['overide']"),
        ({"variants": [{"name": "a", "paper": {"t9": 1.0}}]}, "unknown references ['t9']"),
        ({"variants": [{"name": "a"}], "seeds": 0}, "at least 1"),
        ({"variants": [{"name": "a"}], "grid": {}}, "unknown keys ['grid']"),
        ({"variants": [{"name": "a"}], "base": "no/such.yaml"}, "base config 'no/such.yaml' not found"),
    ],
)
def test_bad_sweep_files_fail_with_the_key_and_the_file(tmp_path, spec, message):
    path = write_sweep(tmp_path / "bad.yaml", **spec)
    with pytest.raises(SweepError, match=re.escape(message)) as err:
        make_plan(path, "smoke")
    assert "bad.yaml" in str(err.value)


def test_unknown_sweep_or_profile_or_option(tmp_path, capsys):
    assert sweep_main(["vit/nonesuch", "--dry-run"]) == 2
    assert "vit/position" in capsys.readouterr().err  # lists the sweeps there are
    assert sweep_main(["vit/position", "--profile", "tpu", "--dry-run"]) == 2
    assert "['cpu', 'gpu', 'smoke']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sweep_main(["vit/position", "--seed", "3", "--dry-run"])  # a typo is not passed to the runs
    assert "after '--'" in capsys.readouterr().err


def test_extra_overrides_go_to_every_run_last(tmp_path, capsys):
    argv = ["vit/attention", "--profile", "smoke", "--root", str(tmp_path), "--dry-run", "--trainer.devices", "8",
            "--", "--trainer.max_epochs", "5"]  # fmt: skip
    assert sweep_main(argv) == 0
    commands = [line for line in capsys.readouterr().out.splitlines() if " fit " in line]
    assert len(commands) == 2
    for line in commands:
        assert line.endswith("--trainer.devices 8 --trainer.max_epochs 5")


def test_devices_and_launchers_in_the_commands(tmp_path):
    plan = make_plan("vit/attention", "smoke", root=tmp_path, devices=2, launcher="torchrun", wandb=True)
    cmd = plan.runs[0].command
    assert cmd[:8] == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                       "-m", "reproductions"]  # fmt: skip
    joined = shlex.join(cmd)
    assert "--trainer.devices 2 --trainer.strategy ddp" in joined and "--run.wandb true" in joined
    one = make_plan("vit/attention", "smoke", root=tmp_path, devices=1)
    assert "--trainer.devices 1" in shlex.join(one.runs[0].command) and "strategy" not in shlex.join(one.runs[0].command)
    with pytest.raises(SweepError, match="one at a time"):
        make_plan("vit/attention", "smoke", devices=2, jobs=2)


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
    # a finished run's task exits at once
    atomic_write_json(plan.runs[1].run_dir / RESULTS_FILE, fake_result(plan.runs[1]))
    (plan.runs[1].run_dir / "stdout.log").unlink()
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and "already finished" in proc.stdout
    assert not (plan.runs[1].run_dir / "stdout.log").exists()


# --------------------------------------------------------------------------- real runs


@pytest.mark.slow
def test_every_sweep_runs_at_the_smoke_profile_and_reports(tmp_path):
    """Every sweep file's smoke profile through the real CLI (in this process, ~0.5 s a run) and
    its report: the runs' overrides reach the model, every run finishes, report.md and the
    figure exist and list no missing run."""
    root = tmp_path / "runs"
    for sweep in SWEEPS:
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
    assert "p3 seed0: exit status 1; " in out and "patch_size=3 does not divide img_size=8" in out
    exp = root / "e2e-smoke"
    assert "patch_size=3 does not divide img_size=8" in (exp / "p3/seed0/stdout.log").read_text()
    for name in ("p4", "p2"):
        res = read_results(exp / name / "seed0")
        assert res is not None and 0.0 <= res["test"]["test/acc"] <= 1.0
        assert (exp / name / "seed0/stdout.log").read_text().startswith("$ ")
    report = (exp / "report.md").read_text()
    assert "`p3` seed 0: failed or unfinished: " in report and "does not divide" in report
    assert re.search(r"\| p4 \| \d+\.\d\d \| 1 \|", report) and re.search(r"\| p3 \| – \| 0 \|", report)
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
    assert "warning: 1 finished runs were made with another command" in out.getvalue()


def test_run_environment_threads_and_import_path(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert "OMP_NUM_THREADS" not in run_env(1)  # one run alone: torch's default
    assert run_env(2)["OMP_NUM_THREADS"] == str(max(1, (os.cpu_count() or 1) // 2))  # cores split over jobs
    assert run_env(1, threads=1)["OMP_NUM_THREADS"] == "1"  # the profile's choice
    assert run_env(1)["PYTHONPATH"].split(os.pathsep)[0] == str(REPO)  # runs import the repo from any cwd
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert run_env(2, threads=1)["OMP_NUM_THREADS"] == "3"  # the user's setting wins
    assert load_sweep("vit/attention").profile("cpu").threads == 1

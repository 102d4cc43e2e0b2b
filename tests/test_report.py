"""Reports (reproductions/sweeping/sweep_report.py, reproductions/commands/report.py) on hand-made results.json
files: the table beside the paper, missing and failed runs listed, the claim checks and figures
per plot kind, W&B."""

from __future__ import annotations

import io
import json
import os
import platform
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from reproductions.commands.report import main as report_main
from reproductions.run.results import RESULTS_FILE, atomic_write_json
from utils.process import process_start
from reproductions.sweeping.plan import make_plan
from reproductions.sweeping.collect import collect
from reproductions.sweeping.sweep_report import REPORT_FILE, write_report
from reproductions.sweeping.spec import SweepError
from reproductions.sweeping.tables import table
from tests.report_helpers import PNG, REPO, bst_result, position_sweep, put, result, write_report_sweep


def test_report_table_from_hand_made_results(tmp_path, capsys):
    sweep = position_sweep(tmp_path)
    root, exp = tmp_path / "runs", "pos-smoke"
    for seed, acc in enumerate([0.90, 0.92, 0.94]):  # 92.00 ± 2.00
        put(root, exp, "learned", seed, acc=acc, fit_time=30.0 + seed, speed=100.0 + 10 * seed)
    for seed, acc in enumerate([0.80, 0.81]):  # seed 2 failed: 80.50 ± 0.71 over n = 2
        put(root, exp, "none", seed, acc=acc, params=135000)
    failed = root / exp / "none" / "seed2"
    failed.mkdir(parents=True)
    (failed / "stdout.log").write_text("Traceback (most recent call last):\nRuntimeError: CUDA out of memory\n")
    put(root, exp, "relative", 0, acc=0.95)  # seeds 1 and 2 never ran
    put(root, exp, "relative", 7, acc=0.97)  # an extra seed found on disk counts too
    (root / exp / "relative" / "seed8").mkdir()  # an unplanned, unfinished seed: ignored
    # "sincos" has no results at all: seed 0 is running now (a live lock), seed 1 died (a stale lock)
    running = root / exp / "sincos" / "seed0"
    running.mkdir(parents=True)
    (running / "stdout.log").write_text("UserWarning: something\n")
    (running / "run.lock").write_text(json.dumps({"pid": os.getpid(), "host": platform.node(), "started": "T0",
                                                  "proc_start": process_start(os.getpid())}))  # fmt: skip
    dead = root / exp / "sincos" / "seed1"
    dead.mkdir(parents=True)
    (dead / "stdout.log").write_text("KeyboardInterrupt\n")
    (dead / "run.lock").write_text(json.dumps({"pid": 2**22 + 12345, "host": platform.node(), "started": "T1"}))

    assert report_main([str(sweep), "--profile", "smoke", "--root", str(root)]) == 0
    md = (root / exp / REPORT_FILE).read_text()
    rows = {line.split(" | ")[0].strip("| "): line for line in md.splitlines() if line.startswith("| ")}
    assert rows["learned"] == "| learned | 92.00 ± 2.00 | 3 | 64.21 | 86.52 (unverified) | 136k | 0.00476 | 730 GFLOP | 110 ± 10 | 31.0 s |"
    assert rows["none"].startswith("| none | 80.50 ± 0.71 | 2 | 61.38 | 79.63 | 135k |")
    assert rows["relative"].startswith("| relative | 96.00 ± 1.41 | 2 | 64.03 | – |")
    assert rows["sincos"].startswith("| sincos | – | 0 | – | – | – |")  # kept in the table, not dropped
    header = rows["variant"]
    assert "ours: test acc. (%), mean ± std" in header and "Table 8 (%)" in header and "README CIFAR-10 (%)" in header
    for column in ("params", "GFLOPs/image", "training FLOPs", "train images/s", "time/run"):
        assert column in header
    missing = md[md.index("## Missing or failed runs"):]
    assert "`none` seed 2: failed or unfinished: RuntimeError: CUDA out of memory" in missing
    assert "`relative` seed 1: not run" in missing and "`relative` seed 2: not run" in missing
    assert f"`sincos` seed 0: running now (pid {os.getpid()} on {platform.node()}, started T0)" in missing
    assert "`sincos` seed 1: failed or unfinished: KeyboardInterrupt" in missing
    assert "`sincos` seed 2: not run" in missing
    assert "seed 8" not in missing and "`learned`" not in missing
    # the header says how it was made and what the paper column is
    assert "Made by: `repro sweep " in md and "profile `smoke`" in md
    assert "ImageNet 5-shot; not directly comparable" in md and "A clear gap between none and any embedding." in md
    assert "fractions in the paper, shown as percent" in md
    assert "git abcdef1234" in md and "`digits` (train 1294, val 144, test 359" in md
    # the claim numbers: baseline none 80.50, best other relative 96.00: +15.50 points
    assert "none: 80.50 ± 0.71; best other, relative: 96.00 ± 1.41: gap +15.50 points" in md
    assert "spread among the 2 other variants (best - worst mean): 4.00 points" in md
    # each variant marked against the baseline, from its numbers: learned 92 +- 2 (n 3) vs none
    # 80.5 +- 0.71 (n 2): +11.5, s.e. sqrt(4/3 + 0.5/2) = 1.26, more than 2 s.e.
    assert "learned > none? holds: +11.50 points (± 1.26 s.e.)" in md
    assert "relative > none? holds: +15.50 points" in md
    assert (root / exp / "position.png").read_bytes()[:8] == PNG
    assert not [p for p in (root / exp).iterdir() if p.name.endswith(".tmp")]
    out = capsys.readouterr().out
    assert re.search(r"learned\s+92\.00 ± 2\.00\s+3\s+64\.21", out)  # the table on stdout too
    assert "missing or failed runs (6)" in out


def patch_sweep_with_runs(tmp_path, root):
    """A patch-size sweep (4 -> 2, 4x the FLOPs) and its 3 finished seeds per variant under ``root``."""
    patch = write_report_sweep(
        tmp_path / "patch.yaml", axis="patch_size",
        aliases={"patch_size": "model.net.init_args.patch_size"}, product={"patch_size": [4, 2]},
        report={"plot": "accuracy_vs_flops", "check": "halving", "param": "patch_size"},
    )  # fmt: skip
    for seed in range(3):
        put(root, "patch-smoke", "patch_size=4", seed, acc=0.80 + 0.01 * seed, flops=1e6, train_flops=1e12)
        put(root, "patch-smoke", "patch_size=2", seed, acc=0.85 + 0.01 * seed, flops=4e6, train_flops=4e12)
    return patch


def test_report_figures_and_claim_checks_per_plot_kind(tmp_path):
    root = tmp_path / "runs"
    # patch size: accuracy against compute; 4 -> 2 is 4x the FLOPs
    patch = patch_sweep_with_runs(tmp_path, root)
    report = write_report(make_plan(patch, "smoke", root=root), out=io.StringIO())
    assert "patch_size 4 -> 2 (side x0.50): GFLOPs/image x4.00, accuracy 81.00 ± 1.00 -> 86.00 ± 1.00: +5.00 points (± 0.82 s.e.); patch_size 2 > patch_size 4? holds" in report.markdown
    assert report.figures[0].name == "patch_size.png" and report.figures[0].read_bytes()[:8] == PNG

    # pooling: grouped by learning rate
    pool = write_report_sweep(
        tmp_path / "pool.yaml", axis="pooling",
        aliases={"pool": "model.net.init_args.pool", "lr": "model.init_args.lr"},
        product={"pool": ["cls", "gap"], "lr": [1.0e-3, 3.0e-3]},
        report={"plot": "grouped_bars", "x": "lr", "hue": "pool", "check": "best_per_group"},
    )  # fmt: skip
    accs = {"pool=cls,lr=0.001": 0.90, "pool=cls,lr=0.003": 0.85, "pool=gap,lr=0.001": 0.70, "pool=gap,lr=0.003": 0.89}
    for name, acc in accs.items():
        for seed in range(3):
            put(root, "pool-smoke", name, seed, acc=acc)
    report = write_report(make_plan(pool, "smoke", root=root), out=io.StringIO())
    md = report.markdown
    assert "pool=cls: best lr=0.001 with 90.00" in md and "pool=gap: best lr=0.003 with 89.00" in md
    assert "at each one's best lr: pool=gap - pool=cls: -1.00 points" in md
    assert "at the shared lr=0.001: pool=gap - pool=cls: -20.00 points" in md
    # the seeds are identical here (std 0): any gap is more than 2 standard errors
    assert "pool=gap > pool=cls? does not hold" in md
    assert (root / "pool-smoke" / "pooling.png").read_bytes()[:8] == PNG

    # attention: accuracy and speed
    att = write_report_sweep(
        tmp_path / "att.yaml", axis="attention", variants=[{"name": "dot"}, {"name": "additive"}],
        report={"plot": "bars", "speed": True, "check": "speed", "baseline": "dot"},
    )  # fmt: skip
    for seed in range(2):
        put(root, "att-smoke", "dot", seed, acc=0.9, speed=300.0)
        put(root, "att-smoke", "additive", seed, acc=0.9, speed=100.0)
    report = write_report(make_plan(att, "smoke", root=root), out=io.StringIO())
    assert "additive vs dot: accuracy +0.00 points" in report.markdown
    assert "(additive > dot? does not hold)" in report.markdown  # equal means, zero spread: no gap
    assert "dot trains x3.00 as many images/s (300 ± 0 vs 100 ± 0)" in report.markdown
    assert (root / "att-smoke" / "attention.png").read_bytes()[:8] == PNG


def test_lines_plot_and_gaps_check_over_model_families(tmp_path):
    """The data-size report: one line per model family against training-set size, a few-shot
    panel, and the gap of each claimed pair at each size with its trend."""
    root = tmp_path / "runs"
    sweep = write_report_sweep(
        tmp_path / "size.yaml", axis="train_samples",
        aliases={"n": "data.init_args.train_samples"},
        variants=[{"name": "ViT", "axes": {"model": "ViT"}}, {"name": "ResNet", "axes": {"model": "ResNet"}}],
        product={"n": [1000, 10000]},
        columns=[{"key": "test/fewshot_5", "label": "5-shot (%)", "scale": 100}],
        report={"plot": "lines", "x": "n", "hue": "model", "panels": ["test/fewshot_5"],
                "check": "gaps", "along": "n", "pairs": [["ResNet", "ViT"]]},
    )  # fmt: skip
    accs = {"ViT,n=1000": (0.60, 0.30), "ResNet,n=1000": (0.70, 0.50), "ViT,n=10000": (0.85, 0.60), "ResNet,n=10000": (0.86, 0.62)}
    for name, (acc, few) in accs.items():
        for seed in range(2):
            r = result(name, seed, acc + 0.01 * seed, flops=2e6 if name.startswith("ResNet") else 1e6)
            r["test"]["test/fewshot_5"] = few
            atomic_write_json(root / "size-smoke" / name / f"seed{seed}" / RESULTS_FILE, r)
    report = write_report(make_plan(sweep, "smoke", root=root), out=io.StringIO())
    md = report.markdown
    assert "test acc. (%), n=1000: ResNet - ViT = +10.00 points (± 0.71 s.e.) (70.50 ± 0.71 vs 60.50 ± 0.71; FLOPs/image x2.00)" in md
    assert "-> test acc. (%): ResNet - ViT shrinks from +10.00 at n=1000 to +1.00 at n=10000" in md
    assert "-> 5-shot (%): ResNet - ViT shrinks from +20.00 at n=1000 to +2.00 at n=10000" in md
    assert report.figures[0].name == "train_samples.png" and report.figures[0].read_bytes()[:8] == PNG

    bad = write_report_sweep(tmp_path / "bad.yaml", axis="train_samples", variants=[{"name": "ViT", "axes": {"model": "ViT"}}],
                      report={"plot": "lines", "x": "n", "hue": "model", "check": "gaps", "along": "n",
                              "pairs": [["CNN", "ViT"]]})  # fmt: skip
    with pytest.raises(SweepError, match=r"report.pairs, a list of \[a, b\] values of 'model': \['ViT'\]"):
        write_report(make_plan(bad, "smoke", root=root), out=io.StringIO())


def test_curves_plot_and_time_to_target_from_each_runs_metrics_csv(tmp_path):
    """Time to accuracy: the validation accuracy against wall time of every run (its metrics.csv),
    when each first reached the target, and whether its test accuracy reached it in the budget."""
    root = tmp_path / "runs"
    sweep = write_report_sweep(
        tmp_path / "tta.yaml", axis="recipe", variants=[{"name": "fast"}, {"name": "slow"}],
        report={"plot": "curves", "check": "time_to_target", "target": 0.92, "budget_s": 900},
    )  # fmt: skip
    rows = {"fast": [(100, 0.85), (400, 0.921), (800, 0.93)], "slow": [(300, 0.80), (900, 0.90), (1200, 0.915)]}
    for name, curve in rows.items():
        r = result(name, 0, curve[-1][1] - 0.001, fit_time=curve[-1][0] + 5)
        run_dir = root / "tta-smoke" / name / "seed0"
        atomic_write_json(run_dir / RESULTS_FILE, r)
        lines = ["epoch,step,time/fit_elapsed_s,train/loss,val/acc"] + [f"0,{i},,1.0," for i in range(2)]
        lines += [f"{i},{i * 10},{t},,{a}" for i, (t, a) in enumerate(curve)]
        (run_dir / "metrics.csv").write_text("\n".join(lines) + "\n")
    report = write_report(make_plan(sweep, "smoke", root=root, seeds=1), out=io.StringIO())
    md = report.markdown
    assert "fast seed0: val/acc >= 0.92 first at time/fit_elapsed_s = 400; test/acc 92.90: target reached after 13 min 25 s of fit (within the 900 s budget)" in md
    assert "slow seed0: val/acc >= 0.92 first at time/fit_elapsed_s = never; test/acc 91.40: target not reached after 20 min 05 s of fit (over the 900 s budget)" in md
    assert report.figures[0].read_bytes()[:8] == PNG


def test_report_without_any_run_says_how_to_make_them(tmp_path, capsys):
    sweep = position_sweep(tmp_path)
    assert report_main([str(sweep), "--profile", "smoke", "--root", str(tmp_path / "runs")]) == 1
    err = capsys.readouterr().err
    assert "no runs under" in err and "run first: repro sweep " in err


def test_report_of_a_real_sweep_file_names_its_paper_columns(tmp_path):
    root = tmp_path / "runs"
    for seed in range(3):
        put(root, "vit/position-cpu", "none-stem", seed, acc=0.9)
    report = write_report(make_plan("vit/position", "cpu", root=root), out=io.StringIO())
    row = next(r for r in report.rows if r[0] == "none-stem")
    assert row[3:5] == ["61.38", "79.63"]  # Table 8 (fraction -> percent) and the README column
    assert "Not directly comparable" in report.markdown
    assert len(report.missing) == 11 * 3  # every other variant x seed, listed




def wandb_records(path: Path) -> list:
    """The records of an offline run's ``.wandb`` file: a LevelDB-style log (a 7-byte header, then
    32 KiB blocks of chunks: crc32 (4 bytes), length (2), type (1: full, 2: first, 3: middle,
    4: last), data) whose chunks join into serialized ``Record`` protos."""
    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32 * 1024
    assert data[:4] == b":W&B"
    pos, pending, records = 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


@pytest.mark.slow
def test_wandb_report_logs_the_table_and_the_figure_offline_in_the_sweeps_group(tmp_path, monkeypatch):
    """``report --wandb`` offline: one ``report`` run in the experiment's group whose history holds
    the figure (the PNG), read back from the run's files, and whose table (its rows are the
    report's) waits beside it for repro sync."""
    from reproductions.run.artifacts import read_pending, read_table
    from tests.helpers import history_values

    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
    sweep = position_sweep(tmp_path)
    root = tmp_path / "runs"
    for seed in range(2):
        put(root, "pos-smoke", "learned", seed, acc=0.9)
    assert report_main([str(sweep), "--profile", "smoke", "--root", str(root), "--wandb"]) == 0
    wandb.teardown()  # the W&B service writes the .wandb file on its own: wait until it has
    [run_dir] = list((root / "pos-smoke" / "wandb").glob("offline-run-*"))
    records = wandb_records(next(run_dir.glob("run-*.wandb")))
    [run] = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run.run_group, run.job_type, run.display_name) == ("pos-smoke", "report", "pos-smoke/report")
    assert list(run.tags) == ["position", "smoke", "pos"]
    logged = history_values(records)
    assert logged["report/position"]["_type"] == "image-file" and "report/table" not in logged
    files = run_dir / "files"
    # offline, the table waits as a file for repro sync (W&B would stage it by absolute path)
    [pending] = read_pending(root / "pos-smoke")
    path = next(f["path"] for f in pending["files"] if f["name"] == "report/table")
    logged_table = read_table(root / "pos-smoke" / path)
    md = (root / "pos-smoke" / REPORT_FILE).read_text()
    plan = make_plan(sweep, "smoke", root=root)
    header, rows = table(plan, collect(plan))
    assert logged_table == {"columns": header, "data": rows}
    assert "| learned | 90.00 ± 0.00 | 2 |" in md and ["learned", "90.00 ± 0.00", "2"] == logged_table["data"][1][:3]
    image = files / logged["report/position"]["path"]
    assert image.read_bytes()[:8] == PNG and logged["report/position"]["format"] == "png"
    assert (files / REPORT_FILE).read_text() == md  # report.md saved with the run


def test_two_profiles_side_by_side_with_each_profiles_claim_marks(tmp_path, capsys):
    """``report SWEEP --profile a --profile b``: one table, a column per profile beside the
    paper's, the claim check of each profile marked from its own numbers; nothing of the
    profiles' own reports is touched."""
    sweep = write_report_sweep(
        tmp_path / "pos.yaml", aliases={"pos_embed": "model.net.init_args.pos_embed"},
        variants=[
            {"name": "none", "overrides": {"pos_embed": "none"}, "paper": {"t8": 0.61382}},
            {"name": "learned", "overrides": {"pos_embed": "learned_1d"}, "paper": {"t8": 0.64206}},
            {"name": "relative", "overrides": {"pos_embed": "relative"}, "paper": {"t8": 0.64032}},
        ],
        references={"t8": {"label": "Table 8 (%)", "scale": "fraction"}},
        claims=["A clear gap between none and any embedding."],
        report={"plot": "bars", "check": "baseline", "baseline": "none"},
        profiles={"small": {"seeds": 3}, "large": {"seeds": 3}},
    )  # fmt: skip
    root = tmp_path / "runs"
    accs = {
        "small": {"none": [0.76, 0.77, 0.78], "learned": [0.95, 0.96, 0.97], "relative": [0.90, 0.91, 0.92]},
        "large": {"none": [0.84, 0.85, 0.86], "learned": [0.87, 0.88, 0.89], "relative": [0.84, 0.86, 0.88]},
    }
    for profile, by_variant in accs.items():
        for variant, values in by_variant.items():
            for seed, acc in enumerate(values):
                put(root, f"pos-{profile}", variant, seed, acc=acc, fit_time=10.0 * (1 + (profile == "large")))
    argv = [str(sweep), "--profile", "small", "--profile", "large", "--root", str(root)]
    assert report_main(argv) == 0
    md = (root / "pos-small+large" / REPORT_FILE).read_text()
    rows = {line.split(" | ")[0].strip("| "): line for line in md.splitlines() if line.startswith("| ")}
    assert rows["variant"].startswith("| variant | small: test acc. (%) | n | small: time/run | large: test acc. (%) | n | large: time/run | Table 8 (%) |")
    assert rows["learned"] == "| learned | 96.00 ± 1.00 | 3 | 10.0 s | 88.00 ± 1.00 | 3 | 20.0 s | 64.21 |"
    assert rows["relative"] == "| relative | 91.00 ± 1.00 | 3 | 10.0 s | 86.00 ± 2.00 | 3 | 20.0 s | 64.03 |"
    small, large = md.split("### `small`")[1].split("### `large`")
    # small: relative 91 +- 1 vs none 77 +- 1: +14, s.e. 0.82 -> holds; large: 86 +- 2 vs 85 +- 1: +1, s.e. 1.29 -> within noise
    assert "relative > none? holds: +14.00 points (± 0.82 s.e.)" in small
    assert "relative > none? within noise (under 2 s.e.): +1.00 points (± 1.29 s.e.)" in large
    assert "learned > none? holds: +3.00 points (± 0.82 s.e.)" in large
    assert "None: every planned run finished." in md
    assert not (root / "pos-small" / REPORT_FILE).exists()
    assert "[large] none: 85.00 ± 1.00" in capsys.readouterr().out
    # one profile missing entirely is still a comparison; none at all is an error; one sweep only
    assert report_main([str(sweep), "--profile", "small", "--profile", "other", "--root", str(root)]) == 2
    assert report_main([str(sweep), "--profile", "small", "--profile", "large", "--root", str(tmp_path / "empty")]) == 1
    assert "run the sweeps first" in capsys.readouterr().err


@pytest.mark.subprocess
@pytest.mark.slow
def test_a_foreign_results_json_is_flagged_and_left_out_of_the_table_means_and_ratios(tmp_path):
    """A BST run's results.json copied into a ViT sweep's tree: the report (real command line)
    names its directory and why in a warning line and under the missing runs, and the table, the
    means and the compute ratio are those of the sweep's own runs; the exit status stays 0."""
    root = tmp_path / "runs"
    patch = patch_sweep_with_runs(tmp_path, root)
    foreign = root / "patch-smoke" / "patch_size=4" / "seed3"
    atomic_write_json(foreign / RESULTS_FILE, bst_result())
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
    cmd = [sys.executable, "-m", "reproductions", "report", str(patch), "--profile", "smoke", "--root", str(root)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    warnings = [line for line in proc.stdout.splitlines() if line.startswith("warning: ")]
    assert warnings == [
        f"warning: {foreign}: results.json does not belong to this sweep's run (its experiment is 'bst/position-smoke', "
        "not 'patch-smoke'; its variant is 'position=index', not 'patch_size=4'; its seed is 0, not 3; it has no "
        "test/acc (the sweep's metric)): left out of the table, the means and the ratios; move it to its own run "
        "directory or delete it"
    ]
    md = (root / "patch-smoke" / REPORT_FILE).read_text()
    rows = {line.split(" | ")[0].strip("| "): line for line in md.splitlines() if line.startswith("| ")}
    assert rows["patch_size=4"] == "| patch_size=4 | 81.00 ± 1.00 | 3 | 136k | 0.001 | 1 TFLOP | 150 ± 0 | 30.0 s |"
    assert "GFLOPs/image x4.00, accuracy 81.00 ± 1.00 -> 86.00 ± 1.00" in md  # the ratio of the ViT runs only
    assert "6 finished runs over 2 variants" in md
    missing = md[md.index("## Missing or failed runs"):]
    assert "- `patch_size=4` seed 3: results.json does not belong to this sweep's run (its experiment is" in missing
    assert f"(`{foreign}`)" in missing

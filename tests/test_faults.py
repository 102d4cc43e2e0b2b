"""Faults, through the real command line (``python -m reproductions`` in a subprocess, tiny configs;
the config errors found before any data is loaded through the same entry point in this process).

Each test checks the exit status, the last line printed and what is left on disk:

- a user error ends in one line ``error: ...`` naming the value, exit status 2, no traceback,
  before any data is loaded (and, for DDP, before any process is started);
- a NaN loss fails the run (exit 1, results.json ``failed`` with the step, strict JSON);
- ``limit_val_batches 1`` is one batch;
- a finished run is never overwritten by accident, and a bad ``--ckpt_path`` leaves it byte-identical;
- a run directory is locked; a stale lock is taken over;
- SIGTERM / SIGUSR1 save a checkpoint and print the command that resumes; resuming keeps the
  metrics rows and the clock's totals; under SLURM the trainer requeues itself (by construction);
- a checkpoint write on a full disk fails cleanly (no partial file, the previous one intact);
- files are 0644; checkpoints load weights-only and a malicious pickle is refused.

Set ``REPRO_FAULTS_LOG=<file>`` to append each case's (exit status, seconds, last line) as JSON lines.
"""

from __future__ import annotations

import csv
import json
import os
import resource
import shlex
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# Imported here, at collection: Lightning's log handlers bind to the stderr of the moment they are
# made, and one made inside a test's capture would write to a closed stream in the next test.
import reproductions.run.cli  # noqa: F401
from tests.cli_helpers import (  # noqa: F401 - finished: the module fixture
    DIGITS, NET, REPO, RUN, TINY, copy_run, csv_rows, finish, finished, no_traceback, repro, repro_here,
    start, tree, usage_error, wait_for,
)

BST = "reproductions/bst/configs/bst.yaml"
RESNET = "reproductions/vit/configs/resnet_fashion_mnist.yaml"


class Evil:
    """A pickle that runs ``touch <marker>`` when loaded without weights_only."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


# --------------------------------------------------------------------------- 1. one line per user error


@pytest.mark.parametrize(
    "case, args, needles",
    [
        ("patch_size 3 on 8 px", [DIGITS, f"{NET}patch_size", "3"],
         ["patch_size=3 does not divide img_size=8", "[1, 2, 4, 8]"]),
        ("3 heads for width 100", [DIGITS, f"{NET}embed_dim", "100", f"{NET}num_heads", "3"],
         ["num_heads=3 does not divide embed_dim=100"]),
        ("pos_embed learned_3d", [DIGITS, f"{NET}pos_embed", "learned_3d"], ["learned_3d", "learned_1d"]),
        ("pool max2", [DIGITS, f"{NET}pool", "max2"], ["max2", "cls", "gap"]),
        ("source mnist2", [DIGITS, "--data.init_args.source", "mnist2"], ["mnist2", "digits"]),
        ("batch_size 0", [DIGITS, "--data.init_args.batch_size", "0"], ["batch_size=0", "positive"]),
        ("batch_size -4", [DIGITS, "--data.init_args.batch_size", "-4"], ["batch_size=-4", "positive"]),
        ("BST seq_len 0", [BST, f"{NET}seq_len", "0"], ["seq_len=0"]),
        ("BST heads 7 for width 64", [BST, f"{NET}num_heads", "7"], ["num_heads=7 does not divide", "64"]),
        ("unknown key", [DIGITS, "--trainer.max_epochz", "3"], ["--trainer.max_epochz", "--trainer.max_epochs"]),
        ("misspelt net key", [DIGITS, "--model.net.init_args.patchsize", "4"],
         ["--model.net.init_args.patchsize is not an argument of models.vit.ViT", "did you mean patch_size?"]),
        ("misspelt data key", [DIGITS, "--data.batchsize", "64"],
         ["--data.init_args.batchsize is not an argument of datamodules.images.ImageDataModule",
          "did you mean batch_size?"]),
        ("not an int", [DIGITS, "--trainer.max_epochs", "three"], ["--trainer.max_epochs=three", "integer"]),
        ("not a choice", [DIGITS, "--run.test_ckpt", "middle"], ["middle", "'final', 'best'"]),
        ("missing --config file", ["no/such/experiment.yaml"], ["no/such/experiment.yaml", "no such file"]),
        ("missing --ckpt_path file", [DIGITS, "--ckpt_path", "no/such/last.ckpt"], ["no/such/last.ckpt", "no such file"]),
        ("--ckpt_path last, no checkpoint", [DIGITS, "--ckpt_path", "last"], ["--ckpt_path last: no last checkpoint"]),
    ],
)
def test_usage_errors_end_in_one_line_before_any_data_is_loaded(case, args, needles, tmp_path, capfd, monkeypatch):
    cache = tmp_path / "behavior-cache"
    result = repro_here("fit", "--config", *args, "--run.root", str(tmp_path / "runs"), *TINY[:4], case=case,
                        capfd=capfd, monkeypatch=monkeypatch, BEHAVIOR_CACHE_DIR=str(cache),
                        HF_DATASETS_CACHE=str(tmp_path / "hf"))
    usage_error(result, *needles)
    assert not (tmp_path / "runs").exists()  # nothing written
    assert not cache.exists() and not (tmp_path / "hf").exists()  # no data loaded (BST: nothing generated)


@pytest.mark.parametrize("case, text, needles", [
    ("tab in the indentation", "trainer:\n\tmax_epochs: 1\n",
     ["line 2, column 1: a tab character", "YAML indents with spaces", "replace the tab with spaces"]),
    ("unclosed bracket", "trainer:\n  max_epochs: 1\ndata:\n  init_args:\n    crop: [1, 2\n",
     ["line 6, column 1: expected ',' or ']', but got the end of the file", "flow sequence that starts at line 5"]),
])
def test_a_yaml_syntax_error_names_the_file_line_and_column(case, text, needles, tmp_path, capfd, monkeypatch):
    """Two --config files, the second not YAML: the line names that file (not the first), the line and column."""
    bad = tmp_path / "overlay.yaml"
    bad.write_text(text)
    result = repro_here("fit", "--config", DIGITS, "--config", str(bad), "--run.root", str(tmp_path / "runs"),
                        case=f"YAML: {case}", capfd=capfd, monkeypatch=monkeypatch)
    usage_error(result, f"--config {bad}, ", *needles)
    assert DIGITS not in result.last and not (tmp_path / "runs").exists()


def test_text_file_as_checkpoint_and_run_root_under_a_file(tmp_path, capfd, monkeypatch):
    text = tmp_path / "notes.txt"
    for first in ("hello", "a b", "total", "shape"):  # a pickle reader fails on these in different ways
        text.write_text(f"{first}, not a checkpoint\n" * 10)
        result = repro_here("fit", "--config", DIGITS, "--run.root", str(tmp_path / "runs"), "--ckpt_path", str(text),
                            case="text file as --ckpt_path", capfd=capfd, monkeypatch=monkeypatch)
        usage_error(result, "--ckpt_path", "notes.txt", "not a checkpoint")
    text.write_text("hello, not a checkpoint\n" * 10)
    result = repro_here("fit", "--config", DIGITS, "--run.root", str(text / "runs"), case="run root under a file",
                        capfd=capfd, monkeypatch=monkeypatch)
    usage_error(result, "notes.txt", "is a file, not a directory")
    assert text.read_text().startswith("hello")


@pytest.mark.distributed
@pytest.mark.subprocess
def test_ddp_batch_that_does_not_divide_fails_before_any_process_starts(tmp_path):
    root = tmp_path / "ddp-runs"
    result = repro("fit", "--config", DIGITS, "--run.root", str(root), *TINY, "--data.batch_size", "3",
                   "--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp",
                   case="DDP batch 3 over 2 processes")
    usage_error(result, "data.batch_size=3", "2 processes", "multiple of 2")
    assert "Initializing distributed" not in result.output and "GLOBAL_RANK" not in result.output
    assert not root.exists()
    alive = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(root).encode() in cmdline.read_bytes():
                alive.append(cmdline.parent.name)
        except OSError:
            continue
    assert alive == []


@pytest.mark.subprocess
def test_debug_shows_the_traceback_and_still_ends_in_one_line(tmp_path):
    result = repro("fit", "--debug", "--config", DIGITS, "--run.root", str(tmp_path), f"{NET}patch_size", "3",
                   case="--debug")
    assert result.returncode == 2 and "Traceback" in result.output
    assert result.last.startswith("error: patch_size=3 does not divide img_size=8")


@pytest.mark.subprocess
def test_tool_argument_errors_end_in_one_line():
    result = repro("sweep", "vit/position", "--profile", "smoke", "--jobs", "two", case="sweep --jobs two")
    assert result.returncode == 2 and result.last.startswith("error: argument --jobs: invalid int value: 'two'")
    no_traceback(result)


# --------------------------------------------------------------------------- 2. non-finite loss


@pytest.mark.subprocess
def test_nan_loss_stops_the_run_as_failed(tmp_path):
    result = repro("fit", "--config", DIGITS, "--run.root", str(tmp_path), *TINY, "--trainer.max_epochs", "3",
                   "--model.init_args.lr", "1e6", case="lr 1e6 (NaN loss)")
    assert result.returncode == 1, result.output[-3000:]
    assert result.last.startswith("error: the training loss is nan at step ")
    no_traceback(result)
    text = (tmp_path / RUN / "results.json").read_text()
    res = json.loads(text)  # strict JSON: json.loads would accept NaN, so check the text too
    assert "NaN" not in text and "Infinity" not in text
    assert res["status"] == "failed" and res["error"] in result.last and res["step"] >= 1
    assert f"at step {res['step']} " in result.last
    assert res["training"]["steps"] < 9  # stopped at once, not after 3 epochs
    assert not (tmp_path / RUN / "run.lock").exists()


def test_nonfinite_patience_counts_steps_in_a_row():
    from types import SimpleNamespace

    from lightning_modules.callbacks import NonFiniteLossError, StopOnNonFiniteLoss

    guard = StopOnNonFiniteLoss(patience=2)
    trainer = SimpleNamespace(world_size=1, global_step=0, current_epoch=0)
    for step, loss in enumerate([1.0, float("nan"), float("inf"), 0.5, float("nan"), float("nan")], 1):
        trainer.global_step = step
        guard.on_train_batch_end(trainer, None, {"loss": torch.tensor(loss)}, None, step)  # tolerated
    trainer.global_step = 7
    with pytest.raises(NonFiniteLossError, match=r"the training loss is nan at step 7 \(epoch 0, 3 steps in a row\)"):
        guard.on_train_batch_end(trainer, None, torch.tensor(float("nan")), None, 7)


# --------------------------------------------------------------------------- 3. integer batch limits


@pytest.mark.subprocess
def test_integer_limit_val_batches_is_a_count(tmp_path):
    out = tmp_path / "counts.json"
    result = repro("fit", "--config", DIGITS, "--run.root", str(tmp_path), *TINY, "--trainer.max_epochs", "1",
                   "--trainer.limit_val_batches", "1", "--run.test_after_fit", "false",
                   "--trainer.callbacks+=tests.helpers.CountBatches", f"--trainer.callbacks.out={out}",
                   case="limit_val_batches 1")
    assert result.returncode == 0, result.output[-3000:]
    counts = json.loads(out.read_text())
    assert counts == {"train": 3, "val": 1, "limit_val_batches": "1"}


# --------------------------------------------------------------------------- 4. nothing of a finished run is lost


@pytest.mark.subprocess
@pytest.mark.xdist_group("faults-finished")  # shares a module fixture: one test process
def test_finished_run_is_not_overwritten_unless_asked(finished, tmp_path):
    root, run = copy_run(finished, tmp_path)
    before = tree(root)
    result = repro("fit", "--config", DIGITS, "--run.root", str(root), *TINY, "--trainer.max_epochs", "2",
                   case="fit into a finished run")
    usage_error(result, "holds a finished run", "--run.overwrite true")
    assert tree(root) == before
    result = repro("fit", "--config", DIGITS, "--run.root", str(root), *TINY, "--trainer.max_epochs", "1",
                   "--run.overwrite", "true", case="--run.overwrite true")
    assert result.returncode == 0, result.output[-3000:]
    res = json.loads((run / "results.json").read_text())
    assert res["status"] == "finished" and res["training"]["epochs"] == 1
    assert len(list((run / "checkpoints").glob("best-*.ckpt"))) == 1  # the old best was removed
    assert not (run / "run.lock").exists()


@pytest.mark.subprocess
@pytest.mark.xdist_group("faults-finished")  # shares a module fixture: one test process
@pytest.mark.parametrize("kind", ["missing", "text", "malicious"])
def test_bad_ckpt_path_leaves_the_finished_run_byte_identical(kind, finished, tmp_path):
    root, run = copy_run(finished, tmp_path)
    marker = tmp_path / "pwned"
    if kind == "missing":
        ckpt = run / "checkpoints" / "lats.ckpt"  # a typo
    elif kind == "text":
        ckpt = tmp_path / "last.ckpt"
        ckpt.write_text("not a checkpoint\n")
    else:
        ckpt = tmp_path / "evil.ckpt"
        torch.save({"state_dict": {}, "payload": Evil(str(marker))}, ckpt)
    before = tree(root)
    result = repro("fit", "--config", DIGITS, "--run.root", str(root), *TINY, "--ckpt_path", str(ckpt),
                   case=f"--ckpt_path {kind} into a finished run")
    usage_error(result, "--ckpt_path", str(ckpt))
    if kind == "malicious":
        assert "was refused" in result.last and "system" in result.last
    elif kind == "text":
        assert "is not a checkpoint" in result.last
    assert tree(root) == before
    assert not marker.exists()


@pytest.mark.subprocess
@pytest.mark.xdist_group("faults-finished")  # shares a module fixture: one test process
def test_resume_with_max_epochs_below_the_checkpoints_is_refused_and_the_run_kept(finished, tmp_path, capfd,
                                                                                  monkeypatch):
    """An interrupted run resumed with --trainer.max_epochs below the epochs its checkpoint has trained: one line
    naming both numbers before any work, and the run's record (results.json: interrupted) left as it was."""
    root, run = copy_run(finished, tmp_path)
    results = json.loads((run / "results.json").read_text())
    (run / "results.json").write_text(json.dumps({**results, "status": "interrupted"}))
    before = tree(root)
    ckpt = run / "checkpoints" / "last.ckpt"
    result = repro_here("fit", "--config", DIGITS, "--run.root", str(root), *TINY, "--trainer.max_epochs", "1",
                        "--ckpt_path", str(ckpt), case="resume below the checkpoint's epochs", capfd=capfd,
                        monkeypatch=monkeypatch)
    usage_error(result, "--trainer.max_epochs 1 is below the 2 epochs", str(ckpt), "--trainer.max_epochs 2 or more")
    assert tree(root) == before


# --------------------------------------------------------------------------- 8. file modes, weights-only loading


@pytest.mark.subprocess
@pytest.mark.xdist_group("faults-finished")  # shares a module fixture: one test process
def test_files_are_0644_and_checkpoints_load_weights_only(finished, tmp_path):
    run = finished / RUN
    files = [run / "results.json", run / "config.yaml", run / "metrics.csv", *(run / "checkpoints").glob("*.ckpt")]
    assert len(files) >= 5
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path
    # a checkpoint trained here loads weights-only, with nothing more allowed than torch's defaults
    assert torch.serialization.get_unsafe_globals_in_checkpoint(run / "checkpoints" / "last.ckpt") == []
    result = repro("analyze", "posemb", "--ckpt", str(run / "checkpoints" / "last.ckpt"), "--out",
                   str(tmp_path / "posemb"), case="analyze posemb on a trained checkpoint")
    assert result.returncode == 0, result.output[-3000:]
    assert (tmp_path / "posemb" / "position_similarity.json").is_file()
    marker = tmp_path / "pwned"
    torch.save({"state_dict": {}, "payload": Evil(str(marker))}, tmp_path / "evil.ckpt")
    result = repro("analyze", "distance", "--ckpt", str(tmp_path / "evil.ckpt"), case="analyze a malicious pickle")
    usage_error(result, "evil.ckpt", "was refused", "system")
    assert not marker.exists()


@pytest.mark.subprocess
@pytest.mark.slow
def test_analyze_refuses_a_resnet_checkpoint_naming_its_net(tmp_path, capfd, monkeypatch):
    result = repro("fit", "--config", RESNET, "--run.root", str(tmp_path), "--data.source", "digits",
                   "--data.batch_size", "32", "--data.augment", "none", f"{NET}img_size", "8",
                   f"{NET}layers", "[1]", f"{NET}channels", "[8]", f"{NET}stem_chs", "8",
                   "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches",
                   "1", "--run.test_after_fit", "false", "--trainer.enable_progress_bar", "false",
                   case="ResNet fit (fixture)")
    assert result.returncode == 0, result.output[-3000:]
    (ckpt,) = tmp_path.rglob("last.ckpt")
    for analysis in ("distance", "rollout", "posemb"):  # refused on reading the checkpoint: in this process
        result = repro_here("analyze", analysis, "--ckpt", str(ckpt), case=f"analyze {analysis} on a ResNet",
                            capfd=capfd, monkeypatch=monkeypatch)
        usage_error(result, "ResNet", "models.resnet.ResNet", f"{analysis} needs a ViT or hybrid")


# --------------------------------------------------------------------------- 4. locks, 6. signals, 5. resume


def slow(signal_file: Path) -> list[str]:
    """Slow training steps; writing a signal's name into ``signal_file`` makes the run send it to
    itself mid-epoch (``tests.helpers.SlowSteps``), so the signal never lands in validation."""
    return ["--trainer.callbacks+=tests.helpers.SlowSteps", "--trainer.callbacks.seconds", "0.25",
            f"--trainer.callbacks.signal_file={signal_file}",
            "--trainer.limit_train_batches", "4", "--trainer.log_every_n_steps", "1"]


def ask_for(signal_file: Path, name: str) -> None:
    """Ask the run to send itself ``name`` (written whole, then renamed: the run never reads half)."""
    tmp = signal_file.with_suffix(".tmp")
    tmp.write_text(name)
    os.replace(tmp, signal_file)


@pytest.mark.subprocess
@pytest.mark.slow
def test_second_run_into_a_busy_directory_refuses_at_once_and_sigusr1_stops_the_first(tmp_path):
    root = tmp_path / "runs"
    ask = tmp_path / "signal"
    args = ["fit", "--config", DIGITS, "--run.root", str(root), *TINY, *slow(ask), "--trainer.max_epochs", "100"]
    first, t0 = start(*args, log=tmp_path / "first.log")
    try:
        wait_for(root / RUN / "checkpoints" / "last.ckpt", first)
        wait_for(root / RUN / "metrics.csv", first)
        second = repro(*args, case="second identical fit while the first runs")
        assert second.returncode == 1, second.output[-3000:]
        assert second.last.startswith(f"error: run directory {root / RUN} is in use by another run (pid {first.pid} on ")
        no_traceback(second)
        assert first.poll() is None  # the first is still training
        rows = csv_rows(root / RUN / "metrics.csv")
        assert rows and rows[0]["train/loss_step"]  # its metrics are there, not reset by the second
        ask_for(ask, "SIGUSR1")
        result = finish(first, tmp_path / "first.log", t0, "SIGUSR1 to a training run")
    finally:
        if first.poll() is None:
            first.kill()
    assert result.returncode == 128 + signal.SIGUSR1, result.output[-3000:]
    assert result.last.startswith("error: stopped by SIGUSR1 at step ") and "--ckpt_path" in result.last
    after = csv_rows(root / RUN / "metrics.csv")
    assert after[: len(rows)] == rows  # intact
    res = json.loads((root / RUN / "results.json").read_text())
    assert res["status"] == "interrupted" and res["checkpoint"].endswith("last.ckpt")
    assert not (root / RUN / "run.lock").exists()


@pytest.mark.subprocess
def test_stale_lock_of_a_dead_process_is_taken_over(tmp_path):
    import platform

    run = tmp_path / RUN
    run.mkdir(parents=True)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    (run / "run.lock").write_text(json.dumps({"pid": pid, "host": platform.node(), "started": "2026-01-01T00:00:00",
                                              "command": "python -m reproductions fit ...", "proc_start": 1}))
    # the killed attempt also left its best checkpoint: a fresh attempt must not keep it beside its own
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "best-epoch007.ckpt").write_bytes(b"old attempt")
    result = repro("fit", "--config", DIGITS, "--run.root", str(tmp_path), *TINY, "--trainer.max_epochs", "1",
                   case="stale lock of a dead process")
    assert result.returncode == 0, result.output[-3000:]
    took = [line for line in result.lines if "took over the stale lock" in line]
    assert len(took) == 1 and f"pid {pid} on {platform.node()}" in took[0]
    assert any("removed 1 checkpoint file(s) of an earlier attempt (best-epoch007.ckpt)" in line for line in result.lines)
    assert json.loads((run / "results.json").read_text())["status"] == "finished"
    assert [p.name for p in (run / "checkpoints").glob("best-*.ckpt")] == ["best-epoch000.ckpt"]
    assert not (run / "run.lock").exists()


def test_read_holder_of_a_lock_none_unreadable_or_written_while_it_waits(tmp_path):
    import threading

    from reproductions.run.rundir import read_holder

    assert read_holder(tmp_path) is None  # no lock
    lock = tmp_path / "run.lock"
    for half_written in ("", '{"pid": 1', "[1, 2]"):
        lock.write_text(half_written)
        assert read_holder(tmp_path) == {}  # at once: a report does not wait
    lock.write_text("")
    holder = {"pid": 123, "host": "h", "started": "2026-01-01T00:00:00"}
    writer = threading.Timer(0.15, lambda: lock.write_text(json.dumps(holder)))
    writer.start()  # a holder between its O_EXCL create and its write
    try:
        assert read_holder(tmp_path, wait=True) == holder
    finally:
        writer.join()
    assert read_holder(tmp_path) == holder


@pytest.mark.subprocess
@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_the_resumed_run_keeps_metrics_and_time(tmp_path):
    root = tmp_path / "runs"
    run = root / RUN
    ask = tmp_path / "signal"
    args = ["fit", "--config", DIGITS, "--run.root", str(root), *TINY, *slow(ask), "--trainer.max_epochs", "6"]
    proc, t0 = start(*args, log=tmp_path / "first.log")
    try:
        wait_for(run / "checkpoints" / "last.ckpt", proc)
        ask_for(ask, "SIGTERM")  # mid-epoch: the checkpoint is taken at the signal
        result = finish(proc, tmp_path / "first.log", t0, "SIGTERM to a training run")
    finally:
        if proc.poll() is None:
            proc.kill()
    assert result.returncode == 128 + signal.SIGTERM, result.output[-3000:]
    assert result.last.startswith("error: stopped by SIGTERM at step ")
    no_traceback(result)
    command = result.last.split("resume with: ", 1)[1]
    assert command.endswith(f"--ckpt_path {run / 'checkpoints' / 'last.ckpt'}")
    interrupted = json.loads((run / "results.json").read_text())
    assert interrupted["status"] == "interrupted"
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")
    step = ckpt["global_step"]
    assert f"at step {step} " in result.last and step % 4 != 0  # saved at the signal, not at an epoch end
    assert ckpt["callbacks"]["TrainingClock"]["fit_time_s"] > 0
    assert not (run / "run.lock").exists() and not list(run.rglob("*.tmp"))
    before = [r for r in csv_rows(run / "metrics.csv")]

    argv = shlex.split(command)
    assert argv[:3] == ["python", "-m", "reproductions"]
    resumed = repro(*argv[3:], case="resume from the SIGTERM checkpoint")
    assert resumed.returncode == 0, resumed.output[-3000:]
    res = json.loads((run / "results.json").read_text())
    assert res["status"] == "finished" and res["training"]["steps"] == 24 and res["training"]["segments"] == 2
    assert res["training"]["fit_time_s"] > interrupted["training"]["fit_time_s"]
    assert res["training"]["samples_per_sec"] > 0
    rows = csv_rows(run / "metrics.csv")
    kept = [r for r in before if int(r["step"]) < step]
    assert kept and [{k: r.get(k, "") for k in kept[0]} for r in rows[: len(kept)]] == kept
    steps = [int(r["step"]) for r in rows if r["train/loss_step"]]
    assert steps == list(range(24))  # every training step once: none lost, none twice
    assert sum(1 for r in rows if r.get("val/acc")) == 6 and sum(1 for r in rows if r.get("test/acc")) == 1


# --------------------------------------------------------------------------- 7. atomic checkpoints


def _limit_file_size(limit: int):
    def preexec() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return preexec


@pytest.mark.subprocess
@pytest.mark.xdist_group("faults-finished")  # shares a module fixture: one test process
def test_checkpoint_write_on_a_full_disk_fails_cleanly(finished, tmp_path):
    root, run = copy_run(finished, tmp_path)
    last = run / "checkpoints" / "last.ckpt"
    before = {p.name: p.read_bytes() for p in (run / "checkpoints").glob("*.ckpt")}
    assert last.stat().st_size > 100_000
    result = repro("fit", "--config", DIGITS, "--run.root", str(root), *TINY, "--trainer.max_epochs", "3",
                   "--ckpt_path", str(last), preexec_fn=_limit_file_size(100_000), case="checkpoint write, disk full")
    assert result.returncode == 1, result.output[-3000:]
    assert result.last.startswith("error: could not write the checkpoint ") and "File too large" in result.last
    no_traceback(result)
    after = {p.name: p.read_bytes() for p in (run / "checkpoints").glob("*.ckpt")}
    assert after == before  # the earlier checkpoints intact, no partial one
    assert not [p for p in root.rglob("*") if p.name.endswith(".tmp")]
    for path in (run / "checkpoints").glob("*.ckpt"):
        torch.load(path, weights_only=True, map_location="cpu")
    res = json.loads((run / "results.json").read_text())
    assert res["status"] == "failed" and "could not write the checkpoint" in res["error"]


# --------------------------------------------------------------------------- 6. SLURM, by construction


def test_under_slurm_the_trainer_requeues_itself(monkeypatch, tmp_path):
    from lightning.fabric.plugins.environments import SLURMEnvironment

    from lightning_modules.checkpoint_io import AtomicCheckpointIO
    from reproductions.run.cli import ReproductionCLI

    for key, value in {"SLURM_NTASKS": "1", "SLURM_JOB_NAME": "sweep", "SLURM_JOB_ID": "4242", "SLURM_PROCID": "0",
                       "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NODELIST": "node1",
                       "SLURM_NTASKS_PER_NODE": "1"}.items():
        monkeypatch.setenv(key, value)

    class Built(ReproductionCLI):
        def _run_subcommand(self, subcommand: str) -> None:  # build everything, run nothing
            pass

    cli = Built(args=["fit", "--config", DIGITS, "--run.root", str(tmp_path), *TINY])
    env = cli.trainer._accelerator_connector.cluster_environment
    assert isinstance(env, SLURMEnvironment) and env.auto_requeue and env.requeue_signal == signal.SIGUSR1
    assert isinstance(cli.trainer.strategy.checkpoint_io, AtomicCheckpointIO)
    previous = signal.getsignal(signal.SIGUSR1)
    cli.signals.install()
    try:  # SIGUSR1 is left to Lightning's requeue handler; SIGTERM is ours
        assert signal.getsignal(signal.SIGUSR1) == previous and signal.getsignal(signal.SIGTERM) == cli.signals.handle
    finally:
        cli.signals.restore()


@pytest.mark.subprocess
def test_a_slim_checkpoint_tests_like_the_training_one(finished, tmp_path):
    """scripts/slim_checkpoint.py: the weights and the model's arguments only; `repro test` on it
    gives the fit's own test numbers."""
    root, run = copy_run(finished, tmp_path)
    slim = tmp_path / "slim.ckpt"
    done = subprocess.run([sys.executable, "scripts/slim_checkpoint.py", str(run / "checkpoints" / "last.ckpt"),
                           str(slim)], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    full = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)
    small = torch.load(slim, weights_only=True)
    assert "optimizer_states" in full and set(small) <= set(full) and "optimizer_states" not in small
    assert slim.stat().st_size < 0.6 * (run / "checkpoints" / "last.ckpt").stat().st_size
    assert all(torch.equal(small["state_dict"][k], v) for k, v in full["state_dict"].items())
    result = repro("test", "--config", DIGITS, "--run.root", str(root), *TINY, "--ckpt_path", str(slim),
                   case="test on a slim checkpoint")
    assert result.returncode == 0, result.output[-3000:]
    fit_test = json.loads((run / "results.json").read_text())["test"]
    [tested] = [row for row in csv.DictReader((run / "test" / "metrics.csv").open()) if row.get("test/acc")]
    assert float(tested["test/acc"]) == pytest.approx(fit_test["test/acc"], abs=1e-7)
    assert float(tested["test/loss"]) == pytest.approx(fit_test["test/loss"], rel=1e-5)
    bad = subprocess.run([sys.executable, "scripts/slim_checkpoint.py", str(run / "config.yaml"), str(tmp_path / "x.ckpt")],
                         cwd=REPO, capture_output=True, text=True)
    assert bad.returncode == 2 and "is not a checkpoint" in bad.stderr and not (tmp_path / "x.ckpt").exists()

"""Faults at the start of a run and in what it records, through the real command line (tests/test_faults.py style).

- a multi-node run that nothing launches is refused at once (no hang); one whose other nodes never
  come fails after ``--run.rendezvous_timeout``; SIGTERM/SIGINT stop the wait; no lock is left;
- a resume, ``test`` or ``validate`` whose config gives the model differently from the checkpoint
  is refused, naming each key and both values (reproductions/run/model_check.py, unit-tested too);
- ``test`` on a moved run's own config.yaml and checkpoint writes into the moved directory, never into the
  run its copied ``run.root`` names; which folder is a run's (``existing_run_dir``);
- ``samples_seen`` and the training FLOPs count the samples seen (a partial batch as its size);
- Lightning's "previous log files will be deleted" warning only when a metrics.csv is replaced.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reproductions.run.model_check import model_differences, refusal, runtime_settings
from reproductions.run.rundir import existing_run_dir
from tests.cli_helpers import (  # noqa: F401 - finished: the module fixture
    DIGITS, NET, REPO, RUN, TINY, cli_env, copy_run, csv_rows, finished, repro, repro_here, tree, usage_error,
)

RESNET = "reproductions/vit/configs/resnet_fashion_mnist.yaml"
TWO_NODES = ["--trainer.accelerator", "cpu", "--trainer.num_nodes", "2", "--trainer.strategy", "ddp"]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- distributed start


@pytest.mark.distributed
@pytest.mark.subprocess
@pytest.mark.slow
def test_more_nodes_than_launched_is_refused_at_once_and_leaves_nothing(tmp_path):
    result = repro("fit", "--config", DIGITS, "--run.root", str(tmp_path / "runs"), *TINY, *TWO_NODES,
                   case="num_nodes 2 without a launcher", timeout=120)
    usage_error(result, "--trainer.num_nodes 2", "nothing launches the other 1 node(s)", "torchrun", "NODE_RANK",
                "--trainer.num_nodes 1")
    assert not list((tmp_path / "runs").rglob("run.lock"))


@pytest.mark.distributed
@pytest.mark.subprocess
@pytest.mark.slow
def test_other_nodes_that_never_join_time_out_naming_who_is_missing(tmp_path):
    env = cli_env(NODE_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    result = repro("fit", "--config", DIGITS, "--run.root", str(tmp_path / "runs"), *TINY, *TWO_NODES,
                   "--run.rendezvous_timeout", "3", case="the other node never joins", timeout=120, env=env)
    assert result.returncode == 1, result.output[-3000:]
    assert result.last.startswith("error: the distributed start timed out after 3 s"), result.last
    assert "1 of 2 processes joined" in result.last and "--run.rendezvous_timeout" in result.last
    assert "Traceback" not in result.output
    assert not list((tmp_path / "runs").rglob("run.lock"))


@pytest.mark.distributed
@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.parametrize("signum, devices", [(signal.SIGTERM, 2), (signal.SIGINT, 1)])
def test_a_signal_stops_the_wait_for_the_other_nodes_at_once(signum, devices, tmp_path):
    """The local processes (devices 2: two) of node 0 of 2 wait in C++ for node 1; the signal ends all."""
    log = tmp_path / "out.log"
    env = cli_env(NODE_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    with open(log, "w") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "reproductions", "fit", "--config", DIGITS, "--run.root", str(tmp_path / "runs"),
             *TINY, *TWO_NODES, "--trainer.devices", str(devices)], cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as a terminal's process gets it
    try:
        deadline = time.monotonic() + 240
        while log.read_text().count("Initializing distributed") < devices:  # all are in the rendezvous
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        time.sleep(1.0)
        sent = time.monotonic()
        proc.send_signal(signum)
        code = proc.wait(timeout=30)
        waited = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    out = log.read_text()
    assert code == 128 + signum, out[-3000:]
    assert waited < 15, waited
    lines = [line for line in out.splitlines() if line.startswith("error:")]
    assert lines == [f"error: stopped by {signal.Signals(signum).name} while waiting for the other processes of the "
                     "distributed start; nothing was trained; rerun the same command"], out[-3000:]
    assert not list((tmp_path / "runs").rglob("run.lock"))
    time.sleep(1.0)
    left = subprocess.run(["pgrep", "-f", str(tmp_path / "runs")], capture_output=True, text=True).stdout.split()
    assert not left, f"processes left running: {left}"


def test_rendezvous_timeout_must_be_positive(tmp_path, capfd, monkeypatch):
    result = repro_here("fit", "--config", DIGITS, "--run.root", str(tmp_path / "runs"), *TINY,
                        "--run.rendezvous_timeout", "0", case="rendezvous_timeout 0", capfd=capfd, monkeypatch=monkeypatch)
    usage_error(result, "--run.rendezvous_timeout=0", "> 0")


# --------------------------------------------------------------------------- the checkpoint fixes the model


VIT_HPARAMS = {
    "_class_path": "lightning_modules.image_classifier.ImageClassifier",
    "net": {"class_path": "models.vit.ViT", "init_args": {"embed_dim": 64, "depth": 4, "pos_embed": "learned_1d"}},
    "lr": 2e-3, "betas": [0.9, 0.999], "compile": False, "label_smoothing": 0.1,
    "_instantiator": "lightning.pytorch.cli.instantiate_module",
}


def _config(**net_args):
    net = {"embed_dim": 64, "depth": 4, "pos_embed": "learned_1d", **net_args}
    return {"class_path": "lightning_modules.image_classifier.ImageClassifier",
            "init_args": {"net": {"class_path": "models.vit.ViT", "init_args": net}, "lr": 0.002,
                          "betas": (0.9, 0.999), "compile": True, "label_smoothing": 0.1}}


def test_model_differences_name_every_differing_key_and_both_values():
    assert model_differences(_config(), VIT_HPARAMS, "fit") == []  # 0.002 == 2e-3, tuple == list, compile is free
    diff = model_differences(_config(embed_dim=32, pos_embed="relative"), VIT_HPARAMS, "fit")
    assert diff == [("model.init_args.net.init_args.embed_dim", 32, 64),
                    ("model.init_args.net.init_args.pos_embed", "relative", "learned_1d")]
    line = refusal(diff, "x/last.ckpt", "fit")
    assert "--model.init_args.net.init_args.embed_dim is 32 here but 64 in the checkpoint" in line
    assert "'relative' here but 'learned_1d'" in line and "\n" not in line


def test_the_optimiser_may_differ_for_test_not_for_a_resume():
    config = _config()
    config["init_args"]["lr"] = 0.1
    assert model_differences(config, VIT_HPARAMS, "test") == []
    assert model_differences(config, VIT_HPARAMS, "fit") == [("model.init_args.lr", 0.1, 2e-3)]


def test_another_class_is_named_once_not_argument_by_argument():
    config = {"class_path": "lightning_modules.image_classifier.ImageClassifier",
              "init_args": {"net": {"class_path": "models.resnet.ResNet", "init_args": {"embed_dim": 8}}}}
    assert model_differences(config, VIT_HPARAMS, "test") == [
        ("model.init_args.net.class_path", "models.resnet.ResNet", "models.vit.ViT")]
    assert model_differences(None, VIT_HPARAMS, "test") == []  # no model in the config: the checkpoint's


def test_the_runtime_settings_are_the_configs_not_the_checkpoints():
    config = _config()
    config["init_args"].update(eval_flip=True, eval_translate=1, channels_last=True)
    assert model_differences(config, VIT_HPARAMS, "fit") == []  # free to differ...
    # ...and the run takes the config's (merge_model puts them over the checkpoint's hyper-parameters)
    assert runtime_settings(config) == {"compile": True, "eval_flip": True, "eval_translate": 1, "channels_last": True}
    assert runtime_settings(None) == {}  # no model in the config: all the checkpoint's


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.xdist_group("faults-finished")  # shares test_faults' module fixture: one test process
def test_a_resume_or_test_that_would_change_the_model_is_refused(finished, tmp_path, capfd, monkeypatch):
    root, run = copy_run(finished, tmp_path)
    before = sorted((p.name, p.stat().st_mtime_ns) for p in run.rglob("*"))
    # refused before any data or process starts: in this process (the resume below is a real command line)
    result = repro_here("fit", "--config", DIGITS, "--run.root", str(root), *TINY, "--trainer.max_epochs", "3",
                        "--ckpt_path", "last", f"{NET}embed_dim", "16", case="resume with another embed_dim",
                        capfd=capfd, monkeypatch=monkeypatch)
    usage_error(result, "--model.init_args.net.init_args.embed_dim is 16 here but 32 in the checkpoint")
    result = repro_here("test", "--config", RESNET, "--data.init_args.source", "digits", "--run.root", str(root),
                        "--run.experiment", "vit/digits", "--ckpt_path", str(run / "checkpoints" / "last.ckpt"),
                        case="test a ViT checkpoint with a ResNet config", capfd=capfd, monkeypatch=monkeypatch)
    usage_error(result, "--model.init_args.net.class_path is 'models.resnet.ResNet' here but 'models.vit.ViT'")
    assert sorted((p.name, p.stat().st_mtime_ns) for p in run.rglob("*")) == before  # nothing touched
    # what may change on resume passes: epochs, limits, the module's compile switch, its evaluation,
    # and the resumed run runs as the command says (the checkpoint's run had eval_flip false)
    assert "eval_flip: false" in (run / "hparams.yaml").read_text()
    result = repro("fit", "--config", DIGITS, "--run.root", str(root), *TINY, "--trainer.max_epochs", "3",
                   "--ckpt_path", "last", "--model.init_args.compile", "false", "--model.init_args.eval_flip", "true",
                   case="resume with more epochs")
    assert result.returncode == 0, result.output[-3000:]
    assert json.loads((run / "results.json").read_text())["training"]["epochs"] == 3
    assert "eval_flip: true" in (run / "hparams.yaml").read_text()


# --------------------------------------------------------------------------- where an existing run lies


@pytest.mark.subprocess
@pytest.mark.xdist_group("faults-finished")  # shares test_faults' module fixture: one test process
def test_a_moved_run_is_tested_where_it_lies_and_the_run_at_its_old_place_is_untouched(finished, tmp_path, capfd,
                                                                                       monkeypatch):
    """A finished run moved elsewhere, tested with its own config.yaml and checkpoint: the test's files go into
    the moved directory (it says so), the fit's numbers again; the finished run at the place its copied config
    names (run.root and, as a sweep's runs have, the experiment) stays byte-identical."""
    _, run = copy_run(finished, tmp_path)
    moved = tmp_path / "elsewhere" / "seed0"
    moved.parent.mkdir()
    shutil.move(run, moved)
    config = moved / "config.yaml"
    text = config.read_text()
    assert f"root: {finished}" in text and text.count("experiment: null") == 1
    config.write_text(text.replace("experiment: null", "experiment: vit/digits"))  # the old place: finished/RUN
    before = tree(finished)
    result = repro_here("test", "--config", str(config), "--ckpt_path", str(moved / "checkpoints" / "last.ckpt"),
                        case="test a moved run", capfd=capfd, monkeypatch=monkeypatch)
    assert result.returncode == 0, result.output[-3000:]
    assert f"test: writing into {moved / 'test'}" in result.lines
    [tested] = [row for row in csv_rows(moved / "test" / "metrics.csv") if row.get("test/acc")]
    assert float(tested["test/acc"]) == pytest.approx(json.loads((moved / "results.json").read_text())["test"]["test/acc"])
    assert tree(finished) == before and not (finished / RUN / "test").exists()


def test_a_run_directory_is_taken_from_its_own_checkpoint_or_config(tmp_path):
    run = tmp_path / "moved" / "seed0"
    (run / "checkpoints").mkdir(parents=True)
    ckpt, config = run / "checkpoints" / "last.ckpt", run / "config.yaml"
    config.write_text("seed_everything: 0\n")
    other = tmp_path / "weights" / "checkpoints" / "last.ckpt"  # a checkpoints/ folder that holds no run
    other.parent.mkdir(parents=True)
    assert existing_run_dir("test", ckpt, []) == run == existing_run_dir("validate", None, [DIGITS, str(config)])
    assert existing_run_dir("test", other, [DIGITS]) is None and existing_run_dir("test", "last", [DIGITS]) is None
    assert existing_run_dir("fit", ckpt, [DIGITS]) is None  # another run's weights start a new run
    assert existing_run_dir("fit", ckpt, [str(config)]) == run  # resuming a moved run in its own directory
    (run / "checkpoints").rmdir()
    assert existing_run_dir("test", None, [str(config)]) is None  # a config.yaml alone is not a run


# --------------------------------------------------------------------------- what a run records


@pytest.mark.subprocess
@pytest.mark.slow
def test_samples_seen_counts_a_partial_batch_as_its_size_and_no_false_log_warning(tmp_path):
    root = tmp_path / "runs"
    result = repro("fit", "--config", DIGITS, "--run.root", str(root), *TINY[:8], "--trainer.max_epochs", "2",
                   "--trainer.limit_val_batches", "1", "--trainer.limit_test_batches", "1",
                   "--data.init_args.batch_size", "1000", case="batch 1000 on 1294 images")
    assert result.returncode == 0, result.output[-3000:]
    assert "will be deleted" not in result.output and "is replaced" not in result.output
    res = json.loads((root / RUN / "results.json").read_text())
    train = res["data"]["train_size"]
    assert train < 2000  # one full and one partial batch per epoch (no drop_last below two batches)
    assert res["training"]["steps"] == 4
    assert res["training"]["samples_seen"] == 2 * train
    assert res["training"]["total_train_flops"] == 3 * res["model"]["flops_per_sample"] * 2 * train
    # a fresh attempt over an unfinished one replaces its metrics.csv, and says so
    (root / RUN / "results.json").unlink()
    result = repro("fit", "--config", DIGITS, "--run.root", str(root), *TINY, case="fresh attempt")
    assert result.returncode == 0, result.output[-3000:]
    assert "metrics.csv of an earlier attempt is replaced" in result.output

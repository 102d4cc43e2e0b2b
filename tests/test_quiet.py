"""Quiet runs (reproductions/run/quiet.py): the Lightning warnings silenced are few, exact and anchored; other
warnings still show; ``--debug`` shows everything; a fit and a test on its checkpoint print no warning line."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from reproductions.run import quiet
from tests.cli_helpers import run_repro, warning_lines

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("pattern", quiet.patterns("test"))
def test_every_pattern_is_an_exact_anchored_message(pattern):
    assert not pattern.startswith((".", "^.", "(?")) and ".*" not in pattern and ".+" not in pattern
    assert len(pattern) >= 60  # a whole sentence, not a word


@pytest.mark.parametrize("message", [
    "It is recommended to use `self.log('train/samples_per_sec', ..., sync_dist=True)` when logging on epoch level",
    "The dirpath has changed from 'a' to 'b', therefore `best_model_score` ... will not be reloaded",
    "The number of training batches (3) is smaller than the logging interval Trainer(log_every_n_steps=50).",
    "Checkpoint directory /x exists and is not empty.",
    "`isinstance(treespec, TreeSpec)` is deprecated",  # only the exact LeafSpec sentence is silenced
    "You're using the WeightAveraging callback with a model that overrides the configure_model callback.",
])
def test_other_warnings_are_not_silenced(message):
    for subcommand in ("fit", "test", "validate"):
        assert not quiet.is_silenced(message, subcommand)


def test_evaluation_only_warnings_show_in_fit(monkeypatch):
    message = ("Be aware that when using `ckpt_path`, callbacks used to create the checkpoint need to be provided "
               "during `Trainer` instantiation. Please add the following callbacks: [...]")
    assert quiet.is_silenced(message, "test") and quiet.is_silenced(message, "validate")
    assert not quiet.is_silenced(message, "fit")  # a resume needs every callback's state: shown
    monkeypatch.delenv("REPRO_DEBUG", raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet.silence_lightning_noise("test")
        warnings.warn(message, UserWarning)
        warnings.warn("something else", UserWarning)
    assert [str(w.message) for w in caught] == ["something else"]
    monkeypatch.setenv("REPRO_DEBUG", "1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet.silence_lightning_noise("test")
        warnings.warn(message, UserWarning)
    assert len(caught) == 1  # --debug: everything


@pytest.mark.subprocess
@pytest.mark.slow
def test_a_fit_and_a_test_on_its_checkpoint_print_no_warning_line(tmp_path):
    tiny = ["--trainer.max_epochs", "2", "--trainer.limit_train_batches", "4", "--trainer.log_every_n_steps", "2",
            "--trainer.limit_val_batches", "2",
            "--trainer.limit_test_batches", "2", "--trainer.callbacks=[]"]
    config = "reproductions/vit/configs/digits.yaml"
    fit = run_repro("fit", "--config", config, "--run.root", str(tmp_path), *tiny)
    assert fit.returncode == 0, fit.stderr[-3000:]
    assert warning_lines(fit.stdout + fit.stderr) == []
    ckpt = next(tmp_path.rglob("last.ckpt"))
    test = run_repro("test", "--config", config, "--run.root", str(tmp_path), "--ckpt_path", str(ckpt), *tiny)
    assert test.returncode == 0, test.stderr[-3000:]
    assert warning_lines(test.stdout + test.stderr) == []
    assert not (ckpt.parents[1] / "test" / "checkpoints").exists()  # a test saves no checkpoint
    debug = run_repro("test", "--debug", "--config", config, "--run.root", str(tmp_path), "--ckpt_path", str(ckpt),
                   *tiny)
    assert debug.returncode == 0 and any("callbacks used to create the checkpoint" in line
                                         for line in warning_lines(debug.stdout + debug.stderr))

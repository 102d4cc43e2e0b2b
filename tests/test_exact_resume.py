"""A run stopped by a signal in the middle of an epoch and resumed from its checkpoint is the uninterrupted run.

Through the real command line (``python -m reproductions fit`` in a subprocess, tiny configs): one run
goes straight through; another is stopped by SIGTERM or SIGUSR1 when a chosen training step ends, in
the middle of an epoch (``tests.resume_helpers.SignalAtStep``), and resumed with ``--ckpt_path``
``last.ckpt``. Every per-step ``train/loss`` after the stop, the final validation metrics and the test
metrics must be equal (exactly: same hardware, same software) -- for one process with loader workers,
for two DDP processes on the CPU (gloo), and for the behaviour data. Dropout, stochastic depth and
augmentation are on, so the random streams are checked as well as the data order and position.
Not restored: the training means of the epoch that was stopped in (``train/loss_epoch``, ``train/acc``)
cover only its steps after the resume, so they are compared only when a later epoch follows.

Set ``REPRO_FAULTS_LOG=<file>`` to append each run's (exit status, seconds, last line) as JSON lines.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch

from tests.cli_helpers import DIGITS, NET, QUIET as NO_BARS, csv_rows, no_traceback, repro

BST = "reproductions/bst/configs/bst.yaml"
RUN = {DIGITS: Path("vit") / "digits" / "default" / "seed0", BST: Path("bst") / "bst" / "default" / "seed0"}
QUIET = [*NO_BARS, "--trainer.accelerator", "cpu", "--trainer.log_every_n_steps", "1"]
#: a 1-block ViT of width 32 on digits, 6 steps an epoch of the global batch 64, 3 epochs; the random
#: draws on (dropout, stochastic depth, random crop and flip)
VIT = [*QUIET, f"{NET}depth", "1", f"{NET}embed_dim", "32", f"{NET}num_heads", "2", f"{NET}dropout", "0.1",
       f"{NET}drop_path", "0.1", "--data.augment", "crop_flip", "--model.init_args.lr", "0.003",
       "--trainer.limit_train_batches", "6", "--trainer.limit_val_batches", "2", "--trainer.limit_test_batches", "2",
       "--trainer.max_epochs", "3"]
#: BST on 6,000 synthetic impressions: 8 steps an epoch of 128, 2 epochs, validation every 2 steps (mid-epoch)
BST_TINY = [*QUIET, "--data.init_args.synthetic_samples", "6000", "--data.init_args.batch_size", "128",
            f"{NET}mlp_dims", "[64, 32]", "--trainer.limit_train_batches", "8", "--trainer.limit_val_batches", "2",
            "--trainer.limit_test_batches", "2", "--trainer.max_epochs", "2"]
DDP = ["--trainer.devices", "2", "--trainer.strategy", "ddp"]


def losses(run: Path) -> dict[int, float]:
    return {int(r["step"]): float(r["train/loss_step"]) for r in csv_rows(run / "metrics.csv") if r.get("train/loss_step")}


def stop_and_resume(tmp_path: Path, config: str, args: list[str], *, step: int, signame: str,
                    steps_per_epoch: int, total_steps: int, ranks: str = "all") -> None:
    """Run ``config`` straight, and stopped by ``signame`` at ``step`` then resumed; compare them."""
    common = ["fit", "--config", config, *args]
    straight_root, stopped_root = tmp_path / "straight", tmp_path / "stopped"
    straight = repro(*common, "--run.root", str(straight_root), case=f"straight {config}")
    assert straight.returncode == 0, straight.output[-3000:]

    stop = ["--trainer.callbacks+=tests.resume_helpers.SignalAtStep", "--trainer.callbacks.step", str(step),
            "--trainer.callbacks.signal", signame, "--trainer.callbacks.ranks", ranks]
    stopped = repro(*common, "--run.root", str(stopped_root), *stop, case=f"{signame} at step {step}")
    signum = getattr(signal, signame)
    assert stopped.returncode == 128 + signum, stopped.output[-3000:]
    assert stopped.last.startswith(f"error: stopped by {signame} at step {step} "), stopped.last
    no_traceback(stopped)
    run = stopped_root / RUN[config]
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")
    assert ckpt["global_step"] == step and step % steps_per_epoch != 0  # mid-epoch
    position = ckpt["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    assert position == [{"epoch": step // steps_per_epoch, "samples": (step % steps_per_epoch) * batch_size(args)}]

    resumed = repro(*common, "--run.root", str(stopped_root), "--ckpt_path", str(run / "checkpoints" / "last.ckpt"),
                    case=f"resume from the {signame} checkpoint")
    assert resumed.returncode == 0, resumed.output[-3000:]

    a, b = losses(straight_root / RUN[config]), losses(run)
    where = " (2 DDP processes)" if "--trainer.strategy" in args else ""
    print(f"\n{config}{where}: stopped by {signame} after step {step - 1} (global_step {step}), resumed")
    for s in range(max(0, step - 2), min(total_steps, step + 4)):
        print(f"  step {s:2d}: uninterrupted {a[s]:.7f}   stopped+resumed {b.get(s, float('nan')):.7f}")
    assert sorted(a) == sorted(b) == list(range(total_steps))  # every step once, none lost, none twice
    assert {s: b[s] for s in a if s >= step} == {s: a[s] for s in a if s >= step}
    ra, rb = (json.loads((p / "results.json").read_text()) for p in (straight_root / RUN[config], run))
    assert rb["status"] == "finished" and rb["training"]["segments"] == 2
    assert rb["test"] == ra["test"]
    if step // steps_per_epoch < total_steps // steps_per_epoch - 1:
        assert rb["final"] == ra["final"]
    else:  # the training means of the epoch stopped in cover its steps after the resume only
        assert {k: v for k, v in rb["final"].items() if not k.startswith("train/")} == {
            k: v for k, v in ra["final"].items() if not k.startswith("train/")}
    print(f"  final: {ra['final']}\n  test: uninterrupted {ra['test']}  resumed {rb['test']}")


def batch_size(args: list[str]) -> int:
    """The global batch of a run's arguments (the configs' 64 for the images, else the override)."""
    for key in ("--data.batch_size", "--data.init_args.batch_size"):
        if key in args:
            return int(args[args.index(key) + 1])
    return 64


@pytest.mark.subprocess
@pytest.mark.slow
def test_sigterm_mid_epoch_one_process_with_loader_workers_resumes_exactly(tmp_path):
    # step 8 = the 3rd batch of epoch 1; two workers per loader: their random draws are seeded per batch
    stop_and_resume(tmp_path, DIGITS, [*VIT, "--data.num_workers", "2"], step=8, signame="SIGTERM",
                    steps_per_epoch=6, total_steps=18)


@pytest.mark.distributed
@pytest.mark.subprocess
@pytest.mark.slow
def test_sigterm_mid_epoch_two_ddp_processes_resume_exactly(tmp_path):
    # each rank's share of the global batch 64, its own random streams, the position saved by rank 0
    # every rank gets SIGTERM, as a scheduler sends it: all stop at the same step (no collective in a handler)
    stop_and_resume(tmp_path, DIGITS, [*VIT, *DDP], step=10, signame="SIGTERM", steps_per_epoch=6, total_steps=18)


@pytest.mark.subprocess
@pytest.mark.slow
def test_sigusr1_mid_epoch_behaviour_data_resumes_exactly(tmp_path):
    # the behaviour loader shuffled from the global generator before; validation runs inside the epoch too
    stop_and_resume(tmp_path, BST, BST_TINY, step=5, signame="SIGUSR1", steps_per_epoch=8, total_steps=16)


@pytest.mark.distributed
@pytest.mark.subprocess
@pytest.mark.slow
def test_sigusr1_mid_epoch_two_ddp_processes_behaviour_data_resume_exactly(tmp_path):
    # only rank 0 gets it (kill of the command a user started): the others learn of it at the same step
    stop_and_resume(tmp_path, BST, [*BST_TINY, *DDP], step=11, signame="SIGUSR1", steps_per_epoch=8,
                    total_steps=16, ranks="first")

"""Exact resume through the command line: a callback that tests attach to stop a run at a chosen training
step (``--trainer.callbacks+=tests.resume_helpers.SignalAtStep --trainer.callbacks.step N``), the tiny runs
and ``stop_and_resume``, which compares a run stopped there and resumed with the uninterrupted one."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import torch
from lightning import Callback

from tests.cli_helpers import DIGITS, NET, QUIET as NO_BARS, csv_rows, no_traceback, repro


class SignalAtStep(Callback):
    """Send ``signal`` (``SIGTERM`` or ``SIGUSR1``) when training step ``step`` ends.

    Deterministic, unlike a signal sent from outside at a random moment: the signal is real (the
    CLI's handlers take it, as they take a scheduler's), and it lands after the optimiser step that
    makes ``global_step == step``, inside training. A resumed run starts past ``step`` and never
    signals again. ``ranks``: ``all`` (every process signals itself, as a scheduler signals every
    task of a job) or ``first`` (only global rank 0, as ``kill`` of the command a user started).
    """

    def __init__(self, step: int, signal: str = "SIGTERM", ranks: str = "all") -> None:
        if ranks not in ("all", "first"):
            raise ValueError(f"ranks={ranks!r}: all or first")
        self.step = int(step)
        self.signal = signal
        self.ranks = ranks

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step != self.step or (self.ranks == "first" and trainer.global_rank != 0):
            return
        os.kill(os.getpid(), getattr(signal, self.signal))


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

"""``bench trainer``: Lightning ``fit`` against a plain PyTorch loop, same network, batches and optimiser.

images/s of a Lightning ``fit`` (ImageClassifier, its metrics and logging, a CSV logger) against a
plain loop that trains the same ViT on the same batches with the same AdamW parameter groups and
warm-up + cosine schedule. Both are timed in steady state (from the end of the first step to the
end of the last), alternating over rounds (``common.alternate``); the result is the ratio of
medians and the median of the per-round ratios. Defaults: the shape of
``reproductions/vit/configs/fashion_mnist.yaml``'s ViT (28 px, 1 channel, patch 4, width 64, depth
4, 4 heads, MLP ratio 2) at its batch size 128, 30 steps per fit, 3 rounds.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings

import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_modules.base import warmup_schedule
from models.vit import ViT
from reproductions.benchmarks.common import (
    BenchReport, Table, add_run_args, alternate, fmt_rate, fmt_ratio, median, paired_ratios, run_settings, setup_run,
)

NAME = "trainer"
HELP = "Lightning fit vs a plain PyTorch loop, same model and batches"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--img-size", dest="img_size", type=int, default=28)
    parser.add_argument("--in-chans", dest="in_chans", type=int, default=1)
    parser.add_argument("--patch-size", dest="patch_size", type=int, default=4)
    parser.add_argument("--embed-dim", dest="embed_dim", type=int, default=64)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--num-heads", dest="num_heads", type=int, default=4)
    parser.add_argument("--mlp-ratio", dest="mlp_ratio", type=float, default=2.0)
    add_run_args(parser, rounds=3, steps=30, warmup=None, batch_size=128, device=False)


class _StepClock:
    """Lightning callback (duck-typed, built lazily) recording the end of the first and last steps."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.last: float | None = None
        self.steps = 0

    def tick(self) -> None:
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        else:
            self.steps += 1
        self.last = now


def _net(args) -> ViT:
    torch.manual_seed(0)
    return ViT(
        img_size=args.img_size, in_chans=args.in_chans, num_classes=10, patch_size=args.patch_size,
        embed_dim=args.embed_dim, depth=args.depth, num_heads=args.num_heads, mlp_ratio=args.mlp_ratio,
    )


def _loader(args) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    n = args.batch_size * args.steps
    x = torch.randn(n, args.in_chans, args.img_size, args.img_size, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=False)


def clock_rate(steps: int, first: float | None, last: float | None, batch: int) -> float:
    if not steps or first is None or last is None or last <= first:
        raise RuntimeError("benchmark measured no steps; raise --steps")
    return steps * batch / (last - first)


def run_lightning(args) -> float:
    from lightning import Callback, Trainer
    from lightning.pytorch.loggers import CSVLogger

    from lightning_modules.image_classifier import ImageClassifier

    clock = _StepClock()

    class _Clock(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            clock.tick()

    module = ImageClassifier(_net(args), lr=1e-3, weight_decay=0.05, label_smoothing=0.1)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(
            accelerator="cpu", devices=1, max_epochs=1, precision="32-true",
            logger=CSVLogger(tmp, name="", version=""), log_every_n_steps=10, callbacks=[_Clock()],
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            num_sanity_val_steps=0, limit_val_batches=0,
        )
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*no `val_dataloader`.*")
            trainer.fit(module, train_dataloaders=_loader(args))
    return clock_rate(clock.steps, clock.first, clock.last, args.batch_size)


def run_plain(args) -> float:
    from timm.optim import param_groups_weight_decay

    net = _net(args)
    groups = param_groups_weight_decay(net, 0.05, no_weight_decay_list=set(net.no_weight_decay()))
    opt = torch.optim.AdamW(groups, lr=1e-3)
    total = args.steps
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: warmup_schedule(s, warmup_steps=int(0.05 * total), total_steps=total, min_lr_ratio=0.0)
    )
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    net.train()
    clock = _StepClock()
    for x, y in _loader(args):
        loss = criterion(net(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        clock.tick()
    return clock_rate(clock.steps, clock.first, clock.last, args.batch_size)


def run(args) -> BenchReport:
    device = setup_run(args)
    rates = alternate({"plain": lambda: run_plain(args), "lightning": lambda: run_lightning(args)},
                      args.rounds, unit="images/s")
    lightning_rates, plain_rates = rates["lightning"], rates["plain"]
    lit, plain = median(lightning_rates), median(plain_rates)
    paired = paired_ratios(lightning_rates, plain_rates)  # same round: same machine state
    result = {
        "settings": run_settings(args, device),
        "shape": {k: getattr(args, k) for k in ("img_size", "in_chans", "patch_size", "embed_dim", "depth",
                                                  "num_heads", "mlp_ratio", "batch_size", "steps")},
        "threads": torch.get_num_threads(),
        "lightning_images_per_sec": lightning_rates,
        "plain_images_per_sec": plain_rates,
        "median_lightning": lit,
        "median_plain": plain,
        "ratio_lightning_over_plain": lit / plain,
        "paired_ratios": paired,
        "median_paired_ratio": median(paired),
    }
    table = Table("Lightning fit vs a plain PyTorch loop (training images/s, median of rounds)",
                  ["loop", "images/s", "x plain"])
    table.add("plain PyTorch", fmt_rate(plain), fmt_ratio(1.0))
    table.add("Lightning fit", fmt_rate(lit), fmt_ratio(lit / plain))
    table.notes.append(f"{args.rounds} alternating rounds of {args.steps} steps at batch {args.batch_size}, "
                       f"{torch.get_num_threads()} thread(s); median of per-round ratios {median(paired):.3f}")
    verdict = (f"Lightning fit: {lit:.1f} images/s, plain loop: {plain:.1f} images/s, ratio of medians "
               f"{lit / plain:.3f}, median of per-round ratios {median(paired):.3f} ({args.rounds} alternating rounds)")
    return BenchReport(NAME, result, [table], [verdict])

"""Benchmarks that print ratios against a reference measured in the same process.

``python -m reproductions bench trainer``: images/s of a Lightning ``fit`` (ImageClassifier,
its metrics and logging, a CSV logger) against a plain PyTorch loop that trains the same
network on the same batches with the same optimiser and schedule. Both are timed in steady
state (from the end of the first step to the end of the last), alternating A/B over several
rounds so that machine noise hits both; the ratio of medians is the result.
"""

from __future__ import annotations

import argparse
import statistics
import warnings
import tempfile
import time
from pathlib import Path

import torch
from lightning import Callback, Trainer
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset

from lightning_modules.common import warmup_schedule
from lightning_modules.image_classifier import ImageClassifier
from models.vit import ViT
from reproductions.results import atomic_write_json, environment


class _StepClock(Callback):
    def __init__(self) -> None:
        self.first: float | None = None
        self.last: float | None = None
        self.steps = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
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
    module = ImageClassifier(_net(args), lr=1e-3, weight_decay=0.05, label_smoothing=0.1)
    clock = _StepClock()
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(
            accelerator="cpu", devices=1, max_epochs=1, precision="32-true",
            logger=CSVLogger(tmp, name="", version=""), log_every_n_steps=10, callbacks=[clock],
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            num_sanity_val_steps=0, limit_val_batches=0,
        )
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*no `val_dataloader`.*")
            trainer.fit(module, train_dataloaders=_loader(args))
    return clock_rate(clock.steps, clock.first, clock.last, args.batch_size)


def run_plain(args) -> float:
    net = _net(args)
    from timm.optim import param_groups_weight_decay

    groups = param_groups_weight_decay(net, 0.05, no_weight_decay_list=set(net.no_weight_decay()))
    opt = torch.optim.AdamW(groups, lr=1e-3)
    total = args.steps
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: warmup_schedule(s, warmup_steps=int(0.05 * total), total_steps=total, min_lr_ratio=0.0)
    )
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    net.train()
    first = last = None
    steps = 0
    for x, y in _loader(args):
        loss = criterion(net(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        now = time.perf_counter()
        if first is None:
            first = now
        else:
            steps += 1
        last = now
    return clock_rate(steps, first, last, args.batch_size)


def bench_trainer(args) -> dict:
    lightning_rates, plain_rates = [], []
    for r in range(args.rounds):
        # alternate the order so drift in machine speed does not favour one side
        order = (("plain", run_plain), ("lightning", run_lightning)) if r % 2 == 0 else (
            ("lightning", run_lightning), ("plain", run_plain))
        for name, fn in order:
            rate = fn(args)
            (plain_rates if name == "plain" else lightning_rates).append(rate)
            print(f"round {r + 1}/{args.rounds} {name:9s} {rate:9.1f} images/s", flush=True)
    lit, plain = statistics.median(lightning_rates), statistics.median(plain_rates)
    paired = [a / b for a, b in zip(lightning_rates, plain_rates)]  # same round: same machine state
    return {
        "benchmark": "trainer",
        "shape": {k: getattr(args, k) for k in ("img_size", "in_chans", "patch_size", "embed_dim", "depth",
                                                  "num_heads", "mlp_ratio", "batch_size", "steps")},
        "threads": torch.get_num_threads(),
        "lightning_images_per_sec": lightning_rates,
        "plain_images_per_sec": plain_rates,
        "median_lightning": lit,
        "median_plain": plain,
        "ratio_lightning_over_plain": lit / plain,
        "paired_ratios": paired,
        "median_paired_ratio": statistics.median(paired),
        **environment(),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m reproductions bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", choices=["trainer"], help="the benchmark to run")
    parser.add_argument("--img-size", dest="img_size", type=int, default=28)
    parser.add_argument("--in-chans", dest="in_chans", type=int, default=1)
    parser.add_argument("--patch-size", dest="patch_size", type=int, default=4)
    parser.add_argument("--embed-dim", dest="embed_dim", type=int, default=128)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--num-heads", dest="num_heads", type=int, default=4)
    parser.add_argument("--mlp-ratio", dest="mlp_ratio", type=float, default=2.0)
    parser.add_argument("--batch-size", dest="batch_size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=60, help="optimiser steps per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="alternating A/B rounds; the median is reported")
    parser.add_argument("--out", default="bench_results/trainer.json", help="where the JSON goes")
    args = parser.parse_args(argv)
    result = bench_trainer(args)
    print(
        f"\nLightning fit: {result['median_lightning']:.1f} images/s, plain loop: {result['median_plain']:.1f} "
        f"images/s, ratio of medians {result['ratio_lightning_over_plain']:.3f}, median of per-round ratios "
        f"{result['median_paired_ratio']:.3f} ({args.rounds} alternating rounds)"
    )
    atomic_write_json(Path(args.out), result)
    print(f"written: {args.out}")


if __name__ == "__main__":  # pragma: no cover
    main()

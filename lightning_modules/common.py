"""Pieces every LightningModule here shares: the learning-rate schedule and hparams saving."""

from __future__ import annotations

import math
import types
import warnings

import torch
from lightning import LightningModule
from torch import nn

SCHEDULES = ("constant", "cosine")


def warmup_schedule(
    step: int, *, warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.0, schedule: str = "cosine"
) -> float:
    """Learning-rate multiplier at optimiser step ``step`` (from 0).

    Linear warm-up from 1/warmup_steps to 1 over ``warmup_steps``, then constant (``schedule=
    'constant'``) or cosine decay to ``min_lr_ratio`` at ``total_steps`` (and flat after).
    """
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def scheduled(optimizer: torch.optim.Optimizer, **schedule_kwargs) -> dict:
    """``configure_optimizers``' return value: the optimiser with ``warmup_schedule`` per step."""
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_schedule(step, **schedule_kwargs)
    )
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def save_hparams_without_net(module: LightningModule, frame: types.FrameType | None) -> None:
    """``save_hyperparameters`` from ``__init__`` (pass ``inspect.currentframe()``).

    Under LightningCLI the hparams hold the net's *config*, so ``load_from_checkpoint`` can
    rebuild it; called directly they would hold the module itself, which the checkpoint's
    state_dict already stores: drop it then.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is an instance of `nn.Module`.*")
        module.save_hyperparameters(frame=frame)
    if isinstance(module.hparams.get("net"), nn.Module):
        del module.hparams["net"]

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


# --------------------------------------------------------------------------- learning-rate scaling

#: how the configured ``lr`` follows the global batch: not at all (the default: a config's lr is
#: for its own global batch), linearly (Goyal et al. 2017, SGD) or with the square root (the
#: usual rule for Adam-type optimisers)
LR_SCALINGS = ("none", "linear", "sqrt")


def check_lr_scaling(lr_scaling: str, base_batch_size: int | None) -> None:
    """Raise ValueError for an unknown rule, or a scaling rule without a positive base batch."""
    if lr_scaling not in LR_SCALINGS:
        raise ValueError(f"lr_scaling={lr_scaling!r} is not one of {list(LR_SCALINGS)}")
    if base_batch_size is not None and (isinstance(base_batch_size, bool) or base_batch_size < 1):
        raise ValueError(f"base_batch_size={base_batch_size!r} must be a positive integer")
    if lr_scaling != "none" and base_batch_size is None:
        raise ValueError(
            f"lr_scaling={lr_scaling!r} needs base_batch_size: the global batch the configured lr was tuned for"
        )


def scaled_lr(lr: float, *, lr_scaling: str, global_batch: int | None, base_batch_size: int | None) -> float:
    """The learning rate a run uses: ``lr`` for ``none``; ``lr * k`` for ``linear`` and
    ``lr * sqrt(k)`` for ``sqrt``, where ``k = global_batch / base_batch_size``."""
    check_lr_scaling(lr_scaling, base_batch_size)
    if lr_scaling == "none":
        return float(lr)
    if global_batch is None or global_batch < 1:
        raise ValueError(
            f"lr_scaling={lr_scaling!r} needs the global batch size, got {global_batch!r}: train with a "
            "DataModule that has a batch_size (the global batch, as the DataModules here define it)"
        )
    ratio = global_batch / base_batch_size
    return float(lr) * (ratio if lr_scaling == "linear" else math.sqrt(ratio))


def global_batch_size(trainer) -> int | None:
    """Samples per optimiser step: the DataModule's ``batch_size`` (the global batch, which it
    splits over devices x nodes) times ``accumulate_grad_batches``; None without a DataModule
    batch size."""
    batch = getattr(getattr(trainer, "datamodule", None), "batch_size", None)
    if not isinstance(batch, int) or isinstance(batch, bool):
        return None
    return batch * int(getattr(trainer, "accumulate_grad_batches", 1) or 1)


def resolve_lr(module: LightningModule) -> tuple[float, int | None]:
    """``(lr the optimiser gets, global batch)`` for a module whose hparams hold ``lr``,
    ``lr_scaling`` and ``base_batch_size``, attached to a trainer."""
    h = module.hparams
    trainer = module._trainer
    batch = global_batch_size(trainer) if trainer is not None else None
    rule = h.get("lr_scaling", "none")
    return scaled_lr(h.lr, lr_scaling=rule, global_batch=batch, base_batch_size=h.get("base_batch_size")), batch


def log_effective_lr(module: LightningModule) -> None:
    """Put the effective lr (and the global batch and rule it came from) into every logger's
    hparams (hparams.yaml, the W&B config), next to the configured ``lr``."""
    lr = getattr(module, "effective_lr", None)
    if lr is None:
        return
    stats = {"optim/effective_lr": lr, "optim/lr_scaling": module.hparams.get("lr_scaling", "none")}
    if getattr(module, "global_batch_size", None) is not None:
        stats["optim/global_batch_size"] = module.global_batch_size
    for logger in module.loggers:
        logger.log_hyperparams(stats)


# --------------------------------------------------------------------------- torch.compile

#: ``torch.compile`` modes (``default`` is torch's own default)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def check_compile_mode(mode: str) -> None:
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile_mode={mode!r} is not one of {list(COMPILE_MODES)}")


def is_compiled(net: nn.Module) -> bool:
    """Whether ``net`` was compiled in place (``nn.Module.compile``)."""
    return getattr(net, "_compiled_call_impl", None) is not None


def compile_in_place(net: nn.Module, mode: str = "default") -> None:
    """``torch.compile`` ``net``'s forward in place (``nn.Module.compile``), once.

    In place, not ``net = torch.compile(net)``: the module stays the same object with the same
    parameters, so state_dict keys keep their plain names (no ``_orig_mod.`` prefix) and a
    checkpoint moves freely between compiled and uncompiled modules; attribute access, hooks
    and ``explicit_attention`` work on the module as before. Compilation itself happens at the
    first call.
    """
    check_compile_mode(mode)
    if not is_compiled(net):
        net.compile(mode=None if mode == "default" else mode)

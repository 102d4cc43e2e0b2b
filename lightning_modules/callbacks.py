"""Callbacks every run uses: training clock/throughput and per-epoch reseeding for exact resume."""

from __future__ import annotations

import random
import time

import numpy as np
import torch
from lightning import Callback, LightningModule, Trainer


def _batch_size(batch) -> int:
    first = batch
    while isinstance(first, (tuple, list)):
        first = first[0]
    if isinstance(first, dict):
        first = next(iter(first.values()))
    return int(first.shape[0])


class TrainingClock(Callback):
    """Wall time of ``fit`` and training throughput in samples per second.

    Throughput counts every training batch after the first (which pays one-time costs), over
    the time between consecutive batch ends: data loading, forward, backward and optimiser
    step are included, validation is not. Samples are summed over all processes (the
    per-process batch times the world size), so the number is the job's global rate.
    Logged each epoch as ``train/samples_per_sec``; totals are in ``summary()``. At the end of
    every validation during fit it logs ``time/fit_elapsed_s``, the wall time since fit started
    (validation included), beside the validation metrics: accuracy against wall time, the
    time-to-accuracy curve.
    """

    def __init__(self) -> None:
        self.fit_time_s = 0.0
        self.train_time_s = 0.0
        self.samples = 0
        self.steps_timed = 0
        self._fit_start: float | None = None
        self._last: float | None = None
        self._epoch_time = 0.0
        self._epoch_samples = 0

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._fit_start = time.perf_counter()

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._fit_start is not None:
            self.fit_time_s = time.perf_counter() - self._fit_start

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking and self._fit_start is not None:
            pl_module.log("time/fit_elapsed_s", time.perf_counter() - self._fit_start, on_epoch=True)

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._last = time.perf_counter()
        self._epoch_time = 0.0
        self._epoch_samples = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        now = time.perf_counter()
        first_ever = trainer.global_step <= 1 and batch_idx == 0
        if self._last is not None and not first_ever:
            n = _batch_size(batch) * trainer.world_size
            self._epoch_time += now - self._last
            self._epoch_samples += n
        self._last = now

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.train_time_s += self._epoch_time
        self.samples += self._epoch_samples
        if self._epoch_time > 0:
            pl_module.log("train/samples_per_sec", self._epoch_samples / self._epoch_time, on_epoch=True)

    @property
    def samples_per_sec(self) -> float | None:
        return self.samples / self.train_time_s if self.train_time_s > 0 else None

    def summary(self) -> dict:
        return {
            "fit_time_s": round(self.fit_time_s, 3),
            "timed_train_time_s": round(self.train_time_s, 3),
            "samples_per_sec": None if self.samples_per_sec is None else round(self.samples_per_sec, 2),
        }


def epoch_seed(seed: int, epoch: int, rank: int) -> int:
    """A seed that depends only on (run seed, epoch, process rank)."""
    return (seed * 1_000_003 + epoch * 10_007 + rank) % (2**31 - 1)


class EpochReseed(Callback):
    """Reseed torch, numpy and random at the first training step of every epoch.

    The random draws of training (dropout, stochastic depth, augmentation in the main process)
    then depend only on (seed, epoch, rank), not on what ran before. A run resumed from a
    checkpoint taken at an epoch end therefore continues with the same random stream as an
    uninterrupted run, even though the restart itself (sanity checks, loader construction)
    consumed random numbers. The shuffling order comes from the sampler, seeded per epoch.
    """

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int) -> None:
        # At the first step of the epoch rather than at epoch start: Lightning creates the
        # loader iterator (which draws a base seed from the global generator) at different
        # moments in a fresh and in a resumed epoch.
        if batch_idx != 0:
            return
        s = epoch_seed(self.seed, trainer.current_epoch, trainer.global_rank)
        random.seed(s)
        np.random.seed(s)
        torch.manual_seed(s)

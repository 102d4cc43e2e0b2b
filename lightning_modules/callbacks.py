"""Callbacks every run uses: training clock/throughput, per-step reseeding for exact resume, a stop
at the first non-finite loss, and a checkpoint when a signal stops training."""

from __future__ import annotations

import math
import random
import time
from pathlib import Path
from typing import Any

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
    Logged each epoch as ``train/samples_per_sec``, the sum over the processes of each one's own
    rate (its samples over its own timed time: the job's rate); totals are in ``summary()``. At the
    end of every validation during fit it logs ``time/fit_elapsed_s``, the wall time since fit
    started (validation included) by the clock of process 0, beside the validation metrics:
    accuracy against wall time, the time-to-accuracy curve. Both are reduced across the processes
    (``sync_dist``) the way they are defined, so under DDP every process takes part and the logged
    number is the stated one.

    A run resumed from a checkpoint continues the totals: the clock's state (fit time, timed
    training time and samples so far, the current epoch's part included) is saved in every
    checkpoint (``state_dict``) and restored on resume, so ``fit_time_s`` and the throughput
    cover every segment of the run. The first batch of every segment is not timed.

    ``samples_seen`` counts every training sample the job processed, each batch as it came (a
    partial last batch as its size, not the configured batch size), summed over the processes
    (under DDP the distributed sampler pads the last round with repeated samples: they count,
    as the model saw them). It goes on across resumes like the other totals.
    """

    def __init__(self) -> None:
        self.fit_time_s = 0.0
        self.train_time_s = 0.0
        self.samples = 0
        self.steps_timed = 0
        self.segments = 0
        self._prior_fit_time = 0.0  # fit time of the segments before this one (from the checkpoint)
        self._fit_start: float | None = None
        self._last: float | None = None
        self._segment_started = False
        self._epoch_time = 0.0
        self._epoch_samples = 0
        self.samples_seen: int | None = 0  # None: resumed from a checkpoint that did not count them

    @property
    def started(self) -> bool:
        """Whether fit has started (``on_fit_start`` ran: the data is loaded, training begins)."""
        return self._fit_start is not None

    def elapsed(self) -> float:
        """Fit time so far, over every segment of the run."""
        now = 0.0 if self._fit_start is None else time.perf_counter() - self._fit_start
        return self._prior_fit_time + now

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._fit_start = time.perf_counter()
        self._segment_started = False
        self.segments += 1

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._fit_start is not None:
            self.fit_time_s = self.elapsed()

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking and self._fit_start is not None:
            # process 0's clock: every process joins the reduction, the others add nothing
            elapsed = self.elapsed() if trainer.is_global_zero else 0.0
            pl_module.log("time/fit_elapsed_s", elapsed, on_epoch=True, sync_dist=True, reduce_fx="sum")

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._last = time.perf_counter()
        self._epoch_time = 0.0
        self._epoch_samples = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        now = time.perf_counter()
        if self.samples_seen is not None:
            self.samples_seen += _batch_size(batch) * trainer.world_size
        if self._last is not None and self._segment_started:
            n = _batch_size(batch) * trainer.world_size
            self._epoch_time += now - self._last
            self._epoch_samples += n
            self.steps_timed += 1
        self._segment_started = True  # the first batch of a segment pays one-time costs: not timed
        self._last = now

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.train_time_s += self._epoch_time
        self.samples += self._epoch_samples
        if self._epoch_time > 0:  # the same number of timed batches in every process: all log, or none
            own_rate = self._epoch_samples / max(trainer.world_size, 1) / self._epoch_time  # this process's
            pl_module.log("train/samples_per_sec", own_rate, on_epoch=True, sync_dist=True, reduce_fx="sum")
        self._epoch_time = 0.0  # counted: a checkpoint saved now must not count it again
        self._epoch_samples = 0

    def state_dict(self) -> dict[str, Any]:
        return {
            "fit_time_s": self.elapsed(),
            "train_time_s": self.train_time_s + self._epoch_time,
            "samples": self.samples + self._epoch_samples,
            "steps_timed": self.steps_timed,
            "segments": self.segments,
            "samples_seen": self.samples_seen,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._prior_fit_time = float(state_dict.get("fit_time_s", 0.0))
        self.train_time_s = float(state_dict.get("train_time_s", 0.0))
        self.samples = int(state_dict.get("samples", 0))
        self.steps_timed = int(state_dict.get("steps_timed", 0))
        self.segments = int(state_dict.get("segments", 0))
        seen = state_dict.get("samples_seen")
        self.samples_seen = None if seen is None else int(seen)

    @property
    def samples_per_sec(self) -> float | None:
        return self.samples / self.train_time_s if self.train_time_s > 0 else None

    def summary(self) -> dict:
        return {
            "fit_time_s": round(self.fit_time_s or self.elapsed(), 3),  # so far, if fit has not ended
            "timed_train_time_s": round(self.train_time_s, 3),
            "samples_per_sec": None if self.samples_per_sec is None else round(self.samples_per_sec, 2),
            "segments": self.segments,
        }


def step_seed(seed: int, epoch: int, batch_idx: int, rank: int) -> int:
    """A 64-bit seed that depends only on (run seed, epoch, batch index in the epoch, process rank),
    mixed by numpy's ``SeedSequence`` so that neighbouring steps and ranks draw unrelated streams."""
    entropy = [int(seed) & 0xFFFF_FFFF_FFFF_FFFF, int(epoch), int(batch_idx), int(rank)]
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0])


class ExactResume(Callback):
    """What makes a resumed run the uninterrupted one, also from a checkpoint taken mid-epoch.

    - Random states: torch, numpy and random are reseeded at every training step from (seed,
      epoch, batch index, rank). The draws of a step (dropout, stochastic depth, anything
      ``training_step`` samples) then depend only on where the step is, not on what ran before:
      a run resumed from a checkpoint taken at an epoch end or in the middle of an epoch (a
      signal, a step-based checkpoint) draws at every later step what an uninterrupted run
      draws, although the restart itself (loading, sanity checks, loader construction) consumed
      random numbers. The checkpoint restores them by restoring the step (Lightning continues
      ``batch_idx`` in the resumed epoch); each process has its own stream (``rank``).
    - Data position: a training loader with ``state_dict`` / ``load_state_dict`` (the
      ``ResumableLoader`` of ``datamodules.sampler``) has its position saved by Lightning in
      every checkpoint. Lightning gives it back only to a loader it creates after restoring the
      checkpoint; a module that asks for ``trainer.estimated_stepping_batches`` while it
      configures its optimisers (a warm-up given as a fraction of training) makes the loader
      earlier. This callback gives the saved positions to the training loaders when training
      starts, before their first batch, either way (loading twice is harmless).

    The augmentation is seeded per batch by the datasets; the order is the sampler's.
    """

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)
        self._loader_states: list[dict[str, Any]] = []

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        fit_loop = (checkpoint.get("loops") or {}).get("fit_loop") or {}
        self._loader_states = list((fit_loop.get("state_dict") or {}).get("combined_loader") or [])

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        states, self._loader_states = self._loader_states, []
        if not states:
            return
        stateful = [dl for dl in _flatten(trainer.train_dataloader) if hasattr(dl, "load_state_dict")]
        if len(stateful) != len(states):
            raise RuntimeError(
                f"the checkpoint holds the positions of {len(states)} training loader(s) but this run has "
                f"{len(stateful)} that can take one: resume with the data settings the checkpoint was trained with"
            )
        for loader, state in zip(stateful, states):
            loader.load_state_dict(state)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int) -> None:
        # At the step, after the batch was fetched: Lightning creates the loader iterator (which draws a
        # base seed from the global generator) at different moments in a fresh and in a resumed run.
        s = step_seed(self.seed, trainer.current_epoch, batch_idx, trainer.global_rank)
        random.seed(s)
        np.random.seed(s & 0xFFFF_FFFF)
        torch.manual_seed(s)


def _flatten(loaders: Any) -> list[Any]:
    """The loaders of ``trainer.train_dataloader`` (one loader, or a list/tuple/dict of them), in order."""
    if isinstance(loaders, dict):
        return [dl for value in loaders.values() for dl in _flatten(value)]
    if isinstance(loaders, (list, tuple)):
        return [dl for value in loaders for dl in _flatten(value)]
    return [] if loaders is None else [loaders]


class NonFiniteLossError(FloatingPointError):
    """Training produced a NaN or infinite loss; ``step`` and ``epoch`` say where."""

    def __init__(self, message: str, *, step: int, epoch: int, value: float) -> None:
        super().__init__(message)
        self.step, self.epoch, self.value = step, epoch, value


def _loss_of(outputs: Any) -> torch.Tensor | None:
    if isinstance(outputs, dict):
        outputs = outputs.get("loss")
    return outputs if isinstance(outputs, torch.Tensor) else None


class StopOnNonFiniteLoss(Callback):
    """Stop training when the loss is NaN or infinite for more than ``patience`` steps in a row.

    Raises ``NonFiniteLossError`` naming the step, so the run fails at once (results.json says
    ``failed``) instead of training on NaN weights to the end and reporting a number. Checked
    after every training step on the loss ``training_step`` returned; with several processes
    the decision is all-reduced (a NaN on any rank stops all of them at the same step).
    """

    def __init__(self, patience: int = 0) -> None:
        if patience < 0:
            raise ValueError(f"patience={patience} must be >= 0 (steps with a non-finite loss tolerated in a row)")
        self.patience = int(patience)
        self.bad_steps = 0

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        loss = _loss_of(outputs)
        bad = loss is not None and not bool(torch.isfinite(loss.detach()).all())
        if trainer.world_size > 1:
            bad = trainer.strategy.reduce_boolean_decision(bad, all=False)
        if not bad:
            self.bad_steps = 0
            return
        self.bad_steps += 1
        if self.bad_steps <= self.patience:
            return
        value = float(loss.detach().float().mean()) if loss is not None else math.nan
        raise NonFiniteLossError(
            f"the training loss is {value} at step {trainer.global_step} (epoch {trainer.current_epoch}"
            + (f", {self.bad_steps} steps in a row" if self.bad_steps > 1 else "")
            + "); the run stopped: lower the learning rate (--model.init_args.lr) or clip gradients "
            "(--trainer.gradient_clip_val)",
            step=trainer.global_step, epoch=trainer.current_epoch, value=value,
        )


class CheckpointOnSignal(Callback):
    """Save a resumable checkpoint when a signal stops training.

    Lightning turns SIGTERM (and, through the CLI, SIGUSR1) into ``SIGTERMException`` at the end
    of the current training batch; this callback then saves ``path`` (atomically, through the
    trainer's checkpoint IO), so ``--ckpt_path path`` resumes from that step. A signal during
    validation or test saves nothing (the loop state there is not a clean resume point): the
    last epoch-end checkpoint is the one to resume from. ``saved`` is the path written, if any;
    ``step`` and ``epoch`` where.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self.saved: str | None = None
        self.step: int | None = None
        self.epoch: int | None = None

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if type(exception).__name__ != "SIGTERMException":
            return
        if not trainer.training or trainer.sanity_checking or trainer.state.fn != "fit":
            return
        trainer.save_checkpoint(self.path)
        self.saved, self.step, self.epoch = self.path, trainer.global_step, trainer.current_epoch

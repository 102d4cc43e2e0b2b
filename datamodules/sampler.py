"""The training order of every modality, resumable mid-epoch: a function of (seed, epoch) and a position.

``ResumableSampler`` draws the order of an epoch from (Lightning global seed, epoch) alone and splits it
across processes itself (rank r of W takes positions r, r + W, ...), so Lightning keeps it under DDP
instead of swapping in its own ``DistributedSampler``. ``ResumableLoader`` is the training ``DataLoader``
whose position, (epoch, samples served), Lightning saves in every checkpoint (the fit loop stores the state
of loaders that have ``state_dict``) and gives back on a mid-epoch restart; the resumed epoch then serves the
batches the interrupted one had not served yet, in the same order, instead of starting the epoch again.

What else decides a step (random draws of the model, of the augmentation) is seeded per step elsewhere
(``lightning_modules.callbacks.ExactResume``, the image datasets' per-batch seeds), so a resumed run trains
on exactly the batches, with exactly the random numbers, of an uninterrupted one.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler


def run_seed() -> int:
    """The Lightning global seed of this run (``seed_everything`` sets ``PL_GLOBAL_SEED``; 0 if unset)."""
    return int(os.environ.get("PL_GLOBAL_SEED", 0))


class ResumableSampler(DistributedSampler):
    """A shuffling sampler whose order depends only on ``(seed, epoch)``, split across ``num_replicas``
    processes, started ``start`` positions into the epoch.

    The order is the one ``torch.utils.data.DistributedSampler`` draws for the same seed and epoch (padded the
    same way to a multiple of the world size), and rank r takes positions ``start + r``, ``start + r + W``,
    ...: the W per-rank batches of step k together hold exactly the samples of step k of a one-process run
    with the same global batch, so one and many processes train on the same global batches. Lightning calls
    ``set_epoch`` before each epoch. ``start`` counts global positions (samples of every rank), so a position
    saved by W processes resumes on any number.

    Args:
        data_source: the dataset to sample from (only its length is used).
        seed: the base seed (the Lightning global seed, ``PL_GLOBAL_SEED``).
        num_replicas: the world size (processes that each take a share); 1 for one process.
        rank: this process's global rank.
    """

    def __init__(self, data_source: Sequence[Any], seed: int = 0, num_replicas: int = 1, rank: int = 0) -> None:
        super().__init__(data_source, num_replicas=num_replicas, rank=rank, shuffle=True, seed=int(seed),
                         drop_last=False)  # fmt: skip
        self.start = 0

    def permutation(self) -> list[int]:
        """The global order of this epoch (unpadded): a function of (seed, epoch) and the dataset length only."""
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(len(self.dataset), generator=generator).tolist()

    def global_order(self) -> list[int]:
        """The order padded to a multiple of the world size (the first indices repeated), as
        ``DistributedSampler`` pads it."""
        order = self.permutation()
        padding = self.total_size - len(order)
        if padding > 0:
            order += (order * math.ceil(padding / len(order)))[:padding]
        return order

    def __iter__(self) -> Iterator[int]:
        order = self.global_order()
        start = min(max(int(self.start), 0), self.total_size)
        return iter(order[start + self.rank : self.total_size : self.num_replicas])


class ResumableLoader(DataLoader):
    """The training ``DataLoader``: it knows how far into the epoch it is, and resumes there.

    Its ``sampler`` must be a ``ResumableSampler``. ``state_dict()`` is ``{"epoch", "samples"}``: the epoch
    being served and the global samples served in it (batches served x batch size x world size; Lightning
    does not prefetch from a loader that has a length, so served is trained on). Lightning saves it in every
    checkpoint and, on a restart in the middle of an epoch, calls ``load_state_dict`` before it asks for
    batches: the next iteration of that epoch starts where the checkpoint stopped.

    Each iteration creates the underlying iterator at its first batch, not when ``iter`` is called:
    Lightning calls ``iter`` before it sets the epoch of the sampler (when it sets up the data, and, on
    a resumed run, before the first epoch), and loader workers take their first indices at creation.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not isinstance(self.sampler, ResumableSampler):
            raise TypeError(f"ResumableLoader needs a ResumableSampler, not {type(self.sampler).__name__}")
        self._resume: tuple[int, int] | None = None
        self._epoch, self._samples = self.sampler.epoch, 0

    def __iter__(self) -> Iterator[Any]:
        return self._serve()

    def _serve(self) -> Iterator[Any]:
        sampler: ResumableSampler = self.sampler  # type: ignore[assignment]
        epoch, start = sampler.epoch, 0
        if self._resume is not None:
            if self._resume[0] == epoch:
                start = self._resume[1]
            self._resume = None
        sampler.start = start
        self._epoch, self._samples = epoch, start
        per_batch = self.batch_size * sampler.num_replicas
        for batch in self._batches():  # created here, at the first batch asked for
            self._samples += per_batch
            yield batch

    def _batches(self) -> Iterator[Any]:
        """The batches of one pass over the sampler (the DataLoader's own iterator; a subclass may serve
        them otherwise, e.g. ``datamodules.images.device_loader``)."""
        return super().__iter__()

    def state_dict(self) -> dict[str, int]:
        return {"epoch": int(self._epoch), "samples": int(self._samples)}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        self._resume = (int(state_dict["epoch"]), int(state_dict["samples"]))

"""Shuffling of the training set: a function of (Lightning global seed, epoch) only."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import RandomSampler


def run_seed() -> int:
    """The Lightning global seed of this run (``seed_everything`` sets ``PL_GLOBAL_SEED``; 0 if unset)."""
    return int(os.environ.get("PL_GLOBAL_SEED", 0))


class SeededRandomSampler(RandomSampler):
    """A ``RandomSampler`` whose permutation depends only on ``(seed, epoch)``.

    Lightning calls ``set_epoch(current_epoch)`` on the train sampler at the start of every epoch, so a run
    resumed from a checkpoint at an epoch boundary draws exactly the order an uninterrupted run draws. It
    subclasses ``RandomSampler`` so that Lightning recognises the loader as shuffled (and swaps in its own
    seeded ``DistributedSampler`` under DDP).

    Args:
        data_source: the dataset to sample from (only its length is used).
        seed: the base seed (the Lightning global seed, ``PL_GLOBAL_SEED``).
    """

    def __init__(self, data_source: Sequence[Any], seed: int = 0) -> None:
        super().__init__(data_source)
        self.seed = int(seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def permutation(self) -> list[int]:
        """The order of this epoch: a function of (seed, epoch) and the dataset length only.

        It is the permutation ``torch.utils.data.DistributedSampler`` draws for the same seed and
        epoch (Lightning seeds that one with ``PL_GLOBAL_SEED`` too). Under DDP rank r takes
        positions r, r + W, r + 2W, ... of it, so the W per-rank batches of step k together hold
        exactly the samples of step k of a one-process run with the same global batch: one and
        many processes train on the same global batches.
        """
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(len(self.data_source), generator=generator).tolist()

    def __iter__(self) -> Iterator[int]:
        yield from self.permutation()

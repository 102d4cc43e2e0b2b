"""Splits and statistics: a function of ``split_seed`` only, never of the training seed.

``split_rows`` draws, from independent random streams of ``split_seed``: the test hold-out (when the source
has no test split), the stratified train/val split and the order in which ``train_samples`` picks a
class-balanced, nested subset. It refuses a setup that leaves a class with no training image (see
``check_every_class_trains``). ``channel_stats`` gives the normalisation of the train split.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

# Independent random streams derived from split_seed, one per purpose.
TEST_STREAM, VAL_STREAM, SUBSET_STREAM, STATS_STREAM = 1, 2, 3, 4


def split_rng(split_seed: int, stream: int) -> np.random.Generator:
    """The random generator of one purpose (``*_STREAM``) for ``split_seed``."""
    return np.random.default_rng(np.random.SeedSequence([split_seed % 2**64, stream]))


def stratified_split(labels: np.ndarray, fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Split positions ``0..len(labels)-1`` into (held out, rest), stratified by label.

    ``round(fraction * N)`` positions are held out in total; each class holds out ``fraction`` of its members
    rounded up or down (largest remainders get the extra ones), so each class's count is within 1 of its share.
    """
    labels = np.asarray(labels)
    classes, counts = np.unique(labels, return_counts=True)
    exact = fraction * counts
    take = np.floor(exact).astype(np.int64)
    extra = int(round(fraction * len(labels))) - int(take.sum())
    if extra > 0:
        # largest fractional parts first; ties broken by a seeded shuffle so no class is always favoured
        tiebreak = rng.permutation(len(classes))
        order = np.lexsort((tiebreak, -(exact - take)))
        take[order[:extra]] += 1
    held, rest = [], []
    for cls, k in zip(classes, take, strict=True):
        members = rng.permutation(np.flatnonzero(labels == cls))
        held.append(members[:k])
        rest.append(members[k:])
    held_idx = np.sort(np.concatenate(held)) if held else np.zeros(0, np.int64)
    rest_idx = np.sort(np.concatenate(rest)) if rest else np.zeros(0, np.int64)
    return held_idx.astype(np.int64), rest_idx.astype(np.int64)


def balanced_subset(
    labels: np.ndarray, n: int, num_classes: int, rng: np.random.Generator, class_names: Sequence[str] | None = None
) -> np.ndarray:
    """Positions of a class-balanced subset of size ``n``, nested in ``n`` for a fixed ``rng`` seed.

    Each class's members are ordered by one seeded permutation and the subset takes a prefix of each: class
    ``k`` gets ``n // K`` plus one if ``k < n % K``. Growing ``n`` by one grows one prefix by one, so the subset
    of size n is contained in the subset of any size m > n.
    """
    labels = np.asarray(labels)
    if n > len(labels):
        raise ValueError(f"train_samples={n} is larger than the train split ({len(labels)} images); lower it")
    out = []
    for k in range(num_classes):
        members = rng.permutation(np.flatnonzero(labels == k))
        want = n // num_classes + (1 if k < n % num_classes else 0)
        if want > len(members):
            name = class_names[k] if class_names is not None else str(k)
            raise ValueError(
                f"train_samples={n} needs {want} images of class {k} ({name!r}) for a balanced subset, but the "
                f"train split has only {len(members)}; lower train_samples (or val_fraction)"
            )
        out.append(members[:want])
    return np.sort(np.concatenate(out)).astype(np.int64) if out else np.zeros(0, np.int64)


def _class_ranges(classes: Sequence[int]) -> str:
    """``[0, 3..5, 9]``: sorted class indices with runs shortened."""
    parts, run = [], []
    for k in sorted(classes):
        if run and k != run[-1] + 1:
            parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}..{run[-1]}")
            run = []
        run.append(k)
    if run:
        parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}..{run[-1]}")
    return f"[{', '.join(parts)}]"


def _counts(labels: np.ndarray, num_classes: int) -> np.ndarray:
    return np.bincount(np.asarray(labels, dtype=np.int64), minlength=num_classes)[:num_classes]


def check_every_class_trains(
    train_labels: np.ndarray,
    num_classes: int,
    train_samples: int | None,
    held_out: str,
    source_labels: np.ndarray | None = None,
    class_names: Sequence[str] | None = None,
) -> None:
    """Raise ValueError when a class would get no training image, naming the setting that causes it.

    ``train_labels`` are the labels of the train split (after the test and val hold-outs, before
    ``train_samples``); ``source_labels`` those of the source's train split (before the hold-outs); ``held_out``
    says what was held out. A class-balanced subset of ``train_samples`` < ``num_classes`` images leaves
    classes ``train_samples..num_classes-1`` without one.
    """
    empty = np.flatnonzero(_counts(train_labels, num_classes) == 0).tolist()
    if empty:
        names = ""
        if class_names is not None:
            more = ", ..." if len(empty) > 5 else ""
            names = " (" + ", ".join(repr(class_names[k]) for k in empty[:5]) + more + ")"
        if source_labels is not None and not _counts(source_labels, num_classes)[empty].any():
            why, fix = "the source's train split has none", "add training images of those classes"
        else:
            why, fix = f"holding out {held_out} took them", "lower those fractions or add images of those classes"
        raise ValueError(
            f"no training image of classes {_class_ranges(empty)}{names} (of {num_classes}): {why}; every class "
            f"needs at least one training image: {fix}"
        )
    if train_samples is not None and train_samples < num_classes:
        raise ValueError(
            f"train_samples={train_samples} leaves classes {_class_ranges(range(train_samples, num_classes))} "
            f"with no training image; use at least {num_classes} (one per class)"
        )


@dataclass(frozen=True)
class SplitRows:
    """Row positions of each split: ``train``/``val``/``subset`` index the train pool; ``test`` indexes the
    test pool, or the train pool when ``test_from_train`` (a held-out test set)."""

    train: np.ndarray  # the train split (the normalisation statistics come from it)
    subset: np.ndarray  # what is trained on: ``train``, or its class-balanced ``train_samples`` subset
    val: np.ndarray
    test: np.ndarray
    test_from_train: bool


def split_rows(
    train_labels: np.ndarray,
    test_labels: np.ndarray | None,
    *,
    val_fraction: float,
    test_fraction: float,
    train_samples: int | None,
    num_classes: int,
    class_names: Sequence[str],
    split_seed: int,
) -> SplitRows:
    """The test (official, or a stratified hold-out), val, train and training-subset rows."""
    if test_labels is None:
        test_rows, pool_rows = stratified_split(train_labels, test_fraction, split_rng(split_seed, TEST_STREAM))
        held_out = f"test_fraction={test_fraction} and val_fraction={val_fraction}"
    else:
        test_rows, pool_rows = np.arange(len(test_labels)), np.arange(len(train_labels))
        held_out = f"val_fraction={val_fraction}"
    held, kept = stratified_split(train_labels[pool_rows], val_fraction, split_rng(split_seed, VAL_STREAM))
    val_rows, train_rows = pool_rows[held], pool_rows[kept]
    check_every_class_trains(train_labels[train_rows], num_classes, train_samples, held_out, train_labels, class_names)
    subset_rows = train_rows
    if train_samples is not None:
        if train_samples > len(train_rows):
            raise ValueError(
                f"train_samples={train_samples} is larger than the train split ({len(train_rows)} images "
                f"after holding out val_fraction={val_fraction}); lower train_samples"
            )
        chosen = balanced_subset(
            train_labels[train_rows], train_samples, num_classes, split_rng(split_seed, SUBSET_STREAM), class_names
        )
        subset_rows = train_rows[chosen]
    return SplitRows(train_rows, subset_rows, val_rows, test_rows, test_from_train=test_labels is None)


def channel_stats(images: torch.Tensor, rows: torch.Tensor, chunk: int = 16384) -> tuple[list[float], list[float]]:
    """Per-channel mean and std of ``images[rows] / 255`` (uint8 N, C, H, W), exact: from each channel's histogram
    of the 256 values (one ``bincount`` per chunk and channel, ~10x faster than summing squares in float64)."""
    channels = images.shape[1]
    counts = torch.zeros(channels, 256, dtype=torch.int64)
    for start in range(0, len(rows), chunk):
        x = images[rows[start : start + chunk]]
        for c in range(channels):
            counts[c] += torch.bincount(x[:, c].reshape(-1), minlength=256)
    total = int(counts[0].sum()) if channels else 0
    if total == 0:
        return [0.5] * channels, [0.5] * channels
    values = torch.arange(256, dtype=torch.float64) / 255.0
    freq = counts.to(torch.float64) / total
    mean = freq @ values
    std = (freq @ values.square() - mean.square()).clamp_min(0).sqrt()
    std = torch.where(std > 1e-6, std, torch.ones_like(std))  # a constant channel: leave its scale alone
    return mean.tolist(), std.tolist()

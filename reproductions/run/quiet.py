"""Lightning's warnings that say nothing to a user of this repository, each silenced by its exact text.

A run prints no warning line by default: what is ours is fixed at its cause (epoch-level metrics are
reduced across processes as they are defined, ``lightning_modules/callbacks.py``; a test or validation
writes no checkpoints), and what is Lightning's and does not apply is listed here, one exact message
pattern each (``re.match`` from the message's start), never a category or a module. ``--debug`` (or
``REPRO_DEBUG=1``) shows everything. ``tests/test_quiet.py`` keeps the list narrow.
"""

from __future__ import annotations

import re
import warnings

from reproductions.run.errors import debug_enabled

ALWAYS = (
    # Lightning's own pytree helper on torch >= 2.6 (lightning/pytorch/utilities/_pytree.py): not our code
    r"`isinstance\(treespec, LeafSpec\)` is deprecated, use `isinstance\(treespec, TreeSpec\) and "
    r"treespec\.is_leaf\(\)` instead",
)
"""Silenced in every subcommand."""

EVALUATION = (
    # test/validate on a training checkpoint: its ModelCheckpoint states are not needed to evaluate
    r"Be aware that when using `ckpt_path`, callbacks used to create the checkpoint need to be provided "
    r"during `Trainer` instantiation\.",
    # the saved weights are already the average (EMAWeightAveraging saves them so): nothing to restore
    r"You're using the WeightAveraging callback, but loading a checkpoint outside the 'fit' stage\.",
)
"""Silenced in ``test`` and ``validate`` only (a resumed ``fit`` needs every callback's state)."""

DISTRIBUTED_EVALUATION = (
    # test after a DDP fit: the padding it warns about is named by the CLI in its own line when there is any
    r"Using `DistributedSampler` with the dataloaders\. During `trainer\.(test|validate)\(\)`, it is recommended "
    r"to use `Trainer\(devices=1, num_nodes=1\)`",
)
"""Silenced where the CLI says itself whether the test set is padded (``ReproductionCLI._after_fit``)."""


def patterns(subcommand: str | None) -> tuple[str, ...]:
    """The message patterns silenced for ``subcommand``."""
    return ALWAYS + DISTRIBUTED_EVALUATION + (EVALUATION if subcommand in ("test", "validate") else ())


def silence_lightning_noise(subcommand: str | None) -> None:
    """Install the filters of ``patterns(subcommand)``, unless debugging (``--debug``: every warning shown)."""
    if debug_enabled():
        return
    for pattern in patterns(subcommand):
        warnings.filterwarnings("ignore", message=pattern)


def is_silenced(message: str, subcommand: str | None) -> bool:
    """Whether ``message`` would be silenced in ``subcommand`` (for the tests)."""
    return any(re.match(p, message, re.I) for p in patterns(subcommand))

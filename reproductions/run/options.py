"""The ``run`` group of every command's config (``--run.*``): where a run writes, how it is named and
how it reports. ``ReproductionCLI`` (``reproductions/run/cli.py``) adds it to the parser."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class RunOptions:
    """Where a run writes, how it is named and how it reports.

    Args:
        root: directory that holds all runs.
        experiment: experiment name, the first level under ``root``; default: the config
            file's path under reproductions/ without ``configs/`` and the suffix
            (``reproductions/vit/configs/digits.yaml`` -> ``vit/digits``).
        variant: the ablation variant (a sweep sets it, e.g. ``pos_embed=learned_2d``).
        wandb: also log to Weights & Biases. Runs offline (files under the run directory,
            ``wandb sync`` later) unless an API key is configured or WANDB_MODE says otherwise.
        project: W&B project.
        group: W&B group; default: the experiment name, so a sweep's runs group together.
        tags: extra W&B tags; the experiment and variant are always added.
        log_model: at the end of a finished fit, log the last and the best checkpoint to W&B
            as one model artifact (aliases ``last``, ``best``, the variant and the seed). Offline
            runs keep it with the run and upload it on ``wandb sync``. Needs ``wandb: true``.
        test_after_fit: after ``fit``, evaluate on the test split and write results.json.
        test_ckpt: which weights the test after fit uses: ``final`` (the weights at the end
            of training) or ``best`` (the checkpoint with the best monitored validation metric).
        overwrite: let ``fit`` replace a finished run in its run directory (results.json says
            finished). Without it such a fit refuses; resuming the run's own checkpoint
            (``--ckpt_path <run dir>/checkpoints/last.ckpt``) needs no overwrite.
        nonfinite_patience: training steps in a row with a NaN or infinite loss tolerated before
            the run stops as failed (0: stop at the first).
        rendezvous_timeout: seconds a multi-process run waits for all its processes to join at the
            start (DDP, FSDP, several nodes) before it fails naming who is missing.
    """

    root: str = "runs"
    experiment: str | None = None
    variant: str = "default"
    wandb: bool = False
    project: str = "attention-repro"
    group: str | None = None
    tags: list[str] = field(default_factory=list)
    log_model: bool = False
    test_after_fit: bool = True
    test_ckpt: Literal["final", "best"] = "final"
    overwrite: bool = False
    nonfinite_patience: int = 0
    rendezvous_timeout: float = 60.0

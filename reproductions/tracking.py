"""Weights & Biases: whether to run offline, and what a run and a report put into W&B."""

from __future__ import annotations

import os
from pathlib import Path


def wandb_offline() -> bool:
    """Offline unless the user has a W&B key (env or netrc) or chose a mode via WANDB_MODE."""
    mode = os.environ.get("WANDB_MODE")
    if mode:
        return mode in ("offline", "dryrun")
    if os.environ.get("WANDB_API_KEY"):
        return False
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        return "api.wandb.ai" not in netrc.read_text()
    except OSError:
        return True

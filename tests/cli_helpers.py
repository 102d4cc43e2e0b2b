"""The repository's command line in a subprocess, the way the tests run it: from the repository root,
offline, one thread, no GPU, nothing of the caller's debug, SLURM or W&B settings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def cli_env(**extra: str | None) -> dict[str, str]:
    """The environment of a test's ``repro`` subprocess: this one's, without ``REPRO_DEBUG``, ``SLURM_*``
    and ``WANDB_*``, with the repository importable, one thread, no GPU, W&B and the Hugging Face hub
    offline and unbuffered output; then ``extra`` (a value None removes the variable)."""
    env = {k: v for k, v in os.environ.items()
           if k != "REPRO_DEBUG" and not k.startswith(("SLURM_", "WANDB_"))}  # fmt: skip
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", WANDB_MODE="offline", HF_HUB_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")  # fmt: skip
    env.update(extra)
    return {k: v for k, v in env.items() if v is not None}


def run_repro(*args: str, env: dict[str, str] | None = None, timeout: float = 600, merge: bool = False,
              **kwargs) -> subprocess.CompletedProcess:
    """``python -m reproductions ARGS`` from the repository root with ``env`` (default ``cli_env()``),
    its output as text: stdout and stderr apart, or together in stdout with ``merge``."""
    streams = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT) if merge else dict(capture_output=True)
    return subprocess.run([sys.executable, "-m", "reproductions", *args], cwd=REPO, env=env or cli_env(),
                          text=True, timeout=timeout, **streams, **kwargs)  # fmt: skip

"""What ``--ckpt_path`` names, decided before anything in a run directory is touched.

- a file: it must exist and load as a checkpoint of this repository (weights only), else one
  ``error:`` line (``read_checkpoint``);
- ``last`` / ``best``: this run directory's ``checkpoints/last.ckpt`` / its one ``best-*.ckpt``; a
  missing one is an error, never "no checkpoint" (Lightning would test or validate random weights
  with a warning) (``keyword_checkpoint``);
- which checkpoint ``fit`` resumes: ``--ckpt_path`` inside the run directory, or under SLURM
  Lightning's newest ``hpc_ckpt_*.ckpt`` (``resume_point``); a checkpoint of another run starts
  this one from its weights and state without continuing that run's directory;
- the model it fixes: ``merge_model`` refuses a config that gives the model differently
  (reproductions/run/model_check.py) and takes what the config leaves unset from the checkpoint.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from lightning_modules.checkpoint_io import CheckpointError, checkpoint_step
from lightning_modules.checkpoint_io import load_checkpoint as load_user_checkpoint
from reproductions.run.errors import RunFailed, UsageError, parser_error
from reproductions.run.model_check import model_differences, refusal, runtime_settings

#: values of ``--ckpt_path`` that Lightning resolves itself (or that name this run directory's files)
KEYWORDS = ("last", "best", "hpc", "registry")


def read_checkpoint(path, *, what: str = "--ckpt_path", error: type[Exception] = UsageError) -> dict:
    """The checkpoint at ``path`` (memory-mapped), or ``error`` with the one line saying why not."""
    try:
        return load_user_checkpoint(path, what=what, mmap=True)
    except CheckpointError as e:
        raise error(str(e)) from e


def is_keyword(ckpt_path) -> bool:
    return str(ckpt_path) in KEYWORDS or str(ckpt_path).startswith("registry:")


def keyword_checkpoint(keyword: str, run_dir: Path) -> Path:
    """The file ``--ckpt_path last`` / ``best`` names in ``run_dir``."""
    folder = Path(run_dir) / "checkpoints"
    found = [folder / "last.ckpt"] if keyword == "last" else sorted(folder.glob("best-*.ckpt"))
    found = [p for p in found if p.is_file()]
    if len(found) != 1:
        what = "no" if not found else f"{len(found)}"
        raise UsageError(f"--ckpt_path {keyword}: {what} {keyword} checkpoint in {folder}; give a checkpoint "
                         "file, or the --config/--run.* options of the run that wrote it")
    return found[0]


def hpc_checkpoint(run_dir: Path) -> Path | None:
    """Lightning's newest SLURM requeue checkpoint in ``run_dir``, if any."""
    hpc = sorted(Path(run_dir).glob("hpc_ckpt_*.ckpt"), key=lambda p: int(re.sub(r"\D", "", p.stem) or 0))
    return hpc[-1] if hpc else None


def in_run_dir(ckpt_path, run_dir: Path) -> bool:
    """Whether ``ckpt_path`` is a file path inside ``run_dir``: fit resumes that run exactly (a
    checkpoint elsewhere is another run's, whose weights start this one afresh)."""
    try:
        Path(ckpt_path).resolve().relative_to(Path(run_dir).resolve())
    except ValueError:
        return False
    return True


def resume_point(ckpt_path, run_dir: Path, *, requeued: bool) -> tuple[Path | None, int | None]:
    """``(checkpoint fit resumes in run_dir, its logging step)``; ``(None, None)`` for a fresh run
    (no checkpoint, or another run's). ``requeued``: a SLURM job, which resumes its hpc checkpoint."""
    step = None
    if ckpt_path is None and requeued:
        hpc = hpc_checkpoint(run_dir)
        if hpc is not None:
            step = checkpoint_step(read_checkpoint(hpc, what="hpc checkpoint", error=RunFailed))
            ckpt_path = str(hpc)
    if not ckpt_path or not Path(ckpt_path).is_file():
        return None, None
    if not in_run_dir(ckpt_path, run_dir):
        return None, None  # another run's checkpoint: this one starts fresh from it
    if step is None:
        step = checkpoint_step(read_checkpoint(ckpt_path))
    return Path(ckpt_path), step


def checkpoint_epochs(checkpoint: dict) -> int | None:
    """The epochs a training checkpoint has trained (every training batch run; a checkpoint taken at an epoch's
    end counts that epoch), None if it does not say."""
    try:
        current = checkpoint["loops"]["fit_loop"]["epoch_progress"]["current"]
        return int(max(current["processed"], current["completed"]))
    except (KeyError, TypeError, ValueError):
        epoch = checkpoint.get("epoch") if isinstance(checkpoint, dict) else None
        return int(epoch) if isinstance(epoch, int) else None


def check_max_epochs(ckpt_path, checkpoint: dict | None, max_epochs) -> None:
    """A fit from ``checkpoint`` with ``--trainer.max_epochs`` below the epochs it has done cannot continue:
    refused (UsageError) before anything is touched, naming both numbers (Lightning would stop with a
    MisconfigurationException after the run had started)."""
    if not ckpt_path or checkpoint is None or max_epochs is None or max_epochs == -1:
        return
    done = checkpoint_epochs(checkpoint)
    if done is not None and done > max_epochs:
        raise UsageError(f"--trainer.max_epochs {max_epochs} is below the {done} epochs --ckpt_path {ckpt_path} has "
                         f"already trained; give --trainer.max_epochs {done} or more to continue it (or leave out "
                         "--ckpt_path to start afresh)")


def merge_model(parser, config, subcommand: str, ckpt_path, checkpoint: dict):
    """``config`` with the checkpoint's model: refused (UsageError) if the config gives any model setting
    differently; what the config leaves unset is taken from the checkpoint (Lightning's rule), except the
    runtime settings (``model_check.RUNTIME_HPARAMS``: compile, channels_last, test-time augmentation), which
    are the config's."""
    hparams = dict(checkpoint.get("hyper_parameters") or {})
    hparams.pop("_instantiator", None)
    if not hparams:
        return config
    differences = model_differences(config[subcommand].get("model"), hparams, subcommand)
    if differences:
        raise UsageError(refusal(differences, ckpt_path, subcommand))
    hparams.update(runtime_settings(config[subcommand].get("model")))
    if "_class_path" in hparams:
        hparams = {"class_path": hparams.pop("_class_path"), "dict_kwargs": hparams}
    try:
        return parser.parse_object({subcommand: {"model": hparams}}, config)
    except (argparse.ArgumentError, SystemExit) as e:
        raise UsageError(f"--ckpt_path {ckpt_path}: its model hyper-parameters do not fit this config "
                         f"({parser_error(e)}); give a checkpoint of this experiment") from e

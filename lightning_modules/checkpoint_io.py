"""Checkpoints written atomically and read without running pickled code.

- ``AtomicCheckpointIO``: Lightning's ``TorchCheckpointIO`` that writes every checkpoint to a
  temporary sibling, fsyncs it and renames it over the target (``utils.atomic``), so a crash, a
  signal or a full disk leaves the previous checkpoint and no half-written file; it reads with
  ``weights_only=True`` and this repository's allow-list (``SAFE_GLOBALS``).
- ``load_checkpoint(path)``: a checkpoint named by a user, read the same safe way, with one clear
  message for each way it can be wrong (``CheckpointError``): no such file, not a checkpoint (a
  text file, a truncated file), or a pickle that asks for code (``os.system`` in a
  ``__reduce__``): ``torch.load(weights_only=True)`` refuses to import anything that is not on
  the allow-list, so nothing in the file runs.
- ``slim_checkpoint(src, dst)``: the weights and what rebuilds the model from a checkpoint
  (``SLIM_KEYS``), without the optimiser, loop and callback states: a checkpoint to ship or share
  for evaluation and analysis (``repro test``, ``repro analyze``), a third of a training one.
"""

from __future__ import annotations

import contextlib
import io
import os
import pathlib
import pickle
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.fabric.utilities.data import AttributeDict

from utils.atomic import atomic_write

#: what a Lightning checkpoint of this repository may hold besides tensors and plain containers
#: (torch's weights-only unpickler already allows those, OrderedDict, torch dtypes and devices)
SAFE_GLOBALS: list[Any] = [AttributeDict, pathlib.PosixPath, pathlib.PurePosixPath]


class CheckpointError(ValueError):
    """A file given as a checkpoint that cannot be used; the message says why and what to do."""


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (the previous one, if any, is intact)."""


@contextlib.contextmanager
def safe_globals() -> Iterator[None]:
    """Allow ``SAFE_GLOBALS`` in ``torch.load(weights_only=True)`` within the block."""
    with torch.serialization.safe_globals(SAFE_GLOBALS):
        yield


def _unsafe_global(error: BaseException) -> Optional[str]:
    """The global a refused pickle asked for (``posix.system``), if the error names one."""
    match = re.search(r"[Uu]nsupported(?: global:)? GLOBAL ([\w.]+)", str(error))
    if match:
        return match.group(1)
    match = re.search(r"(?:Trying to call reduce for|Unsupported class) ([\w.]+)", str(error))
    return match.group(1) if match else None


def _reason(path: Path, error: BaseException) -> str:
    if not zipfile.is_zipfile(path):
        size = path.stat().st_size
        return f"its {size} bytes are not a complete torch.save archive"
    text = " ".join(str(error).split())[:160] or type(error).__name__
    return f"a damaged or truncated archive: {type(error).__name__}: {text}"


def load_checkpoint(path: str | os.PathLike, *, what: str = "checkpoint", map_location: Any = "cpu",
                    mmap: bool = False) -> dict:
    """The checkpoint at ``path``, loaded with ``weights_only=True``; CheckpointError if unusable.

    ``what`` names it in messages (``--ckpt_path``, ``--ckpt``). ``mmap=True`` maps the tensors
    instead of reading them (a quick check of a large file).
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{what} {str(path)!r}: no such file; runs keep theirs in <run dir>/checkpoints/last.ckpt")
    if path.is_dir():
        raise CheckpointError(f"{what} {str(path)!r} is a directory; give a .ckpt file (e.g. {path}/checkpoints/last.ckpt)")
    mmap = mmap and zipfile.is_zipfile(path)  # torch.save's archive format; anything else is read whole
    try:
        with safe_globals():
            checkpoint = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        name = _unsafe_global(e)
        if name is not None:
            raise CheckpointError(
                f"{what} {str(path)!r} was refused: it asks to import {name}, which no checkpoint of this "
                "repository holds, so it was not loaded (nothing in it ran); use checkpoints you trust"
            ) from e
        raise CheckpointError(f"{what} {str(path)!r} is not a checkpoint ({_reason(path, e)}); give a .ckpt file "
                              "written by a run (<run dir>/checkpoints/last.ckpt)") from e
    except Exception as e:  # noqa: BLE001 - a text file read as a pickle fails in any way (IndexError, ...)
        raise CheckpointError(f"{what} {str(path)!r} is not a checkpoint ({_reason(path, e)}); give a .ckpt file "
                              "written by a run (<run dir>/checkpoints/last.ckpt)") from e
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        kind = type(checkpoint).__name__
        raise CheckpointError(f"{what} {str(path)!r} holds a {kind} without a 'state_dict': not a Lightning checkpoint "
                              "of this repository (<run dir>/checkpoints/last.ckpt)")
    return checkpoint


#: what a slim checkpoint keeps: the weights, the model's and the data's arguments, and where
#: in training the weights come from
SLIM_KEYS = ("state_dict", "hyper_parameters", "hparams_name", "datamodule_hyper_parameters",
             "datamodule_hparams_name", "pytorch-lightning_version", "epoch", "global_step")


def slim_checkpoint(src: str | os.PathLike, dst: str | os.PathLike) -> dict:
    """Write ``src``'s ``SLIM_KEYS`` to ``dst`` (atomically) and return them. The result loads like
    any checkpoint for ``test``/``validate``/``predict`` and the analyses, but cannot resume training."""
    checkpoint = load_checkpoint(src)
    slim = {key: checkpoint[key] for key in SLIM_KEYS if key in checkpoint}
    atomic_write(dst, lambda f: torch.save(slim, f), binary=True)
    return slim


def checkpoint_step(checkpoint: dict) -> int:
    """The logging step a run resumed from ``checkpoint`` continues at (the batches that stepped)."""
    loops = checkpoint.get("loops") or {}
    epoch_loop = (loops.get("fit_loop") or {}).get("epoch_loop.state_dict") or {}
    step = epoch_loop.get("_batches_that_stepped")
    return int(step if step is not None else checkpoint.get("global_step", 0))


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` with atomic writes and weights-only reads (see the module docstring)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Optional[Any] = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        # serialised in memory first (as Lightning's own writer does): a failing write then raises
        # the OSError itself (torch's zip writer would turn it into an opaque RuntimeError)
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        try:
            atomic_write(path, lambda f: f.write(buffer.getbuffer()), binary=True)
        except OSError as e:
            reason = e.strerror or str(e)
            error = CheckpointWriteError(
                f"could not write the checkpoint {path} ({reason}); nothing half-written was left and the previous "
                "checkpoint is intact; free disk space (or raise the file size limit) and resume from it"
            )
            error.errno = e.errno
            raise error from e

    def load_checkpoint(self, path, map_location: Optional[Callable] = lambda storage, loc: storage,
                        weights_only: Optional[bool] = None) -> dict[str, Any]:
        if weights_only is False:  # asked for explicitly: the caller trusts the file
            return super().load_checkpoint(path, map_location=map_location, weights_only=False)
        with safe_globals():
            return super().load_checkpoint(path, map_location=map_location, weights_only=True)

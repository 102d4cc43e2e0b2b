"""The config of a run: how the command line is parsed and how the resolved config is kept.

- ``count_limits_as_ints``: ``--trainer.limit_val_batches 1`` is one batch (an int), not all of
  them (1.0), as Lightning documents;
- ``SaveAndLogConfig``: the resolved config.yaml written atomically by the first process, and the
  same tree (once, plus the run's facts) as the W&B run config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Union, get_args

from lightning import LightningModule, Trainer
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import WandbLogger

from reproductions.run.tracking import run_facts
from utils.atomic import atomic_write_text


class SaveAndLogConfig(SaveConfigCallback):
    """Save the resolved config.yaml atomically (rank zero) and send it to W&B as the run config."""

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self.already_saved:
            return
        log_dir = trainer.log_dir if self.save_to_log_dir else None  # every rank: it broadcasts
        if trainer.is_global_zero:
            if log_dir is not None:
                atomic_write_text(Path(log_dir) / self.config_filename, self.parser.dump(self.config, skip_none=False))
            self.save_config(trainer, pl_module, stage)
        self.already_saved = True

    def save_config(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """The W&B run config: the resolved tree once, plus the run's ``facts`` (code, hardware)."""
        loggers = [logger for logger in trainer.loggers if isinstance(logger, WandbLogger)]
        if not loggers:
            return
        config = self.config.clone()
        config.pop("config", None)
        tree = {**config.as_dict(), "facts": run_facts(trainer)}
        for logger in loggers:
            if hasattr(logger, "log_config"):
                logger.log_config(tree)  # Lightning's flat copy of the module's hparams is left out
            else:
                logger.log_hyperparams(tree)


#: Trainer arguments where Lightning reads an int as a number of batches and a float as a fraction
COUNT_OR_FRACTION = ("limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches",
                     "overfit_batches", "val_check_interval")


def count_limits_as_ints(parser) -> None:
    """Make ``--trainer.limit_val_batches 1`` the int 1 (one batch), not 1.0 (all batches).

    Lightning types these ``Optional[Union[int, float]]``, but Python's typing cache can hand
    jsonargparse the same union as ``Union[float, int, None]`` (``Union[int, float]`` and
    ``Union[float, int]`` are equal, so a cached one is reused), and jsonargparse tries the
    subtypes in order and turns 1 into 1.0. The parser's type hints are rebuilt with int first.
    """
    for action in getattr(parser, "_actions", []):
        dest = getattr(action, "dest", "")
        if dest.rpartition(".")[2] not in COUNT_OR_FRACTION or not dest.startswith("trainer."):
            continue
        hint = getattr(action, "_typehint", None)
        args = get_args(hint)
        if int in args and float in args and args.index(float) < args.index(int):
            new = (int, float, *[a for a in args if a not in (int, float)])
            rebuilt = Union[new]
            if get_args(rebuilt)[:2] == (int, float):
                action._typehint = rebuilt

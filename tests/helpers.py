"""Callbacks that tests attach through the CLI (``--trainer.callbacks+=tests.helpers.X``)."""

from __future__ import annotations

import contextlib
import io
import json
import traceback
from pathlib import Path

from lightning import Callback


class RecordShards(Callback):
    """Write, per rank, the sample indices its train sampler yields in epoch 0 and its batch size."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = out_dir

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if trainer.current_epoch != 0:
            return
        loader = trainer.train_dataloader
        indices = [int(i) for i in loader.sampler]
        record = {"rank": trainer.global_rank, "world_size": trainer.world_size,
                  "batch_size": loader.batch_size, "indices": indices}
        path = Path(self.out_dir) / f"shard_rank{trainer.global_rank}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record))


class FailAtStep(Callback):
    """Raise in the middle of training, as a crash would."""

    def __init__(self, step: int = 2) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step >= self.step:
            raise RuntimeError(f"injected failure at step {trainer.global_step}")


def inprocess_runner(run, env) -> int:
    """A sweep runner: ``python -m reproductions <args>`` in this process (the sweep's default is a subprocess)."""
    run.run_dir.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    rc = 0
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            from reproductions.cli import main as cli_main

            cli_main(run.args)
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) and e.code else 1
    except Exception:
        buf.write(traceback.format_exc())
        rc = 1
    run.log_path.write_text(buf.getvalue())
    return rc

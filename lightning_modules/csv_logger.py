"""A CSVLogger whose ``metrics.csv`` survives a resume.

Lightning's CSVLogger deletes ``metrics.csv`` when it starts writing into a directory that is not
empty, so a run killed and resumed from ``last.ckpt`` would lose every row from before the
restart. ``ResumableCSVLogger(resume_step=k)`` keeps the rows logged before the checkpoint
instead: those with ``step < k``, where ``k`` is the checkpoint's logging step (the batches that
stepped the optimiser, ``checkpoint_io.checkpoint_step``). The resumed run logs from step ``k``
on, so nothing is duplicated: rows that the first attempt logged after its checkpoint (and that
the resumed run logs again) are dropped. The kept rows are rewritten atomically before the first
new row is appended. Without ``resume_step`` it starts a fresh file, as Lightning's does, but warns
only when there is an earlier ``metrics.csv`` to delete (Lightning warns that "previous log files
will be deleted" whenever the directory holds any file: the run lock, the saved config).
"""

from __future__ import annotations

import csv
import io
import os
from typing import Optional

from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_warn

from utils.atomic import atomic_write_text


def kept_rows(path: str, resume_step: int) -> tuple[list[str], list[dict[str, str]]]:
    """The header and the rows of the CSV file ``path`` logged before ``resume_step``."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        header = list(reader.fieldnames or [])
        rows = []
        for row in reader:
            try:
                step = int(float(row.get("step") or 0))
            except ValueError:
                continue
            if step < resume_step:
                rows.append(row)
    return header, rows


class _ResumingWriter(ExperimentWriter):
    def __init__(self, log_dir: str, resume_step: Optional[int]) -> None:
        self._resume_step = resume_step
        self.kept = 0
        super().__init__(log_dir)

    def _check_log_dir_exists(self) -> None:
        path = self.metrics_file_path
        if not os.path.isfile(path):
            return  # nothing would be deleted: no warning (Lightning warns whenever the directory holds any file)
        if self._resume_step is None:
            rank_zero_warn(f"{path} of an earlier attempt is replaced: this run starts afresh in {self.log_dir}")
            os.remove(path)
            return
        header, rows = kept_rows(path, self._resume_step)
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=header, lineterminator="\r\n")
        writer.writeheader()
        writer.writerows(rows)
        atomic_write_text(path, buffer.getvalue())
        self.metrics_keys = list(header)
        self.kept = len(rows)


class ResumableCSVLogger(CSVLogger):
    """``CSVLogger`` that, given ``resume_step``, keeps the earlier rows of ``metrics.csv`` (see the module).

    It also flushes its rows to disk whenever a checkpoint is saved (Lightning's flushes every
    100 steps), so the file holds every row logged before any checkpoint a run may resume from.
    """

    def __init__(self, *args, resume_step: Optional[int] = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.resume_step = resume_step

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is not None:
            return self._experiment
        self._fs.makedirs(self.root_dir, exist_ok=True)
        self._experiment = _ResumingWriter(log_dir=self.log_dir, resume_step=self.resume_step)
        return self._experiment

    def after_save_checkpoint(self, checkpoint_callback) -> None:
        super().after_save_checkpoint(checkpoint_callback)
        self.save()

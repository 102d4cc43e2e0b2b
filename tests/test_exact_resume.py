"""A run stopped by a signal in the middle of an epoch and resumed from its checkpoint is the uninterrupted run.

Through the real command line (``python -m reproductions fit`` in a subprocess, tiny configs): one run
goes straight through; another is stopped by SIGTERM or SIGUSR1 when a chosen training step ends, in
the middle of an epoch (``tests.resume_helpers.SignalAtStep``), and resumed with ``--ckpt_path``
``last.ckpt``. Every per-step ``train/loss`` after the stop, the final validation metrics and the test
metrics must be equal (exactly: same hardware, same software) -- for one process with loader workers,
for two DDP processes on the CPU (gloo), and for the behaviour data. Dropout, stochastic depth and
augmentation are on, so the random streams are checked as well as the data order and position.
Not restored: the training means of the epoch that was stopped in (``train/loss_epoch``, ``train/acc``)
cover only its steps after the resume, so they are compared only when a later epoch follows.

Set ``REPRO_FAULTS_LOG=<file>`` to append each run's (exit status, seconds, last line) as JSON lines.
"""

from __future__ import annotations

import pytest

from tests.cli_helpers import DIGITS
from tests.resume_helpers import BST, BST_TINY, DDP, VIT, stop_and_resume


@pytest.mark.subprocess
@pytest.mark.slow
def test_sigterm_mid_epoch_one_process_with_loader_workers_resumes_exactly(tmp_path):
    # step 8 = the 3rd batch of epoch 1; two workers per loader: their random draws are seeded per batch
    stop_and_resume(tmp_path, DIGITS, [*VIT, "--data.num_workers", "2"], step=8, signame="SIGTERM",
                    steps_per_epoch=6, total_steps=18)


@pytest.mark.distributed
@pytest.mark.subprocess
@pytest.mark.slow
def test_sigterm_mid_epoch_two_ddp_processes_resume_exactly(tmp_path):
    # each rank's share of the global batch 64, its own random streams, the position saved by rank 0
    # every rank gets SIGTERM, as a scheduler sends it: all stop at the same step (no collective in a handler)
    stop_and_resume(tmp_path, DIGITS, [*VIT, *DDP], step=10, signame="SIGTERM", steps_per_epoch=6, total_steps=18)


@pytest.mark.subprocess
@pytest.mark.slow
def test_sigusr1_mid_epoch_behaviour_data_resumes_exactly(tmp_path):
    # the behaviour loader shuffled from the global generator before; validation runs inside the epoch too
    stop_and_resume(tmp_path, BST, BST_TINY, step=5, signame="SIGUSR1", steps_per_epoch=8, total_steps=16)


@pytest.mark.distributed
@pytest.mark.subprocess
@pytest.mark.slow
def test_sigusr1_mid_epoch_two_ddp_processes_behaviour_data_resume_exactly(tmp_path):
    # only rank 0 gets it (kill of the command a user started): the others learn of it at the same step
    stop_and_resume(tmp_path, BST, [*BST_TINY, *DDP], step=11, signame="SIGUSR1", steps_per_epoch=8,
                    total_steps=16, ranks="first")

"""utils.process: a recorded process counts as running only while the same process runs."""

from __future__ import annotations

import os
import subprocess
import sys

from utils.process import boot_id, process_alive, process_start


def test_this_process_runs_and_a_recycled_or_gone_pid_does_not():
    me, start = os.getpid(), process_start(os.getpid())
    assert isinstance(start, int) and process_alive(me) and process_alive(me, start=start, boot=boot_id())
    assert process_alive(me, start=str(start))  # a record that kept it as text
    assert not process_alive(me, start=start + 1)  # the pid now belongs to a process started later
    assert not process_alive(me, boot="another-boot") or boot_id() is None  # recorded before a restart
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert not process_alive(int(done.stdout))  # exited (and reaped)

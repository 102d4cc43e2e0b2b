"""Starting a multi-process run: refuse what cannot start, bound the wait for the others, stay stoppable.

A DDP / FSDP run starts by a rendezvous: every process connects to the main one
(``MASTER_ADDR:MASTER_PORT``) and waits until all ``num_nodes x devices`` have joined. Left to
PyTorch, a process whose partners never come waits 30 minutes in C++ (the process-group timeout),
and a signal cannot stop it: Python runs signal handlers only between bytecodes. Three rules:

- ``check_launch``: a run over several nodes needs something that starts a process on every
  node (torchrun, SLURM's srun, MPI, or ``NODE_RANK``/``MASTER_ADDR`` set by hand on each). With
  none of them this command would start node 0 only and wait for nodes that nobody starts: it is
  refused at once, before any process is started.
- ``bound_rendezvous``: the wait for the other processes lasts at most ``timeout_s`` seconds
  (``--run.rendezvous_timeout``, default 60), then fails with one line saying how many joined,
  where, and how to launch the rest. Once every process has joined, the process group gets back
  the strategy's own timeout for its collectives (a long checkpoint write on rank 0 must not time
  out the others after a minute).
- While the processes wait, SIGTERM, SIGINT and SIGUSR1 are seen by a helper thread (through
  ``signal.set_wakeup_fd``) instead of the blocked main thread: the run's lock is released, the
  processes this one started are stopped, one line is printed, and the process exits with
  128 + the signal number.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from contextlib import contextmanager
from datetime import timedelta
from typing import Callable, Iterator

from reproductions.run.errors import RunFailed, UsageError

#: environment variables by which a launcher (or a user, by hand) places this process in a multi-node job
NODE_PLACEMENT = ("NODE_RANK", "MASTER_ADDR")
#: the signals that stop a waiting rendezvous
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)

LAUNCH_HOWTO = ("start one copy of this command per node: `torchrun --nnodes N --node-rank K --nproc-per-node D "
                "--master-addr HOST --master-port PORT -m reproductions ...`, or `srun` in a SLURM job (`sweep "
                "--launcher slurm`), or set NODE_RANK=K and MASTER_ADDR=HOST on every node")


def _is_distributed(strategy) -> bool:
    return hasattr(strategy, "setup_distributed") and hasattr(strategy, "cluster_environment")


def check_launch(trainer) -> None:
    """Refuse a run over several nodes that nothing launches on the other nodes (before any process starts)."""
    num_nodes = int(getattr(trainer, "num_nodes", 1) or 1)
    if num_nodes <= 1 or not _is_distributed(trainer.strategy):
        return
    environment = trainer.strategy.cluster_environment
    if environment is None or type(environment).__name__ != "LightningEnvironment":
        return  # torchrun, SLURM, MPI, LSF, Kubeflow: the launcher placed this process
    if any(os.environ.get(var) for var in NODE_PLACEMENT):
        return  # placed by hand: NODE_RANK / MASTER_ADDR name this node and the main one
    raise UsageError(
        f"--trainer.num_nodes {num_nodes}: nothing launches the other {num_nodes - 1} node(s): this command starts "
        f"the processes of one node and would wait for the rest forever (no torchrun, SLURM or MPI environment; "
        f"{' and '.join(NODE_PLACEMENT)} are unset); {LAUNCH_HOWTO}; or train on this machine with "
        "--trainer.num_nodes 1"
    )


def _set_timeout(timeout: timedelta) -> None:
    """The default process group's (and its store's) timeout, on every PyTorch version this runs on."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    setter = getattr(dist, "set_timeout", None) or distributed_c10d._set_pg_timeout
    setter(timeout)
    store = distributed_c10d._get_default_store() if hasattr(distributed_c10d, "_get_default_store") else None
    if store is not None and hasattr(store, "set_timeout"):
        store.set_timeout(timeout)


def _joined_text(error: BaseException) -> str:
    """``1 of 2 processes joined`` from PyTorch's store error, if it says."""
    import re

    m = re.search(r"(\d+)/(\d+) clients joined", str(error))
    return f"; {m.group(1)} of {m.group(2)} processes joined" if m else ""


def _is_rendezvous_timeout(error: BaseException) -> bool:
    text = str(error).lower()
    return type(error).__name__ in ("DistStoreError", "DistNetworkError") or "timed out" in text or "timeout" in text


@contextmanager
def signals_stop_waiting(on_signal: Callable[[int], None]) -> Iterator[None]:
    """Within the block, a stop signal calls ``on_signal(signum)`` in a helper thread (which must end the
    process), even while the main thread is blocked in C++ (a rendezvous).

    Python's C-level handler, in whichever thread the kernel picks, writes the signal's number to the
    wakeup fd (``signal.set_wakeup_fd``); the helper thread reads it. The Python-level handlers stay as
    they are (they would run only once the blocking call returns)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    try:
        previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except (ValueError, OSError):
        os.close(read_fd)
        os.close(write_fd)
        yield
        return
    done = threading.Event()
    stop = {int(s) for s in STOP_SIGNALS}

    def watch() -> None:
        while not done.is_set():
            try:
                data = os.read(read_fd, 64)
            except OSError:
                return
            if not data or done.is_set():
                return
            for signum in data:
                if signum in stop:
                    on_signal(signum)
                    return

    watcher = threading.Thread(target=watch, name="rendezvous-signals", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        signal.set_wakeup_fd(previous)
        try:
            os.write(write_fd, b"\0")  # wakes the watcher, which sees done and returns
        except OSError:
            pass
        watcher.join(timeout=5)
        os.close(read_fd)
        os.close(write_fd)


def bound_rendezvous(strategy, timeout_s: float, *, on_signal: Callable[[int], None]) -> None:
    """Wrap ``strategy.setup_distributed`` (the rendezvous) by the rules of the module docstring."""
    if not _is_distributed(strategy) or getattr(strategy, "_bounded_rendezvous", False):
        return
    original = strategy.setup_distributed

    def setup_distributed() -> None:
        configured = getattr(strategy, "_timeout", None)
        strategy._timeout = timedelta(seconds=timeout_s)
        try:
            with signals_stop_waiting(on_signal):
                original()
        except Exception as e:  # noqa: BLE001 - PyTorch's store/network errors have no common base
            if not _is_rendezvous_timeout(e):
                raise
            env = strategy.cluster_environment
            where = f"{getattr(env, 'main_address', '?')}:{getattr(env, 'main_port', '?')}"
            raise RunFailed(
                f"the distributed start timed out after {timeout_s:g} s waiting for the other processes at {where}"
                f"{_joined_text(e)} (this is process {strategy.global_rank} of {strategy.world_size}, node "
                f"{strategy.node_rank} of --trainer.num_nodes {strategy.num_nodes}); start every node's processes "
                f"({LAUNCH_HOWTO}), or wait longer with --run.rendezvous_timeout SECONDS"
            ) from e
        finally:
            strategy._timeout = configured
        if configured is not None:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                _set_timeout(configured)

    strategy.setup_distributed = setup_distributed
    strategy._bounded_rendezvous = True


def exit_on_signal(signum: int, *, release: Callable[[], None], children=(), say: bool = True) -> None:
    """What ``bound_rendezvous``'s ``on_signal`` does: release the lock, stop the started processes,
    one line (``say``: the first process; the others exit quietly), exit 128 + signum (the main
    thread is blocked: only ``os._exit`` ends the process)."""
    name = signal.Signals(signum).name
    for proc in list(children):
        try:
            proc.send_signal(signal.SIGTERM)
        except Exception:  # noqa: BLE001 - already gone
            pass
    try:
        release()
    finally:
        if say:
            print(f"error: stopped by {name} while waiting for the other processes of the distributed start; nothing "
                  "was trained; rerun the same command", file=sys.stderr, flush=True)
        os._exit(128 + signum)

"""Callbacks that tests attach through the CLI (``--trainer.callbacks+=tests.helpers.X``)."""

from __future__ import annotations

import contextlib
import io
import json
import traceback
from pathlib import Path

import lightning as L
import torch
from lightning import Callback
from torch.utils.data import DataLoader, TensorDataset


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


class SlowSteps(Callback):
    """Sleep after every training batch (a run that is still training when a test signals it).

    With ``signal_file``, a test asks for a signal instead of sending it at a random moment: when
    the file exists at the end of the second training batch of an epoch, the run sends the signal
    named in it (``SIGTERM``, ``SIGUSR1``) to itself and removes the file. The signal is real (the
    CLI's handlers take it), but it always lands mid-epoch, inside training, never during
    validation or a checkpoint save.
    """

    def __init__(self, seconds: float = 0.2, signal_file: str | None = None) -> None:
        self.seconds = seconds
        self.signal_file = signal_file

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        import os
        import signal
        import time
        from pathlib import Path

        time.sleep(self.seconds)
        ask = Path(self.signal_file) if self.signal_file else None
        if ask is not None and batch_idx == 1 and ask.is_file():
            name = ask.read_text().strip()
            ask.unlink()
            os.kill(os.getpid(), getattr(signal, name))


class CountBatches(Callback):
    """Write, per fit, how many training and validation batches ran (sanity check excluded)."""

    def __init__(self, out: str) -> None:
        self.out = out
        self.counts = {"train": 0, "val": 0}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.counts["train"] += 1

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if not trainer.sanity_checking:
            self.counts["val"] += 1

    def on_fit_end(self, trainer, pl_module) -> None:
        Path(self.out).write_text(json.dumps({**self.counts, "limit_val_batches": repr(trainer.limit_val_batches)}))


def inprocess_runner(run, env) -> int:
    """A sweep runner: ``python -m reproductions <args>`` in this process (the sweep's default is a subprocess)."""
    run.run_dir.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    rc = 0
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            from reproductions.run.cli import main as cli_main

            cli_main(run.args)
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) and e.code else 1
    except Exception:
        buf.write(traceback.format_exc())
        rc = 1
    run.log_path.write_text(buf.getvalue())
    return rc


def cpu_flags_listed() -> bool:
    """Whether this OS lists the CPU's flags as /proc/cpuinfo's ``flags`` line (x86 Linux)."""
    path = Path("/proc/cpuinfo")
    return path.is_file() and any(line.startswith("flags") for line in path.read_text().splitlines())


def wandb_records(path: str | Path, timeout: float = 60.0) -> list:
    """The records of a finished offline W&B run file (``run-<id>.wandb``), parsed.

    W&B's service process may still be writing the file when ``run.finish()`` has returned:
    read until the run's ``exit`` record is there (or ``timeout`` seconds have passed).

    The file is W&B's datastore: a 7-byte header (``:W&B``, magic, version), then a LevelDB
    style log of 32 KiB blocks, each record a 7-byte header (crc32, length, type) and a
    protobuf ``wandb_internal_pb2.Record``, split into FIRST/MIDDLE/LAST pieces where it
    crosses a block boundary.
    """
    import time

    deadline = time.monotonic() + timeout
    while True:
        records = _read_wandb_file(Path(path))
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


def _read_wandb_file(path: Path) -> list:
    import struct

    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    block, pos, records, pieces = 32768, 7, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # block trailer: zero padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 or pos + 7 + length > len(data):  # zero fill, or a record still being written
            break
        pieces += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            records.append(record)
            pieces = b""
    return records


def wandb_summary(path: str | Path) -> dict:
    """The final summary of an offline W&B run file: the history's last values with the
    explicit summary updates on top (what the W&B UI shows in the runs table)."""
    summary: dict = {}
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            summary.update({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                            for item in record.history.item})
        elif kind == "summary":
            for item in record.summary.update:
                summary[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return summary


def wandb_artifacts(path: str | Path) -> list:
    """The artifacts an offline W&B run file logged (``Record.artifact`` protobufs)."""
    return [r.artifact for r in wandb_records(path) if r.WhichOneof("record_type") == "artifact"]


def _proc_status_mib(key: str) -> float | None:
    """A memory line of /proc/self/status (``VmRSS``, ``VmHWM``) in MiB; None off Linux."""
    status = Path("/proc/self/status")
    if not status.is_file():
        return None
    values = [line.split()[1] for line in status.read_text().splitlines() if line.startswith(f"{key}:")]
    return int(values[0]) / 1024 if values else None


class RecordSharding(Callback):
    """Write, per rank, what sharding did to the net and the optimiser: every parameter's local
    and global size, the weight-decay groups by parameter name, the optimiser state's local size
    after the first step, the global gradient norm (before clipping) of the first ``steps``
    steps, the precision in effect, the parameters' dtype, the bytes of parameters, gradients and
    optimiser state this rank holds (at the second step), its resident memory when training starts,
    its peak during the training steps (Linux: VmHWM reset at the start, read after every batch, so
    the epoch-end checkpoint is not in it) and its peak over the whole process."""

    def __init__(self, out_dir: str, steps: int = 4) -> None:
        self.out_dir = out_dir
        self.steps = steps
        self.record: dict = {"grad_norms": []}

    @staticmethod
    def _local(t):
        return t.to_local() if hasattr(t, "to_local") else t

    def on_train_start(self, trainer, pl_module) -> None:
        names = {id(p): n for n, p in pl_module.named_parameters()}
        self.record["rss_at_train_start_mib"] = _proc_status_mib("VmRSS")
        try:  # Linux: reset the peak resident memory (VmHWM), so the steps' peak is read without setup's
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            pass
        self.record.update(
            rank=trainer.global_rank, world_size=trainer.world_size, precision=str(trainer.precision),
            precision_plugin=type(trainer.precision_plugin).__name__,
            params={n: {"local": self._local(p).numel(), "global": p.numel(), "dtype": str(p.dtype),
                        "dtensor": hasattr(p, "to_local"),
                        "placements": [str(x) for x in getattr(p, "placements", ())]}
                    for n, p in pl_module.named_parameters()},
            groups=[{"weight_decay": g["weight_decay"], "params": [names[id(p)] for p in g["params"]]}
                    for g in trainer.optimizers[0].param_groups],
        )

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        import torch

        if len(self.record["grad_norms"]) >= self.steps:
            return
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        if trainer.global_step == 1:  # parameters, gradients and optimiser state all exist now
            def nbytes(tensors):
                return sum(self._local(t).numel() * t.element_size() for t in tensors)

            params = [p for g in optimizer.param_groups for p in g["params"]]
            state = [v for s in optimizer.state.values() for k, v in s.items() if k != "step"]
            self.record["bytes"] = {"params": nbytes(params), "grads": nbytes(grads), "optimizer": nbytes(state)}
        norm = torch.nn.utils.get_total_norm(grads)
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        self.record["grad_norms"].append(float(norm))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        peak = _proc_status_mib("VmHWM")  # before the epoch-end checkpoint gathers the full state
        if peak is not None:
            self.record["train_peak_rss_mib"] = max(peak, self.record.get("train_peak_rss_mib", 0.0))
        if trainer.global_step == 1 and "optimizer_state" not in self.record:
            state = trainer.optimizers[0].state
            self.record["optimizer_state"] = {
                "local": sum(self._local(v).numel() for s in state.values() for k, v in s.items() if k != "step"),
                "global": sum(v.numel() for s in state.values() for k, v in s.items() if k != "step"),
            }

    def on_train_end(self, trainer, pl_module) -> None:
        import resource

        self.record["max_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        path = Path(self.out_dir) / f"sharding_rank{trainer.global_rank}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.record))


class RecordCompile(Callback):
    """Write, per rank, whether the net was compiled in place and how many graphs dynamo made."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = out_dir

    def on_train_end(self, trainer, pl_module) -> None:
        from torch._dynamo.utils import counters

        compiled = getattr(pl_module.net, "_compiled_call_impl", None) is not None
        record = {"rank": trainer.global_rank, "compiled": compiled, "graphs": counters["stats"]["unique_graphs"]}
        path = Path(self.out_dir) / f"compile_rank{trainer.global_rank}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record))


class TinyData(L.LightningDataModule):
    """Random images, the same every time; ``batch_size`` is the global batch, as in the repository's
    DataModules. Train, validation and test are the same batches, in order."""

    def __init__(self, num_classes=4, n=64, batch_size=16, shape=(1, 8, 8)):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.num_classes, self.input_shape, self.batch_size = num_classes, shape, batch_size
        self.x = torch.randn(n, *shape, generator=g)
        self.y = torch.randint(0, num_classes, (n,), generator=g)

    def train_dataloader(self):
        return DataLoader(TensorDataset(self.x, self.y), batch_size=self.batch_size, shuffle=False)

    val_dataloader = test_dataloader = train_dataloader


def quiet_trainer(**kw) -> L.Trainer:
    """A one-epoch CPU Trainer without logger, checkpoints, progress bar or sanity check; ``kw`` override."""
    args = dict(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    args.update(kw)
    return L.Trainer(**args)


def assert_every_parameter_trains(model: torch.nn.Module, images: torch.Tensor, steps: int = 2) -> None:
    """After ``steps`` SGD steps on a loss of every logit, every parameter has received a gradient."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        model(images).logsumexp(dim=1).sum().backward()
        opt.step()
    assert all(p.grad.abs().sum() > 0 for p in model.parameters())


def history_values(records: list) -> dict:
    """What the history records of a W&B run file logged, by key, later steps over earlier ones: a
    plain value, or for a media or table value (logged as nested keys) a dict of its fields
    (``{"_type": "image-file", "path": "media/images/...", ...}``)."""
    import json

    logged: dict = {}
    for r in records:
        if r.WhichOneof("record_type") != "history":
            continue
        for item in r.history.item:
            keys = list(item.nested_key) or [item.key]
            value = json.loads(item.value_json)
            if len(keys) == 1:
                logged[keys[0]] = value
            else:
                logged.setdefault(keys[0], {})[keys[1]] = value
    return logged


def brute_force_gauc(labels, scores, groups) -> float:
    """GAUC the slow, obvious way: scikit-learn's AUC user by user, weighted by the user's
    impressions; users whose labels are all one class skipped (NaN when no user has both)."""
    import numpy as np
    from sklearn.metrics import roc_auc_score

    labels, scores, groups = (np.asarray(a) for a in (labels, scores, groups))
    total, weight = 0.0, 0
    for g in np.unique(groups):
        m = groups == g
        if 0 < labels[m].sum() < m.sum():
            total += m.sum() * roc_auc_score(labels[m], scores[m])
            weight += m.sum()
    return total / weight if weight else float("nan")

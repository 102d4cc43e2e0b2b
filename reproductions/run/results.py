"""The run directory's ``results.json``: what a run measured and under which code and versions.

Written once, at the end of a successful run, atomically (temporary file in the same
directory, then ``os.replace``), so a reader sees either no file or a complete one. A sweep
treats a run directory with a ``results.json`` whose ``status`` is ``finished`` as done. A fit
that failed or was interrupted after training started writes ``status`` ``failed`` or
``interrupted`` with the error and the step instead (reproductions/run/cli.py); ``read_results``
returns None for those.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from utils.atomic import atomic_write_json

RESULTS_FILE = "results.json"
REPO_ROOT = Path(__file__).resolve().parents[2]
_VERSIONED = ("torch", "lightning", "timm", "torchmetrics", "datasets", "wandb", "jsonargparse", "numpy")


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in _VERSIONED:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_state(repo: Path = REPO_ROOT) -> dict[str, Any]:
    """Commit hash and whether the work tree had uncommitted changes (None when not a git checkout)."""

    def _git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", *args], cwd=repo, capture_output=True, text=True, timeout=10, check=True
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip()

    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def _command_line() -> list[str]:
    argv = list(sys.argv)
    if argv and Path(argv[0]).name == "__main__.py":
        argv[0:1] = ["-m", Path(argv[0]).parent.name]
    return ["python", *argv]


def write_results(run_dir: str | os.PathLike, results: dict[str, Any]) -> Path:
    """Write ``results`` as ``<run_dir>/results.json`` (strict JSON, atomically)."""
    return atomic_write_json(Path(run_dir) / RESULTS_FILE, results)


def git_at_end(start: dict[str, Any]) -> dict[str, Any]:
    """``start`` (the ``git_state()`` a run began with: the code it ran), plus ``at_end``, the state
    at the end, when the checkout changed while it ran."""
    end = git_state()
    return start if end == start else {**start, "at_end": end}


def _cpuinfo(keys: tuple[str, ...]) -> dict[str, str]:
    """The first value of each of ``keys`` in /proc/cpuinfo (none where the OS has no such file)."""
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in keys and key not in info:
                info[key] = value.strip()
            if len(info) == len(keys):
                break
    except OSError:
        pass
    return info


def cpu_flags(names: Sequence[str]) -> dict[str, bool]:
    """Whether the CPU has each of the instruction-set flags ``names`` (``avx512_bf16``, ...); empty
    where the OS does not list them."""
    flags = _cpuinfo(("flags",)).get("flags")
    return {} if flags is None else {n: n in flags.split() for n in names}


def cpu_name() -> str:
    """The CPU's model name, with its family and model numbers where the OS gives them (a VM
    often names only the product line, "AMD EPYC", for several generations of it)."""
    info = _cpuinfo(("model name", "cpu family", "model"))
    name = info.get("model name") or platform.processor() or platform.machine() or "unknown"
    if "cpu family" in info and "model" in info:
        name += f" (family {info['cpu family']}, model {info['model']})"
    return name


def hardware(device: str | None = None) -> dict[str, Any]:
    """What computed the numbers: ``device`` (``cpu``, ``cuda``, ...; default cuda where there is
    one), the CPU and the instruction set PyTorch's CPU kernels were built for on it
    (``cpu_capability``: AVX2, AVX512, ...), and the GPU on CUDA.

    It is part of a result: the same config and seed give the same numbers again on the same
    hardware and software, but another instruction set picks other kernels, whose float
    reductions round differently, and two such runs part after a few steps (they differ by
    seed-to-seed noise, not by a fixed amount)."""
    import torch

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    found: dict[str, Any] = {"device": device, "cpu": cpu_name(),
                             "cpu_capability": torch.backends.cpu.get_cpu_capability()}  # fmt: skip
    if device == "cuda" and torch.cuda.is_available():
        found["gpu"] = torch.cuda.get_device_name()
        found["cuda"] = torch.version.cuda
    return found


def same_hardware(a: Any, b: Any) -> bool:
    """Whether two ``hardware`` records name hardware that computes the same numbers: the same
    GPU model on CUDA, else the same CPU and instruction set. A missing record matches nothing."""
    if not isinstance(a, dict) or not isinstance(b, dict) or a.get("device") != b.get("device"):
        return False
    keys = ("gpu",) if a.get("device") == "cuda" else ("cpu", "cpu_capability")
    return all(a.get(k) is not None and a.get(k) == b.get(k) for k in keys)


def hardware_label(results: dict) -> str:
    """What a results.json (or a registry record) says computed it: the GPU or the CPU and its instruction set."""
    hw = results.get("hardware")
    if not isinstance(hw, dict):
        return "not recorded (results.json from before the hardware record)"
    cpu = f"CPU {hw.get('cpu', '?')}" + (f" ({hw['cpu_capability']})" if hw.get("cpu_capability") else "")
    if hw.get("device") == "cuda" or hw.get("gpu"):
        return f"GPU {hw.get('gpu', '?')}" + (f" (CUDA {hw['cuda']})" if hw.get("cuda") else "") + f", {cpu}"
    return cpu


def hardware_summary(results: list[dict]) -> str:
    """Where a set of runs (results.json files or records) were computed: one ``hardware_label``, or,
    for runs of several kinds of hardware, each with its count of runs, most runs first ("–" for none)."""
    counts: dict[str, int] = {}
    for r in results:
        counts[hardware_label(r)] = counts.get(hardware_label(r), 0) + 1
    if len(counts) <= 1:
        return next(iter(counts), "–")
    return "; ".join(f"{label} ({n} run{'s' if n != 1 else ''})" for label, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def environment(git: dict[str, Any] | None = None, device: str | None = None) -> dict[str, Any]:
    """What a results.json records of where it ran; ``git``: the run's own state (see
    ``git_at_end``), else the checkout's now; ``device``: the run's (see ``hardware``)."""
    return {
        "versions": package_versions(),
        "git": git if git is not None else git_state(),
        "hardware": hardware(device),
        "host": platform.node(),
        "command": " ".join(_command_line()),
        "finished_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def fit_record(trainer, model, data, clock) -> dict[str, Any]:
    """What results.json records of a finished fit, read off Lightning's objects: the best checkpoint,
    the model (class, parameters, FLOPs per sample), the training (epochs, steps, samples seen as the
    training ``clock`` counted them, total FLOPs, devices, precision, lr, times) and the data."""
    ckpt = trainer.checkpoint_callback
    flops = getattr(model, "flops_per_sample", None)
    samples_seen = clock.samples_seen  # counted batch by batch (a partial batch as its size)
    return {
        "best": {
            "monitor": getattr(ckpt, "monitor", None),
            "score": None if ckpt is None or ckpt.best_model_score is None else float(ckpt.best_model_score),
            "path": None if ckpt is None else ckpt.best_model_path or None,
        },
        "model": {
            "module": type(model).__name__,
            "net": type(getattr(model, "net", model)).__name__,
            "params": getattr(model, "num_params", None),
            "flops_per_sample": flops,
        },
        "training": {
            "epochs": trainer.current_epoch,
            "steps": trainer.global_step,
            "global_batch_size": getattr(data, "batch_size", None),
            "samples_seen": samples_seen,
            # backward ~ 2x forward: the usual 3x forward FLOPs per training sample
            "total_train_flops": None if flops is None or samples_seen is None else 3 * flops * samples_seen,
            "devices": trainer.world_size,
            "num_nodes": trainer.num_nodes,
            "precision": str(trainer.precision),
            # the lr the optimiser got: the configured one, scaled to the global batch if
            # the module's lr_scaling says so
            "lr_scaling": getattr(model, "hparams", {}).get("lr_scaling"),
            "effective_lr": getattr(model, "effective_lr", None),
            **clock.summary(),
        },
        "data": data.describe() if hasattr(data, "describe") else {"class": type(data).__name__},
    }


def results_state(run_dir: str | os.PathLike) -> tuple[str, dict[str, Any] | None]:
    """``(state, results)`` of a run directory: ``missing`` (no results.json), ``corrupt``
    (a file that is not a JSON object: cut short, edited, ...), or the file's ``status``
    (``finished``, ``failed``, ``interrupted``) with its contents."""
    path = Path(run_dir) / RESULTS_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return "missing", None
    except OSError:
        return "corrupt", None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return "corrupt", None
    if not isinstance(data, dict):
        return "corrupt", None
    return str(data.get("status", "corrupt")), data


def value_at(results: dict, path: str) -> Any:
    """The value at a dotted ``path`` of a results dict (``training.fit_time_s``), or None."""
    for part in path.split("."):
        if not isinstance(results, dict) or part not in results:
            return None
        results = results[part]
    return results


def metric_value(results: dict, key: str) -> Any:
    """A sweep metric of one run: ``stage/name`` keys (``test/auc``) from the test metrics, any
    other key as a dotted path (``best.score``: the monitored validation value of the best
    checkpoint, what a tuning sweep selects on; ``final.val/acc``: the last validation value),
    or None."""
    if "/" in key and "." not in key.split("/", 1)[0]:
        return (results.get("test") or {}).get(key)
    return value_at(results, key)


def read_results(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The run's results, or None if the run has not finished (no file, a corrupt one, or a
    failed or interrupted run)."""
    state, data = results_state(run_dir)
    return data if state == "finished" else None


def main(argv: list[str] | None = None) -> int:
    """``python -m reproductions.run.results <run dir>``: print the run's state; exit 0 if it
    finished, 1 if not (missing, failed, interrupted), 2 if its results.json is corrupt. The
    SLURM array script uses it to skip finished runs."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m reproductions.run.results <run dir>", file=sys.stderr)
        return 2
    state, _ = results_state(args[0])
    if state == "corrupt":
        print(f"error: {Path(args[0]) / RESULTS_FILE} is corrupt (not a complete JSON object); "
              "delete it to rerun the run", file=sys.stderr)
        return 2
    print(f"{args[0]}: {state}")
    return 0 if state == "finished" else 1


if __name__ == "__main__":
    sys.exit(main())

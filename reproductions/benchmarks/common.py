"""What every benchmark shares: timing, A/B alternation, training steps, memory, FLOPs, tables, JSON.

The method, everywhere:

- **Same process, same inputs.** Every side of a comparison is built in this process and fed the
  same batches (built once, before timing).
- **Steady state.** ``measure_rate`` runs ``warmup`` steps, synchronises the device, then times
  ``steps`` steps (a second synchronisation before the clock stops on a GPU).
- **Alternation.** ``alternate`` measures every candidate once per round, rotating the order
  each round (two candidates: A B, then B A), so a burst of load from another process hits
  every side, not one.
- **Ratios of medians.** Each candidate's result is the median over rounds; comparisons are
  ratios of medians (``ratio``), and where two candidates are paired the median of the
  per-round ratios is recorded too (same round: same machine state).
- **No speed asserted in tests.** Benchmarks print PASS/FAIL against targets; tests only check
  that they run and report.

Peak memory of a training step (``step_peak_memory``): on CUDA,
``torch.cuda.max_memory_allocated`` above the memory allocated before the step; on Linux CPUs,
the process's resident-set high-water mark above its resting RSS: freed heap pages are handed
back first (``malloc_trim``), the kernel's high-water mark is reset (``/proc/self/clear_refs``,
"5"), one step runs, and ``VmHWM`` - ``VmRSS`` (from ``/proc/self/status``) is the step's peak.
This is what the step makes the process hold (activations, gradients' buffers, workspaces); it
includes allocator slack, as the CUDA number does not. (``tracemalloc`` cannot see torch's C++
allocations; ``getrusage`` maxrss only ever rises, so it misses any peak below an earlier one:
it is the fallback, marked as a lower bound, where ``clear_refs`` is unavailable.)
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import math
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lightning_modules.model_stats import count_flops, count_parameters
from reproductions.run.results import REPO_ROOT, environment
from utils.atomic import atomic_write_json

MIB = 2**20
DEFAULT_OUT_DIR = Path("bench_results")


class BenchmarkUnavailable(RuntimeError):
    """The benchmark cannot run here (e.g. no CUDA device); the CLI exits with code 2."""


# --------------------------------------------------------------------------------------------- reports
@dataclass
class Table:
    """A printed table: ``rows`` hold already formatted cells; the raw numbers live in the result."""

    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, *cells: Any) -> None:
        self.rows.append([str(c) for c in cells])

    def render(self) -> str:
        """A Markdown table (aligned), its title above and its notes below."""
        cells = [self.columns, *self.rows]
        widths = [max(len(r[i]) for r in cells) for i in range(len(self.columns))]
        line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
        out = [f"### {self.title}", "", line(self.columns), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
        out += [line(r) for r in self.rows]
        if self.notes:
            out += ["", *self.notes]
        return "\n".join(out)

    def to_json(self) -> dict:
        return {"title": self.title, "columns": self.columns, "rows": self.rows, "notes": self.notes}


@dataclass
class BenchReport:
    """What a benchmark returns: the JSON result, the tables and the verdict lines."""

    name: str
    result: dict
    tables: list[Table] = field(default_factory=list)
    verdicts: list[str] = field(default_factory=list)


def emit(report: BenchReport, out: str | os.PathLike) -> dict:
    """Print the tables and verdicts; write the result (tables and environment included) as JSON."""
    for table in report.tables:
        print("\n" + table.render(), flush=True)
    if report.verdicts:
        print()
        for line in report.verdicts:
            print(line)
    data = {"benchmark": report.name, **report.result, "tables": [t.to_json() for t in report.tables],
            "verdicts": report.verdicts, **environment()}
    atomic_write_json(Path(out), data)
    print(f"\nwritten: {out}", flush=True)
    return data


def fmt_rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f}"


def fmt_ratio(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.3f}x"


def fmt_mib(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / MIB:,.1f}"


def fmt_flops(x: float | None, unit: float = 1e6) -> str:
    return "-" if x is None else f"{x / unit:,.2f}"


def pass_fail(value: float, target: float) -> str:
    return "PASS" if value >= target else "FAIL"


# --------------------------------------------------------------------------------------------- CLI pieces
def add_run_args(parser: argparse.ArgumentParser, *, rounds: int, steps: int | None, warmup: int | None,
                 batch_size: int | None, device: bool = True) -> None:
    """Options every benchmark has; ``None`` defaults are filled per device by the benchmark."""
    parser.add_argument("--rounds", type=int, default=rounds,
                        help=f"alternating rounds; medians are reported (default {rounds})")
    parser.add_argument("--steps", type=int, default=steps, help="timed steps per measurement")
    if warmup is not None:
        parser.add_argument("--warmup", type=int, default=warmup,
                            help=f"untimed steps before each measurement (default {warmup})")
    parser.add_argument("--batch-size", dest="batch_size", type=int, default=batch_size)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: leave torch's setting; on a CPU shared with "
                             "other processes 1 is steadier)")
    if device:
        parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")


def add_out_arg(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("--out", default=str(DEFAULT_OUT_DIR / f"{name}.json"),
                        help=f"where the JSON goes (default {DEFAULT_OUT_DIR / name}.json)")


def int_list(text: str) -> list[int]:
    """'8,4,2' -> [8, 4, 2] (argparse type)."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from err
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r} must hold positive integers")
    return values


def setup_run(args: argparse.Namespace, cpu_hint: str = "--device cpu") -> torch.device:
    """Apply --threads, check --rounds/--steps, resolve --device (BenchmarkUnavailable without CUDA)."""
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads {args.threads} must be >= 1")
        torch.set_num_threads(args.threads)
    for name, least in (("rounds", 1), ("steps", 1), ("batch_size", 1), ("warmup", 0)):
        value = getattr(args, name, None)
        if value is not None and value < least:
            raise ValueError(f"--{name.replace('_', '-')} {value} must be >= {least}")
    device = torch.device(getattr(args, "device", "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BenchmarkUnavailable(
            "no CUDA device is visible (torch.cuda.is_available() is False): run on a GPU machine, or pass "
            f"{cpu_hint} to run the CPU version"
        )
    return device


def run_settings(args: argparse.Namespace, device: torch.device, **extra: Any) -> dict:
    settings = {k: v for k, v in vars(args).items() if k not in ("which", "out")}
    settings.update(device=str(device), threads=torch.get_num_threads(), **extra)
    if device.type == "cuda":
        settings["device_name"] = torch.cuda.get_device_name(device)
    return settings


# --------------------------------------------------------------------------------------------- timing
def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_rates(step: Callable[[], Any], *, steps: int, warmup: int, items_per_step: float,
                  device: torch.device) -> tuple[float, float]:
    """Items per second of ``step`` in steady state (``warmup`` untimed calls, then ``steps`` timed):
    (per wall-clock second, per second of this process's CPU time).

    The CPU-time rate ignores time the process waits while other processes run: on a shared CPU
    with one thread it is the steadier estimate of the work itself (with several threads it also
    counts their spinning; on a GPU it is meaningless).
    """
    for _ in range(warmup):
        step()
    synchronize(device)
    start, cpu_start = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step()
    synchronize(device)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    if elapsed <= 0:
        raise RuntimeError("the clock measured no time; raise --steps")
    return steps * items_per_step / elapsed, steps * items_per_step / max(cpu, 1e-9)


def measure_rate(step: Callable[[], Any], *, steps: int, warmup: int, items_per_step: float,
                 device: torch.device) -> float:
    """Items per wall-clock second of ``step`` in steady state (see ``measure_rates``)."""
    return measure_rates(step, steps=steps, warmup=warmup, items_per_step=items_per_step, device=device)[0]


def alternate(candidates: Mapping[str, Callable[[], float]], rounds: int, *, unit: str = "items/s",
              units: Mapping[str, str] | None = None,
              log: Callable[[str], None] | None = print) -> dict[str, list[float]]:
    """Measure every candidate once per round, rotating the order each round; rates per candidate.

    ``units`` overrides the logged unit per candidate (a ``GFLOP/s`` unit logs rate / 1e9).
    """
    names = list(candidates)
    rates: dict[str, list[float]] = {n: [] for n in names}
    width = max(len(n) for n in names)
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            rate = candidates[name]()
            rates[name].append(rate)
            if log is not None:
                u = (units or {}).get(name, unit)
                shown = rate / 1e9 if u == "GFLOP/s" else rate
                log(f"round {r + 1}/{rounds} {name:{width}s} {shown:12,.1f} {u}")
    return rates


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def medians(rates: Mapping[str, Sequence[float]]) -> dict[str, float]:
    return {k: statistics.median(v) for k, v in rates.items()}


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def paired_ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """Per-round ratios a[r] / b[r] (measured in the same round)."""
    return [x / y for x, y in zip(a, b)]


def growth_verdict(measured: float, predicted: float, tolerance: float = 0.2) -> str:
    """Compare a measured cost ratio with the FLOPs-predicted one (within +-tolerance, in log space)."""
    if not (measured > 0 and predicted > 0):
        return "-"
    r = measured / predicted
    if abs(math.log(r)) <= math.log1p(tolerance):
        return "matches FLOPs"
    return "below FLOPs (better use of the machine)" if r < 1 else "above FLOPs (overheads, memory)"


# --------------------------------------------------------------------------------------------- training steps
Batch = tuple[Any, torch.Tensor]  # (inputs: tensor or dict of tensors, targets)


def to_device(x: Any, device: torch.device, memory_format: torch.memory_format | None = None) -> Any:
    if isinstance(x, dict):
        return {k: to_device(v, device) for k, v in x.items()}
    if isinstance(x, torch.Tensor):
        x = x.to(device)
        if memory_format is not None and x.dim() == 4:
            x = x.contiguous(memory_format=memory_format)
        return x
    raise TypeError(f"cannot move {type(x).__name__} to a device")


def first_rows(x: Any, n: int = 1) -> Any:
    """The first ``n`` samples of a batch (tensor or dict of tensors)."""
    return {k: v[:n] for k, v in x.items()} if isinstance(x, dict) else x[:n]


def autocast(device: torch.device, amp_dtype: torch.dtype | None):
    return torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None)


class TrainStep:
    """One training step per call: forward (under autocast when ``amp_dtype``), loss, backward, AdamW.

    ``batches`` (inputs, targets) are moved to the device once and used in turn. With
    ``memory_format=torch.channels_last`` the model's 4-D parameters (or those of ``cnn``, a
    submodule, when given) and the 4-D inputs are laid out channels-last. The model is put in
    training mode (dropout on, as in training).
    """

    def __init__(self, model: nn.Module, batches: Sequence[Batch], loss_fn: Callable, *, device: torch.device,
                 amp_dtype: torch.dtype | None = None, lr: float = 1e-3,
                 memory_format: torch.memory_format | None = None, cnn: nn.Module | None = None) -> None:
        self.model = model.to(device).train()
        if memory_format is not None:
            (cnn if cnn is not None else model).to(memory_format=memory_format)
        self.batches = [(to_device(x, device, memory_format), to_device(y, device)) for x, y in batches]
        self.loss_fn = loss_fn
        self.device = device
        self.amp_dtype = amp_dtype
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
        self.batch_size = len(self.batches[0][1])
        self._i = 0

    def __call__(self) -> None:
        x, y = self.batches[self._i % len(self.batches)]
        self._i += 1
        with autocast(self.device, self.amp_dtype):
            out = self.model(x)
        loss = self.loss_fn(out.float(), y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()

    def rate(self, *, steps: int, warmup: int) -> float:
        """Samples per second."""
        return measure_rate(self, steps=steps, warmup=warmup, items_per_step=self.batch_size, device=self.device)

    def example(self) -> Any:
        """One sample of the first batch (for FLOP counting)."""
        return first_rows(self.batches[0][0])


class InferenceStep:
    """One inference forward per call, in eval mode under ``torch.inference_mode`` (and autocast when
    ``amp_dtype``): what serving or evaluation costs. Same interface as ``TrainStep`` (``rate``,
    ``example``, ``model``, ``batch_size``); the targets of ``batches`` are not used."""

    def __init__(self, model: nn.Module, batches: Sequence[Batch], *, device: torch.device,
                 amp_dtype: torch.dtype | None = None) -> None:
        self.model = model.to(device).eval()
        self.batches = [to_device(x, device) for x, _ in batches]
        self.device = device
        self.amp_dtype = amp_dtype
        self.batch_size = len(next(iter(self.batches[0].values())) if isinstance(self.batches[0], dict)
                              else self.batches[0])
        self._i = 0

    def __call__(self) -> None:
        x = self.batches[self._i % len(self.batches)]
        self._i += 1
        with torch.inference_mode(), autocast(self.device, self.amp_dtype):
            self.model(x)

    def rate(self, *, steps: int, warmup: int) -> float:
        """Samples per second."""
        return measure_rate(self, steps=steps, warmup=warmup, items_per_step=self.batch_size, device=self.device)

    def example(self) -> Any:
        return first_rows(self.batches[0])


def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, target)


def bce_with_logits(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(logits, target.float())


def image_batches(n: int, batch_size: int, shape: Sequence[int], num_classes: int, seed: int = 0) -> list[Batch]:
    """``n`` random (images, labels) batches of one shape (random data: the cost does not depend on it)."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch_size, *shape, generator=g), torch.randint(0, num_classes, (batch_size,), generator=g))
            for _ in range(n)]


# --------------------------------------------------------------------------------------------- FLOPs, peaks
def forward_flops(model: nn.Module, example: Any) -> int:
    """Forward FLOPs of one sample (``count_flops`` of the repository: attention on the math path)."""
    return count_flops(model, first_rows(example))


def training_flops_rate(forward_flops_per_sample: float, samples_per_sec: float) -> float:
    """Achieved FLOP/s of training: 3 x forward FLOPs (forward + a backward of twice its cost) x samples/s."""
    return 3.0 * forward_flops_per_sample * samples_per_sec


def matmul_rate(device: torch.device, dtype: torch.dtype = torch.float32, n: int | None = None,
                repeats: int | None = None) -> float:
    """FLOP/s of one ``n x n @ n x n`` torch.matmul in ``dtype`` (2 n^3 FLOPs), steady state."""
    if n is None:
        n = 8192 if device.type == "cuda" else 1024
    if repeats is None:
        repeats = 10 if device.type == "cuda" else 3
    a = torch.randn(n, n, device=device, dtype=dtype)  # the values do not matter, only the shapes
    b = torch.randn(n, n, device=device, dtype=dtype)
    return measure_rate(lambda: torch.matmul(a, b), steps=repeats, warmup=1, items_per_step=2.0 * n**3,
                        device=device)


_LIBC = None


def _libc():
    global _LIBC
    if _LIBC is None:
        try:
            _LIBC = ctypes.CDLL("libc.so.6")
            _LIBC.malloc_trim  # noqa: B018  (glibc only)
        except (OSError, AttributeError):
            _LIBC = False
    return _LIBC or None


def _proc_status_kib(*keys: str) -> dict[str, int]:
    values = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in keys:
                values[name] = int(rest.split()[0])
    return values


def _reset_rss_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


CPU_MEMORY_METHOD = "RSS high-water mark above resting RSS over one step (Linux clear_refs + VmHWM, after malloc_trim)"
CUDA_MEMORY_METHOD = "torch.cuda.max_memory_allocated above the memory allocated before the step"
FALLBACK_MEMORY_METHOD = "getrusage maxrss delta (a lower bound: 0 when below an earlier peak)"


def memory_method(device: torch.device) -> str:
    if device.type == "cuda":
        return CUDA_MEMORY_METHOD
    return CPU_MEMORY_METHOD if _libc() and _reset_rss_peak() else FALLBACK_MEMORY_METHOD


def step_peak_memory(step: Callable[[], Any], device: torch.device) -> int | None:
    """Bytes one call of ``step`` holds at its peak above the memory held before it (see the module docstring).

    Run it after a warm-up step, so optimiser states and lazily created buffers already exist.
    """
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        step()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device) - before)
    libc = _libc()
    if libc is not None and _reset_rss_peak():
        libc.malloc_trim(0)
        before = _proc_status_kib("VmRSS")["VmRSS"]
        _reset_rss_peak()
        step()
        peak = _proc_status_kib("VmHWM")["VmHWM"]
        return max(0, peak - before) * 1024
    scale = 1 if sys.platform == "darwin" else 1024
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    step()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * scale


# --------------------------------------------------------------------------------------------- comparisons
@dataclass
class Measurement:
    """One candidate of a comparison: rates per round, their median, size, cost and peak memory."""

    name: str
    rates: list[float]
    median: float
    params: int | None = None
    forward_flops: int | None = None  # per sample
    flops_per_sec: float | None = None  # achieved training FLOP/s: 3 x forward FLOPs x samples/s
    fraction_of_matmul: float | None = None  # flops_per_sec / the matmul rate measured alongside
    peak_bytes: int | None = None

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Alternation:
    items: dict[str, Measurement]
    matmul_rates: list[float]  # FLOP/s of a large matmul, measured in every round (empty: not measured)
    matmul_dtype: str | None

    @property
    def matmul(self) -> float | None:
        return median(self.matmul_rates) if self.matmul_rates else None

    def __getitem__(self, name: str) -> Measurement:
        return self.items[name]

    def to_json(self) -> dict:
        return {"items": {k: v.to_json() for k, v in self.items.items()}, "matmul_flops_per_sec": self.matmul,
                "matmul_rates": self.matmul_rates, "matmul_dtype": self.matmul_dtype}


def compare(steps: Mapping[str, TrainStep], *, rounds: int, steps_per_measure: int, warmup: int,
            device: torch.device, matmul_dtype: torch.dtype | None = torch.float32, count: bool = True,
            memory: bool = True, unit: str = "samples/s") -> Alternation:
    """Alternate the training steps (and a ``matmul_dtype`` matmul, the machine's limit) over rounds.

    Per step: samples/s per round and their median; with ``count``, parameters, forward FLOPs
    per sample (``count_flops``), achieved training FLOP/s and its fraction of the median
    matmul rate; with ``memory``, the step's peak memory (``step_peak_memory``, after timing).
    """
    candidates: dict[str, Callable[[], float]] = {
        name: (lambda s=step: s.rate(steps=steps_per_measure, warmup=warmup)) for name, step in steps.items()
    }
    matmul_name = None
    if matmul_dtype is not None:
        matmul_name = f"matmul {str(matmul_dtype).removeprefix('torch.')}"
        candidates[matmul_name] = lambda: matmul_rate(device, matmul_dtype)
    rates = alternate(candidates, rounds, unit=unit, units={matmul_name: "GFLOP/s"} if matmul_name else None)
    matmul_rates = rates.pop(matmul_name) if matmul_name else []
    peak_matmul = median(matmul_rates) if matmul_rates else None
    items = {}
    for name, step in steps.items():
        m = Measurement(name, rates[name], median(rates[name]))
        if count:
            m.params = count_parameters(step.model)
            m.forward_flops = forward_flops(step.model, step.example())
            m.flops_per_sec = training_flops_rate(m.forward_flops, m.median)
            if peak_matmul:
                m.fraction_of_matmul = m.flops_per_sec / peak_matmul
        if memory:
            m.peak_bytes = step_peak_memory(step, device)
        items[name] = m
    return Alternation(items, matmul_rates, str(matmul_dtype).removeprefix("torch.") if matmul_dtype else None)


def fmt_gflops(flops_per_sec: float | None) -> str:
    return "-" if flops_per_sec is None else f"{flops_per_sec / 1e9:,.2f}"


def fmt_fraction(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


# --------------------------------------------------------------------------------------------- configs
def read_config(path: str | os.PathLike) -> dict:
    """A run config (YAML) of reproductions/*/configs; relative paths are taken from the repository root."""
    import yaml

    path = Path(path)
    if not path.is_absolute() and not path.exists():
        path = REPO_ROOT / path
    with open(path) as f:
        return yaml.safe_load(f)


def config_net(config: dict) -> tuple[str, dict]:
    """(class_path, init_args) of the config's ``model.init_args.net``."""
    net = config["model"]["init_args"]["net"]
    return net["class_path"], dict(net.get("init_args") or {})


def build(class_path: str, **kwargs: Any) -> Any:
    """Instantiate ``package.module.Class`` with keywords (as LightningCLI does with a config)."""
    module, _, name = class_path.rpartition(".")
    return getattr(import_module(module), name)(**kwargs)


def build_seeded(class_path: str, seed: int = 0, **kwargs: Any) -> Any:
    torch.manual_seed(seed)
    return build(class_path, **kwargs)


__all__ = [
    "BenchmarkUnavailable", "Alternation", "InferenceStep", "Measurement", "BenchReport", "compare", "fmt_fraction", "fmt_gflops", "Table", "TrainStep", "add_out_arg", "add_run_args", "alternate",
    "bce_with_logits", "build", "build_seeded", "config_net", "count_parameters", "cross_entropy", "emit",
    "first_rows", "fmt_flops", "fmt_mib", "fmt_rate", "fmt_ratio", "forward_flops", "growth_verdict",
    "image_batches", "int_list", "matmul_rate", "measure_rate", "measure_rates", "median", "medians", "memory_method",
    "paired_ratios", "pass_fail", "ratio", "read_config", "run_settings", "setup_run", "step_peak_memory",
    "synchronize", "training_flops_rate",
]

"""Sweeps: an ablation grid of one experiment, run variant x seed, each in its own run directory.

    python -m reproductions sweep vit/position --profile cpu [--seeds N] [--dry-run]
        [--launcher local|torchrun|slurm] [--devices N] [--jobs J] [--root runs] [--wandb]
        [-- extra CLI overrides for every run]

A sweep file (``reproductions/<paper>/sweeps/<name>.yaml``, named ``<paper>/<name>`` on the
command line, or any path to a YAML file) holds:

    title: Position embeddings (ViT Appendix D.4, Table 8)
    axis: position              # the ablation axis: a W&B tag, the report's subject
    base: reproductions/vit/configs/digits.yaml   # the experiment (repo-relative path)
    seeds: 3                    # a count (seeds 0..n-1) or a list of seeds
    aliases:                    # short names for override keys (optional)
      pos_embed: model.net.init_args.pos_embed
    overrides: {}               # applied to every run of every profile (optional)
    variants:                   # an explicit list ...
      - name: learned_2d-every_layer
        overrides: {pos_embed: learned_2d, pos_placement: every_layer}
        paper: {table8: 0.64046}          # optional: value per reference column
      - name: WDL                         # optional: the variant's own experiment config
        base: reproductions/bst/configs/wdl.yaml   # (one model per config; wins over base)
    product:                    # ... or a cartesian product of axes
      pool: [cls, gap]                    # -> variants "pool=cls,lr=0.001", ...
      lr: [3.0e-4, 1.0e-3]
        # both: every variant crossed with every product point ("ViT,train_samples=1000");
        # a variant's ``axes: {model: ViT, size: S}`` names it on the report's axes
    references:                 # the report's paper columns (optional)
      table8: {label: "...", scale: fraction, note: "...", unverified: false}
    metric: {key: test/acc, label: "test acc. (%)", scale: 100}   # the report's main column
        # (optional; also digits: 2, unit: points (how differences are named), ceiling: a
        # results.json path such as data.ceiling.test_auc: the best reachable value, a table row)
    columns: [{key: test/gauc, label: GAUC, scale: 1, digits: 4}]  # more metric columns (optional)
    claims: ["..."]             # the paper's claims, printed in the report (optional)
    report: {plot: bars, ...}   # how the report draws and checks (see reproductions/report.py)
    profiles:
      smoke: {seeds: 1, overrides: {...}}             # seconds, for tests
      cpu:   {seeds: 3, jobs: 2, overrides: {...}}    # minutes on 2 CPU cores, no network
      gpu:   {base: .../cifar10.yaml, overrides: {...}, product: {...}}

A profile adds overrides to every run and may replace ``base``, ``seeds``, ``variants`` or
``product`` (e.g. the patch sizes an image size allows) and set ``jobs`` (runs at once).
A variant with a ``paper`` value gives it as a number, or ``{value: x, unverified: true}``.
A variant with a ``base`` runs its own experiment config (e.g. one model per config: WDL, DIN,
BST), which wins over the profile's and the sweep's ``base``; the overrides apply on top as usual.

Where runs go: ``<root>/<paper>/<name>-<profile>/<variant>/seed<k>/`` (the experiment name
``<paper>/<name>-<profile>``, e.g. ``vit/position-cpu``), so profiles never mix. Every run is
``python -m reproductions fit --config <base> <sweep, profile, variant overrides>
--seed_everything k --run.experiment <exp> --run.variant <variant> --run.group <exp>
--run.tags [axis, profile, sweep]`` (then ``--devices``/``--wandb`` options and the extra
overrides). Later overrides win: profile over sweep, variant over profile, extras over all.

A run whose ``results.json`` says finished is skipped, so a sweep that was stopped continues
where it stopped; a failed run is logged (``<run dir>/stdout.log``), listed at the end and
makes the exit status 1; the others still run. After the runs the report is written
(``reproductions/report.py``) unless ``--no-report``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml

from reproductions.results import read_results
from utils.atomic import atomic_write_text

REPO_ROOT = Path(__file__).resolve().parents[1]
REPRODUCTIONS_DIR = REPO_ROOT / "reproductions"
LOG_FILE = "stdout.log"
LAUNCHERS = ("local", "torchrun", "slurm")
DEFAULT_PROFILE = "cpu"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=,+-]*$")
_SWEEP_KEYS = {
    "title", "description", "axis", "base", "seeds", "aliases", "overrides", "variants", "product",
    "references", "claims", "report", "metric", "columns", "profiles",
}  # fmt: skip
_PROFILE_KEYS = {"description", "base", "seeds", "jobs", "threads", "overrides", "variants", "product"}
_VARIANT_KEYS = {"name", "overrides", "paper", "description", "base", "axes"}
_REFERENCE_KEYS = {"label", "scale", "note", "unverified"}
_METRIC_KEYS = {"key", "label", "scale", "digits", "unit", "ceiling"}


class SweepError(ValueError):
    """A sweep file or sweep command that cannot work; the message says what and where."""


# --------------------------------------------------------------------------- the sweep file


@dataclass(frozen=True)
class Reference:
    """One column of paper values: ``scale`` says how the paper prints them (``fraction`` of 1
    or ``percent``); the report shows both as percent."""

    key: str
    label: str
    scale: str = "percent"
    note: str | None = None
    unverified: bool = False


@dataclass(frozen=True)
class PaperValue:
    value: float
    unverified: bool = False


@dataclass
class Variant:
    """One point of the grid: a name (its run directory) and the overrides it sets.

    ``axes`` holds the values as the sweep file writes them (short keys), for the report's
    grouping and plotting; ``overrides`` the full CLI keys; ``base`` the variant's own
    experiment config, if it has one.
    """

    name: str
    overrides: dict[str, Any]
    axes: dict[str, Any] = field(default_factory=dict)
    paper: dict[str, PaperValue] = field(default_factory=dict)
    base: str | None = None


@dataclass(frozen=True)
class Metric:
    """A metric column of the report: ``key`` in results.json's ``test``, shown as value x
    ``scale`` with ``digits`` decimals; differences are named in ``unit`` ("+1.20 points");
    ``ceiling``, a dotted path into results.json (``data.ceiling.test_auc``), is the best value
    reachable on that data, if the data knows it (the report adds it as a row)."""

    key: str = "test/acc"
    label: str = "test acc. (%)"
    scale: float = 100.0
    digits: int = 2
    unit: str = "points"
    ceiling: str | None = None


@dataclass
class Profile:
    name: str
    description: str | None
    base: str | None
    seeds: list[int] | None
    jobs: int | None
    threads: int | None
    overrides: dict[str, Any]
    variants: list[Variant] | None


@dataclass
class Sweep:
    path: Path
    id: str  # vit/position
    title: str
    description: str | None
    axis: str
    base: str
    seeds: list[int]
    aliases: dict[str, str]
    overrides: dict[str, Any]
    variants: list[Variant]
    references: list[Reference]
    claims: list[str]
    report: dict[str, Any]
    metric: Metric
    profiles: dict[str, Profile]
    columns: list[Metric] = field(default_factory=list)  # more metric columns after ``metric``

    def profile(self, name: str) -> Profile:
        if name not in self.profiles:
            raise SweepError(f"{self.path}: no profile {name!r}; profiles: {sorted(self.profiles)}")
        return self.profiles[name]


def find_sweep(ref: str | os.PathLike) -> Path:
    """``vit/position`` -> reproductions/vit/sweeps/position.yaml; a path to a file is taken as is."""
    path = Path(ref)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return path.resolve()
    parts = Path(str(ref).removesuffix(".yaml")).parts
    if len(parts) >= 2:
        candidate = REPRODUCTIONS_DIR.joinpath(*parts[:-1], "sweeps", parts[-1] + ".yaml")
        if candidate.is_file():
            return candidate
    known = sorted(sweep_id(p) for p in REPRODUCTIONS_DIR.glob("*/sweeps/*.yaml"))
    raise SweepError(f"no sweep {str(ref)!r}: give a sweep file or one of {known}")


def sweep_id(path: Path) -> str:
    """reproductions/vit/sweeps/position.yaml -> ``vit/position``; a file elsewhere -> its stem."""
    path = Path(path).resolve()
    try:
        rel = path.relative_to(REPRODUCTIONS_DIR)
    except ValueError:
        return path.stem
    return "/".join(p for p in rel.with_suffix("").parts if p != "sweeps")


def _check_keys(where: str, mapping: Any, allowed: set[str]) -> dict:
    if not isinstance(mapping, dict):
        raise SweepError(f"{where}: expected a mapping, got {type(mapping).__name__} {mapping!r}")
    unknown = sorted(set(mapping) - allowed)
    if unknown:
        raise SweepError(f"{where}: unknown keys {unknown}; allowed: {sorted(allowed)}")
    return mapping


def _check_name(where: str, name: Any) -> str:
    name = str(name)
    if not _NAME.match(name):
        raise SweepError(
            f"{where}: variant name {name!r} must be letters, digits and . _ = , + - "
            "(it names a directory; no '/' or spaces)"
        )
    return name


def _seeds(where: str, value: Any) -> list[int]:
    if isinstance(value, bool):
        raise SweepError(f"{where}: seeds={value!r} must be a count or a list of integers")
    if isinstance(value, int):
        if value < 1:
            raise SweepError(f"{where}: seeds={value} must be at least 1")
        return list(range(value))
    if isinstance(value, list) and value and all(isinstance(s, int) and not isinstance(s, bool) for s in value):
        if len(set(value)) != len(value):
            raise SweepError(f"{where}: seeds {value} repeat a seed")
        return list(value)
    raise SweepError(f"{where}: seeds={value!r} must be a count or a non-empty list of integers")


def _format_value(value: Any) -> str:
    """How an axis value appears in a variant name: 0.001 -> 0.001, 3e-4 -> 0.0003, True -> true."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _expand(where: str, spec: dict, aliases: dict[str, str]) -> list[Variant]:
    """Variants of a ``variants:`` list, a ``product:`` of axes, or both: every listed variant
    crossed with every point of the product (its name ``<variant>,<axis>=<value>,...``, its
    overrides the variant's then the point's, its axes both)."""
    if "variants" not in spec and "product" not in spec:
        raise SweepError(f"{where}: give 'variants' (a list), 'product' (axes) or both")
    resolve = lambda d: {aliases.get(k, k): v for k, v in d.items()}  # noqa: E731
    variants: list[Variant] = []
    if "variants" in spec:
        items = spec["variants"]
        if not isinstance(items, list) or not items:
            raise SweepError(f"{where}.variants: expected a non-empty list of {{name, overrides, paper}}")
        for i, item in enumerate(items):
            w = f"{where}.variants[{i}]"
            _check_keys(w, item, _VARIANT_KEYS)
            if "name" not in item:
                raise SweepError(f"{w}: every variant needs a name")
            overrides = _check_keys(f"{w}.overrides", item.get("overrides") or {}, set(item.get("overrides") or {}))
            paper = {}
            for col, val in (item.get("paper") or {}).items():
                if isinstance(val, dict):
                    _check_keys(f"{w}.paper.{col}", val, {"value", "unverified"})
                    paper[col] = PaperValue(float(val["value"]), bool(val.get("unverified", False)))
                else:
                    paper[col] = PaperValue(float(val))
            base = item.get("base")
            if base is not None and not isinstance(base, str):
                raise SweepError(f"{w}.base: expected a config path, got {base!r}")
            named_axes = _check_keys(f"{w}.axes", item.get("axes") or {}, set(item.get("axes") or {}))
            variants.append(Variant(
                _check_name(w, item["name"]), resolve(overrides), axes={**overrides, **named_axes}, paper=paper, base=base,
            ))  # fmt: skip
    if "product" in spec:
        points: list[Variant] = []
        axes = spec["product"]
        if not isinstance(axes, dict) or not axes:
            raise SweepError(f"{where}.product: expected a mapping of axis -> list of values")
        choices = []
        for axis, values in axes.items():
            if not isinstance(values, list) or not values:
                raise SweepError(f"{where}.product.{axis}: expected a non-empty list of values")
            choices.append([(axis, v) for v in values])
        for combo in itertools.product(*choices):
            name = ",".join(f"{axis}={_format_value(v)}" for axis, v in combo)
            set_ = dict(combo)
            points.append(Variant(_check_name(f"{where}.product", name), resolve(set_), axes=set_))
        if variants:
            for v in variants:
                if set(v.axes) & set(axes):
                    raise SweepError(f"{where}: variant {v.name!r} sets {sorted(set(v.axes) & set(axes))}, an axis of 'product'")
            variants = [
                Variant(f"{v.name},{p.name}", {**v.overrides, **p.overrides}, axes={**v.axes, **p.axes}, paper=v.paper, base=v.base)
                for v in variants for p in points
            ]  # fmt: skip
        else:
            variants = points
    names = [v.name for v in variants]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise SweepError(f"{where}: variant names repeat: {dupes}")
    return variants


def _profile_grid(raw: dict, spec: dict) -> dict:
    """A profile's grid: its ``variants``/``product``; where the sweep crosses both and the profile
    gives one (e.g. CIFAR's training-set sizes), the profile's crossed with the sweep's other."""
    grid = {k: spec[k] for k in ("variants", "product") if k in spec}
    if "variants" in raw and "product" in raw:
        for k in ("variants", "product"):
            grid.setdefault(k, raw[k])
    return grid


def load_sweep(ref: str | os.PathLike) -> Sweep:
    """Read and check a sweep file; every mistake names the file and the key."""
    path = find_sweep(ref)
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise SweepError(f"{path}: not valid YAML: {e}") from e
    where = str(path)
    _check_keys(where, raw, _SWEEP_KEYS)
    for key in ("axis", "base", "profiles"):
        if key not in raw:
            raise SweepError(f"{where}: missing {key!r}")
    aliases = _check_keys(f"{where}.aliases", raw.get("aliases") or {}, set(raw.get("aliases") or {}))
    references = []
    for key, ref_spec in (raw.get("references") or {}).items():
        _check_keys(f"{where}.references.{key}", ref_spec, _REFERENCE_KEYS)
        scale = ref_spec.get("scale", "percent")
        if scale not in ("percent", "fraction"):
            raise SweepError(f"{where}.references.{key}.scale={scale!r}: use 'percent' or 'fraction'")
        references.append(
            Reference(key, str(ref_spec.get("label", key)), scale, ref_spec.get("note"), bool(ref_spec.get("unverified", False)))
        )
    variants = _expand(where, raw, aliases)
    known_refs = {r.key for r in references}
    profiles = {}
    for name, spec in raw["profiles"].items():
        w = f"{where}.profiles.{name}"
        spec = _check_keys(w, spec or {}, _PROFILE_KEYS)
        jobs, threads = spec.get("jobs"), spec.get("threads")
        for key, value in (("jobs", jobs), ("threads", threads)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise SweepError(f"{w}.{key}={value!r} must be a positive integer")
        profile_overrides = _check_keys(f"{w}.overrides", spec.get("overrides") or {}, set(spec.get("overrides") or {}))
        profiles[name] = Profile(
            name=str(name),
            description=spec.get("description"),
            base=spec.get("base"),
            seeds=_seeds(f"{w}.seeds", spec["seeds"]) if "seeds" in spec else None,
            jobs=jobs,
            threads=threads,
            overrides={aliases.get(k, k): v for k, v in profile_overrides.items()},
            variants=_expand(w, _profile_grid(raw, spec), aliases) if ("variants" in spec or "product" in spec) else None,
        )
    for v in variants + [v for p in profiles.values() for v in (p.variants or [])]:
        unknown = sorted(set(v.paper) - known_refs)
        if unknown:
            raise SweepError(f"{where}: variant {v.name!r} has paper values for unknown references {unknown}")
    metric = _metric(f"{where}.metric", raw.get("metric") or {})
    columns_spec = raw.get("columns") or []
    if not isinstance(columns_spec, list):
        raise SweepError(f"{where}.columns: expected a list of {{key, label, scale, digits, unit, ceiling}}")
    columns = []
    for i, spec in enumerate(columns_spec):
        if not isinstance(spec, dict) or "key" not in spec:
            raise SweepError(f"{where}.columns[{i}]: every column needs a key (a test metric, e.g. test/gauc)")
        columns.append(_metric(f"{where}.columns[{i}]", {"label": spec["key"], **spec}))
    keys = [m.key for m in [metric, *columns]]
    if len(set(keys)) != len(keys):
        raise SweepError(f"{where}: metric and columns repeat a key: {keys}")
    return Sweep(
        path=path,
        id=sweep_id(path),
        title=str(raw.get("title", sweep_id(path))),
        description=raw.get("description"),
        axis=str(raw["axis"]),
        base=str(raw["base"]),
        seeds=_seeds(f"{where}.seeds", raw.get("seeds", 1)),
        aliases=dict(aliases),
        overrides={aliases.get(k, k): v for k, v in (raw.get("overrides") or {}).items()},
        variants=variants,
        references=references,
        claims=[str(c) for c in raw.get("claims") or []],
        report=dict(raw.get("report") or {}),
        metric=metric,
        profiles=profiles,
        columns=columns,
    )


def _metric(where: str, spec: Any) -> Metric:
    spec = dict(_check_keys(where, spec, _METRIC_KEYS))
    digits = spec.get("digits", Metric.digits)
    if not isinstance(digits, int) or isinstance(digits, bool) or not 0 <= digits <= 8:
        raise SweepError(f"{where}.digits={digits!r} must be an integer in [0, 8]")
    if "scale" in spec and (not isinstance(spec["scale"], (int, float)) or spec["scale"] <= 0):
        raise SweepError(f"{where}.scale={spec['scale']!r} must be a positive number")
    return Metric(**spec)


# --------------------------------------------------------------------------- the plan: runs


def cli_value(value: Any) -> str:
    """An override value as one command-line word that jsonargparse parses back to ``value``."""
    if isinstance(value, str):
        try:
            same = yaml.safe_load(value) == value
        except yaml.YAMLError:
            same = False
        return value if same else json.dumps(value)
    return json.dumps(value)


def override_args(overrides: dict[str, Any]) -> list[str]:
    args: list[str] = []
    for key, value in overrides.items():
        args += [f"--{key}", cli_value(value)]
    return args


def _display_path(path: Path) -> str:
    """Relative to the working directory when under it (shorter commands), else absolute."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path.resolve())


@dataclass
class Run:
    variant: Variant
    seed: int
    run_dir: Path
    args: list[str]  # what follows ``python -m reproductions``
    command: list[str]  # the full command line (python or torchrun)

    @property
    def label(self) -> str:
        return f"{self.variant.name} seed{self.seed}"

    @property
    def log_path(self) -> Path:
        return self.run_dir / LOG_FILE


@dataclass
class Plan:
    """A sweep at one profile: every variant x seed, with its run directory and command."""

    sweep: Sweep
    profile: Profile
    experiment: str
    root: Path
    base: Path
    seeds: list[int]
    variants: list[Variant]
    runs: list[Run]
    jobs: int

    @property
    def experiment_dir(self) -> Path:
        return self.root / self.experiment

    def finished(self) -> list[Run]:
        return [r for r in self.runs if read_results(r.run_dir) is not None]

    def pending(self) -> list[Run]:
        return [r for r in self.runs if read_results(r.run_dir) is None]

    def changed(self) -> list[Run]:
        """Finished runs whose results.json records another command than the plan's (the sweep
        file, the profile or the extra overrides changed since): kept, but worth a warning."""
        out = []
        for r in self.runs:
            recorded = (read_results(r.run_dir) or {}).get("command")
            if recorded and not recorded.endswith(" " + " ".join(r.args)):
                out.append(r)
        return out

    def sweep_command(self, command: str = "sweep") -> str:
        """The command that makes (or reports) this plan, for the report and the printed hints."""
        try:
            name = self.sweep.id if find_sweep(self.sweep.id) == self.sweep.path else _display_path(self.sweep.path)
        except SweepError:
            name = _display_path(self.sweep.path)
        parts = ["python", "-m", "reproductions", command, name, "--profile", self.profile.name]
        if self.seeds != (self.profile.seeds or self.sweep.seeds):
            parts += ["--seeds", str(len(self.seeds))] if self.seeds == list(range(len(self.seeds))) else []
        if self.root != Path("runs"):
            parts += ["--root", str(self.root)]
        if self.experiment != default_experiment(self.sweep, self.profile.name):
            parts += ["--experiment", self.experiment]
        return shlex.join(parts)


def default_experiment(sweep: Sweep, profile: str) -> str:
    return f"{sweep.id}-{profile}"


def _resolve_base(sweep: Sweep, base: str) -> Path:
    path = Path(base)
    for candidate in ([path] if path.is_absolute() else [REPO_ROOT / path, sweep.path.parent / path]):
        if candidate.is_file():
            return candidate.resolve()
    raise SweepError(f"{sweep.path}: base config {base!r} not found (looked under {REPO_ROOT} and {sweep.path.parent})")


def make_plan(
    sweep: Sweep | str | os.PathLike,
    profile: str = DEFAULT_PROFILE,
    *,
    seeds: int | None = None,
    root: str | os.PathLike = "runs",
    experiment: str | None = None,
    launcher: str = "local",
    devices: int | None = None,
    wandb: bool = False,
    project: str | None = None,
    extra: Sequence[str] = (),
    jobs: int | None = None,
    python: str = sys.executable,
) -> Plan:
    """Expand ``sweep`` at ``profile`` into runs (variant-major, then seeds)."""
    if not isinstance(sweep, Sweep):
        sweep = load_sweep(sweep)
    if launcher not in LAUNCHERS:
        raise SweepError(f"launcher={launcher!r} is not one of {list(LAUNCHERS)}")
    if devices is not None and devices < 1:
        raise SweepError(f"devices={devices} must be at least 1")
    prof = sweep.profile(profile)
    base = _resolve_base(sweep, prof.base or sweep.base)
    seed_list = list(range(seeds)) if seeds is not None else (prof.seeds or sweep.seeds)
    if seeds is not None and seeds < 1:
        raise SweepError(f"seeds={seeds} must be at least 1")
    variants = prof.variants or sweep.variants
    experiment = experiment or default_experiment(sweep, profile)
    root = Path(root)
    device_args: list[str] = []
    if devices is not None:
        device_args = ["--trainer.devices", str(devices)]
        if devices > 1:
            device_args += ["--trainer.strategy", "ddp"]
    tags = list(dict.fromkeys([sweep.axis, profile, sweep.id]))
    runs = []
    for variant in variants:
        config = _resolve_base(sweep, variant.base) if variant.base else base
        for seed in seed_list:
            args = [
                "fit", "--config", _display_path(config),
                *override_args({**sweep.overrides, **prof.overrides, **variant.overrides}),
                *device_args,
                "--seed_everything", str(seed),
                "--run.root", str(root),
                "--run.experiment", experiment,
                "--run.variant", variant.name,
                "--run.group", experiment,
                "--run.tags", json.dumps(tags),
                *(["--run.wandb", "true"] if wandb else []),
                *(["--run.project", project] if project else []),
                *extra,
            ]  # fmt: skip
            if launcher == "torchrun":
                nproc = str(devices or 1)
                command = [python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", nproc,
                           "-m", "reproductions", *args]
            else:
                command = [python, "-m", "reproductions", *args]
            runs.append(Run(variant, seed, root / experiment / variant.name / f"seed{seed}", args, command))
    if launcher == "local":
        jobs = jobs or prof.jobs or 1
    else:
        jobs = 1  # torchrun: one multi-process run at a time; slurm: the scheduler decides
    if jobs > 1 and devices is not None and devices > 1:
        raise SweepError(f"--jobs {jobs} with --devices {devices}: run multi-device runs one at a time")
    return Plan(sweep, prof, experiment, root, base, seed_list, variants, runs, jobs)


# --------------------------------------------------------------------------- progress


def format_duration(seconds: float) -> str:
    """0:00:42, 1:02:03 (h:mm:ss)."""
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def estimate_remaining(durations: Sequence[float], remaining_runs: int, jobs: int = 1) -> float | None:
    """Mean duration of the runs finished so far x the runs still to finish, over parallel jobs."""
    if not durations:
        return None
    if remaining_runs <= 0:
        return 0.0
    return sum(durations) / len(durations) * math.ceil(remaining_runs / max(1, jobs))


def progress_line(k: int, n: int, label: str, elapsed: float, durations: Sequence[float], jobs: int = 1) -> str:
    """``[run 3/26] learned_2d-stem seed1 | elapsed 0:01:23 | remaining ~0:05:10 (mean 41.5 s/run over 2)``.

    ``k`` counts this invocation's runs (skipped finished runs are not in ``n``); the estimate is
    the mean duration of the runs that ended so far times the runs not yet ended.
    """
    eta = estimate_remaining(durations, n - len(durations), jobs)
    if eta is None:
        remaining = "remaining ? (no run finished yet)"
    else:
        mean = sum(durations) / len(durations)
        remaining = f"remaining ~{format_duration(eta)} (mean {mean:.1f} s/run over {len(durations)})"
    return f"[run {k}/{n}] {label} | elapsed {format_duration(elapsed)} | {remaining}"


# --------------------------------------------------------------------------- running


@dataclass
class Outcome:
    run: Run
    returncode: int
    seconds: float
    finished: bool  # results.json says finished

    @property
    def failed(self) -> bool:
        return not self.finished


def run_env(jobs: int = 1, threads: int | None = None) -> dict[str, str]:
    """The runs' environment: the repository importable from any working directory, and the
    CPU threads per run (OMP_NUM_THREADS, unless already set): the profile's ``threads``, else
    with parallel jobs the cores split between them, since oversubscribed threads make small
    models many times slower."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("PYTHONUNBUFFERED", "1")
    if "OMP_NUM_THREADS" not in env:
        if threads:
            env["OMP_NUM_THREADS"] = str(threads)
        elif jobs > 1:
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // jobs))
    return env


def subprocess_runner(run: Run, env: dict[str, str]) -> int:
    """Run one command as a subprocess (isolates failures and memory); output to its stdout.log."""
    run.run_dir.mkdir(parents=True, exist_ok=True)
    with open(run.log_path, "w") as log:
        log.write(f"$ {shlex.join(run.command)}\n")
        log.flush()
        proc = subprocess.Popen(run.command, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            return proc.wait()
        except BaseException:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b.*")


def last_error(log_path: Path, limit: int = 300) -> str:
    """The most telling line of a failed run's log: the last ``XxxError: message`` line (skipping
    jsonargparse's generic wrapper around a constructor's error), else the last non-empty line."""
    try:
        lines = [line.rstrip() for line in log_path.read_text(errors="replace").splitlines()]
    except OSError:
        return "no log"
    errors = [ln for ln in lines if _EXCEPTION_LINE.match(ln) and "Does not validate against any of the" not in ln]
    text = (errors or [ln for ln in lines if ln.strip()] or ["empty log"])[-1]
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _metric_text(sweep: Sweep, run: Run) -> str:
    res = read_results(run.run_dir) or {}
    value = (res.get("test") or {}).get(sweep.metric.key)
    return f", {sweep.metric.key} = {value:.4f}" if isinstance(value, (int, float)) else ""


def execute(
    plan: Plan,
    runs: Sequence[Run],
    *,
    runner: Callable[[Run, dict[str, str]], int] = subprocess_runner,
    out: TextIO | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> list[Outcome]:
    """Run ``runs`` (``plan.jobs`` at a time), printing progress; never stops at a failure."""
    out = out or sys.stdout
    n = len(runs)
    env = run_env(plan.jobs, plan.profile.threads)
    lock = threading.Lock()
    durations: list[float] = []
    outcomes: list[Outcome] = []
    start = clock()

    def say(text: str) -> None:
        with lock:
            print(text, file=out, flush=True)

    def one(k: int, run: Run) -> Outcome:
        with lock:
            line = progress_line(k, n, run.label, clock() - start, durations, plan.jobs)
        say(f"{line}\n    log: {run.log_path}")
        t0 = clock()
        try:
            rc = runner(run, env)
        except Exception as e:  # a runner that cannot start the run (e.g. no such executable)
            run.run_dir.mkdir(parents=True, exist_ok=True)
            with open(run.log_path, "a") as log:
                log.write(f"\nsweep: could not run: {type(e).__name__}: {e}\n")
            rc = -1
        seconds = clock() - t0
        finished = read_results(run.run_dir) is not None
        outcome = Outcome(run, rc, seconds, finished)
        with lock:
            durations.append(seconds)
            outcomes.append(outcome)
        if finished and rc == 0:
            say(f"    done {run.label} in {seconds:.1f} s{_metric_text(plan.sweep, run)}")
        else:
            why = f"exit status {rc}" if rc != 0 else "exit status 0 but no finished results.json"
            say(f"    FAILED {run.label} ({why}) after {seconds:.1f} s: {last_error(run.log_path)}")
        return outcome

    if plan.jobs == 1:
        for k, run in enumerate(runs, 1):
            one(k, run)
    else:
        with ThreadPoolExecutor(max_workers=plan.jobs) as pool:
            futures = [pool.submit(one, k, run) for k, run in enumerate(runs, 1)]
            try:
                for f in futures:
                    f.result()
            except BaseException:
                for f in futures:
                    f.cancel()
                raise
    order = {id(r): i for i, r in enumerate(runs)}
    return sorted(outcomes, key=lambda o: order[id(o.run)])


# --------------------------------------------------------------------------- slurm


def slurm_script(plan: Plan, runs: Sequence[Run], devices: int | None = None, sbatch: Sequence[str] = ()) -> str:
    """A job-array script: one array task per pending run, ``devices`` GPUs (and tasks) per run.

    Lightning reads the ranks from SLURM (``srun``, one task per GPU). A task whose run finished
    meanwhile (results.json says so) exits at once, so the script can be resubmitted as is.
    """
    if not runs:
        raise SweepError("no pending runs: nothing to put in a job array")
    gpus = devices or 1
    exp_dir = plan.experiment_dir
    lines = [
        "#!/bin/bash",
        f"# Sweep {plan.sweep.id}, profile {plan.profile.name}: {len(runs)} pending runs of {len(plan.runs)}",
        f"# (experiment {plan.experiment}), one array task per run, {gpus} GPU(s) per task.",
        f"# Submit:      sbatch {shlex.quote(str(exp_dir / 'sweep.sbatch'))}",
        f"# When done:   {plan.sweep_command('report')}",
        f"#SBATCH --job-name={plan.experiment.replace('/', '-')}",
        f"#SBATCH --array=0-{len(runs) - 1}",
        "#SBATCH --nodes=1",
        f"#SBATCH --ntasks-per-node={gpus}",
        f"#SBATCH --gpus-per-node={gpus}",
        f"#SBATCH --output={exp_dir}/slurm/%A_%a.out",
        *[f"#SBATCH {opt}" for opt in sbatch],
        "set -euo pipefail",
        f"cd {shlex.quote(str(Path.cwd()))}",
        f'export PYTHONPATH={shlex.quote(str(REPO_ROOT))}"${{PYTHONPATH:+:$PYTHONPATH}}"',
        "",
        "RUN_DIRS=(",
        *[f"  {shlex.quote(str(r.run_dir))}" for r in runs],
        ")",
        "COMMANDS=(",
        *[f"  {shlex.quote(shlex.join(r.command))}" for r in runs],
        ")",
        "",
        'RUN_DIR="${RUN_DIRS[$SLURM_ARRAY_TASK_ID]}"',
        'if grep -qs \'"status": "finished"\' "$RUN_DIR/results.json"; then',
        '  echo "already finished: $RUN_DIR"; exit 0',
        "fi",
        'mkdir -p "$RUN_DIR"',
        'echo "$ ${COMMANDS[$SLURM_ARRAY_TASK_ID]}" > "$RUN_DIR/stdout.log"',
        'srun bash -c "${COMMANDS[$SLURM_ARRAY_TASK_ID]}" >> "$RUN_DIR/stdout.log" 2>&1',
        "",
    ]  # fmt: skip
    return "\n".join(lines)


# --------------------------------------------------------------------------- the command


def _split_extra(argv: list[str]) -> tuple[list[str], list[str]]:
    """Everything after ``--`` is passed to every run, as is."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m reproductions sweep",
        description="Run an ablation sweep: every variant x seed of a sweep file, each in its own run directory.",
        epilog="Extra overrides for every run go after '--' (e.g. -- --trainer.max_epochs 5); dotted options "
        "(--trainer.devices 8) are also passed through. Runs go to <root>/<sweep>-<profile>/<variant>/seed<k>/.",
        allow_abbrev=False,
    )
    p.add_argument("sweep", help="a sweep name (vit/position) or a sweep YAML file")
    p.add_argument("--profile", default=DEFAULT_PROFILE, help=f"scale: smoke, cpu or gpu (default {DEFAULT_PROFILE})")
    p.add_argument("--seeds", type=int, default=None, help="run seeds 0..N-1 (default: the profile's)")
    p.add_argument("--dry-run", action="store_true", help="print the commands (or the slurm script); run nothing")
    p.add_argument("--launcher", choices=LAUNCHERS, default="local")
    p.add_argument("--devices", type=int, default=None, help="devices per run (--trainer.devices; ddp when > 1)")
    p.add_argument("--jobs", type=int, default=None, help="local runs at once (default: the profile's, else 1)")
    p.add_argument("--root", default="runs", help="directory of all runs (default runs)")
    p.add_argument("--experiment", default=None, help="experiment name (default <sweep>-<profile>)")
    p.add_argument("--wandb", action="store_true", help="log every run (and the report) to W&B, grouped by sweep")
    p.add_argument("--project", default=None, help="W&B project (default: the runs' --run.project default)")
    p.add_argument("--sbatch", action="append", default=[], metavar="OPTION",
                   help="an extra #SBATCH line for --launcher slurm, e.g. --sbatch=--partition=gpu (repeatable)")
    p.add_argument("--no-report", action="store_true", help="do not write the report after the runs")
    return p


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    own, extra = _split_extra(list(argv))
    parser = build_parser()
    args, unknown = parser.parse_known_args(own)
    bad = [u for u in unknown if u.startswith("-") and "." not in u.split("=")[0]]
    if bad:
        parser.error(f"unrecognized arguments: {' '.join(bad)} (overrides for the runs go after '--')")
    return args, unknown + extra


def main(argv: Sequence[str] | None = None, *, runner=subprocess_runner, out: TextIO | None = None) -> int:
    """``python -m reproductions sweep ...``; returns the exit status (1 if any run failed)."""
    out = out or sys.stdout
    args, extra = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        plan = make_plan(
            args.sweep, args.profile, seeds=args.seeds, root=args.root, experiment=args.experiment,
            launcher=args.launcher, devices=args.devices, wandb=args.wandb, project=args.project, extra=extra,
            jobs=args.jobs,
        )  # fmt: skip
    except SweepError as e:
        print(f"sweep: {e}", file=sys.stderr)
        return 2
    finished = plan.finished()
    done = {id(r) for r in finished}
    pending = [r for r in plan.runs if id(r) not in done]
    print(
        f"sweep {plan.sweep.id} ({plan.sweep.title}), profile {plan.profile.name}: "
        f"{len(plan.variants)} variants x {len(plan.seeds)} seeds = {len(plan.runs)} runs; "
        f"{len(finished)} already finished (skipped), {len(pending)} to run"
        + (f", {plan.jobs} at a time" if plan.jobs > 1 and args.launcher == "local" else ""),
        file=out,
    )
    print(f"experiment {plan.experiment}: {plan.experiment_dir}/<variant>/seed<k>/", file=out)
    changed = plan.changed()
    if changed:
        print(
            f"warning: {len(changed)} finished runs were made with another command than this sweep would use "
            f"now (e.g. {changed[0].label}; see 'command' in its results.json): they are kept and skipped; "
            "delete their run directories to rerun them",
            file=out,
        )

    if args.launcher == "slurm":
        script = slurm_script(plan, pending, args.devices, args.sbatch) if pending else None
        if script is None:
            print("nothing to submit: every run has finished", file=out)
            return 0
        if args.dry_run:
            print(script, file=out)
            return 0
        path = plan.experiment_dir / "sweep.sbatch"
        atomic_write_text(path, script)
        path.chmod(0o755)
        print(f"wrote {path}: a job array of {len(pending)} runs\nsubmit with:  sbatch {path}", file=out)
        print(f"report after: {plan.sweep_command('report')}", file=out)
        return 0

    if args.dry_run:
        for k, run in enumerate(plan.runs, 1):
            state = "finished, skip" if id(run) in done else "run"
            print(f"# {k}/{len(plan.runs)} {run.label} ({state})\n{shlex.join(run.command)}", file=out)
        return 0

    started = time.monotonic()
    try:
        outcomes = execute(plan, pending, runner=runner, out=out)
    except KeyboardInterrupt:
        print(f"\ninterrupted: rerun the same command to continue ({plan.sweep_command()})", file=out)
        return 130
    failures = [o for o in outcomes if o.failed]
    print(
        f"\nsweep {plan.experiment}: {len(outcomes) - len(failures)} finished, {len(failures)} failed, "
        f"{len(finished)} skipped (already finished) in {format_duration(time.monotonic() - started)}",
        file=out,
    )
    if failures:
        print("failed runs (rerun the sweep to retry them; finished runs are skipped):", file=out)
        for o in failures:
            print(f"  {o.run.label}: exit status {o.returncode}; {last_error(o.run.log_path)}\n"
                  f"    log: {o.run.log_path}", file=out)  # fmt: skip
    if not args.no_report:
        from reproductions.report import write_report

        try:
            write_report(plan, wandb=args.wandb, out=out, **({"project": args.project} if args.project else {}))
        except Exception as e:  # the runs are safe on disk; the report can be rerun alone
            print(f"report failed: {type(e).__name__}: {e}\nrerun: {plan.sweep_command('report')}", file=out)
            return 1
    return 1 if failures else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

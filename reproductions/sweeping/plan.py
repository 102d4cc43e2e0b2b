"""The plan: a sweep at one profile expanded into runs, each with its run directory and command.

Where runs go: ``<root>/<paper>/<name>-<profile>/<variant>/seed<k>/`` (the experiment name
``<paper>/<name>-<profile>``, e.g. ``vit/position-cpu``), so profiles never mix. Every run is
``python -m reproductions fit --config <base> [--config <profile overlay> ...] <sweep, profile, variant overrides>
--seed_everything k --run.experiment <exp> --run.variant <variant> --run.group <exp>
--run.tags [axis, profile, sweep]`` (then ``--devices``/``--wandb`` options and the extra
overrides). Later overrides win: profile over sweep, variant over profile, extras over all.

The runs run in the repository root (``reproductions.sweeping.launch``), so the paths in their
commands are the ones this process sees only where it runs there too (the usual case): from
another directory the config and the runs' root are given to them absolute. Relative paths in
extra overrides are taken from the repository root.

Layer: ``spec`` < ``plan`` (this module) < ``launch``/``reuse`` < ``collect`` < ``tables``/``claims``/
``figures`` < ``report``/``claims_page``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from reproductions.run.errors import UsageError
from reproductions.run.results import read_results
from reproductions.sweeping.spec import (
    DEFAULT_PROFILE,
    REPO_ROOT,
    Profile,
    Sweep,
    SweepError,
    Variant,
    find_sweep,
    load_sweep,
)

LOG_FILE = "stdout.log"
LAUNCHERS = ("local", "torchrun", "slurm")
#: the count options of ``sweep`` and ``report``, and what to give instead of a count below 1
COUNT_HINTS = {
    "seeds": "give the number of seeds N, for seeds 0..N-1 (e.g. --seeds 3)",
    "jobs": "give a positive number of parallel runs (e.g. --jobs 2)",
    "devices": "give a positive number of devices per run (e.g. --devices 2)",
}


def check_counts(**counts: int | None) -> None:
    """Refuse a count option below 1 (``--jobs 0``, ``--seeds -1``) as a usage error naming it:
    0 is a value given, not "not given" (None), and never means "the default"."""
    for name, value in counts.items():
        if value is not None and value < 1:
            raise UsageError(f"--{name} {value} is not a positive number; {COUNT_HINTS[name]}")


def add_seed_options(parser: Any, verb: str) -> None:
    """``--seeds N`` (seeds 0..N-1) or ``--seed K`` (repeatable: those seeds alone), on ``repro
    sweep`` and ``repro report``. ``--seed`` adds seeds to a sweep whose other seeds are already
    run or recorded, without training those again."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--seeds", type=int, default=None, help=f"{verb} seeds 0..N-1, N >= 1 (default: the profile's)")
    group.add_argument("--seed", type=int, action="append", default=None, metavar="K",
                       help=f"{verb} seed K alone; repeat it for several (--seed 2 --seed 3), e.g. to add a seed "
                            "to runs already recorded")


def add_variant_option(parser: Any, verb: str) -> None:
    """``--variant NAME`` (repeatable) on ``repro sweep`` and ``repro report``: those variants alone."""
    parser.add_argument("--variant", action="append", default=None, metavar="NAME", dest="only",
                        help=f"{verb} variant NAME alone; repeat it for several (default: every variant of the profile)")


def chosen_seeds(args: Any) -> int | list[int] | None:
    """What ``add_seed_options`` parsed, checked: a count, a list of seeds, or None (the profile's).
    A bad value is a ``UsageError`` naming it."""
    check_counts(seeds=args.seeds)
    if args.seed is None:
        return args.seeds
    bad = [k for k in args.seed if k < 0]
    if bad:
        raise UsageError(f"--seed {bad[0]} is negative; seeds are 0, 1, 2, ...")
    repeated = sorted({k for k in args.seed if args.seed.count(k) > 1})
    if repeated:
        raise UsageError(f"--seed {repeated[0]} is given twice; give each seed once")
    return list(args.seed)


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


def run_path(path: str | os.PathLike) -> str:
    """A path as the runs see it. They run in the repository root: where this process runs
    there too, the path is kept as given; elsewhere a relative path is made absolute."""
    path = Path(path)
    if path.is_absolute() or Path.cwd().resolve() == REPO_ROOT:
        return str(path)
    return str(path.resolve())


@dataclass
class Run:
    variant: Variant
    seed: int
    run_dir: Path
    args: list[str]  # what follows ``python -m reproductions``
    command: list[str]  # the full command line (python or torchrun)
    resumes_at: int | None = None  # the step an interrupted attempt's checkpoint continues from

    def resuming(self, ckpt: Path, step: int) -> Run:
        """This run continuing its own interrupted attempt from ``ckpt`` (saved at ``step``)."""
        more = ["--ckpt_path", run_path(ckpt)]
        return replace(self, args=[*self.args, *more], command=[*self.command, *more], resumes_at=step)

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
            recorded = without_own_checkpoint((read_results(r.run_dir) or {}).get("command"), r.run_dir)
            if recorded and not recorded.endswith(" " + " ".join(r.args)):
                out.append(r)
        return out

    def sweep_command(self, command: str = "sweep") -> str:
        """The command that makes (or reports) this plan, for the report and the printed hints."""
        try:
            name = self.sweep.id if find_sweep(self.sweep.id) == self.sweep.path else _display_path(self.sweep.path)
        except SweepError:
            name = _display_path(self.sweep.path)
        parts = ["repro", command, name, "--profile", self.profile.name]
        if self.seeds != (self.profile.seeds or self.sweep.seeds):
            if self.seeds == list(range(len(self.seeds))):
                parts += ["--seeds", str(len(self.seeds))]
            else:
                parts += [word for seed in self.seeds for word in ("--seed", str(seed))]
        every = self.profile.variants or self.sweep.variants
        if len(self.variants) < len(every):
            parts += [word for v in self.variants for word in ("--variant", v.name)]
        if self.root != Path("runs"):
            parts += ["--root", str(self.root)]
        if self.experiment != default_experiment(self.sweep, self.profile.name):
            parts += ["--experiment", self.experiment]
        return shlex.join(parts)


def without_own_checkpoint(command: str | None, run_dir: Path) -> str | None:
    """A recorded command line less a trailing ``--ckpt_path`` into ``run_dir`` itself: the sweep
    resuming an interrupted attempt adds it, and the run is the same run."""
    from reproductions.run.ckpt_paths import in_run_dir  # torch, only when asked

    found = re.search(r" --ckpt_path (\S+)$", command or "")
    if found and in_run_dir(found.group(1), run_dir):
        return command[: found.start()]
    return command


def default_experiment(sweep: Sweep, profile: str) -> str:
    return f"{sweep.id}-{profile}"


def resolve_base(sweep: Sweep, base: str) -> Path:
    path = Path(base)
    for candidate in ([path] if path.is_absolute() else [REPO_ROOT / path, sweep.path.parent / path]):
        if candidate.is_file():
            return candidate.resolve()
    raise SweepError(f"{sweep.path}: base config {base!r} not found (looked under {REPO_ROOT} and {sweep.path.parent})")


def _seed_list(seeds: int | Sequence[int] | None, default: list[int]) -> list[int]:
    """The seeds a plan runs: ``default`` (the profile's) for None, ``0..n-1`` for a count ``n``,
    else the given distinct non-negative seeds; SweepError for anything else."""
    if seeds is None:
        return default
    if isinstance(seeds, int):
        if seeds < 1:
            raise SweepError(f"seeds={seeds} must be at least 1")
        return list(range(seeds))
    chosen = list(seeds)
    if not chosen or any(s < 0 for s in chosen) or len(set(chosen)) != len(chosen):
        raise SweepError(f"seeds {chosen} must be distinct seeds >= 0, at least one")
    return chosen


def make_plan(
    sweep: Sweep | str | os.PathLike,
    profile: str = DEFAULT_PROFILE,
    *,
    seeds: int | Sequence[int] | None = None,
    root: str | os.PathLike = "runs",
    experiment: str | None = None,
    launcher: str = "local",
    devices: int | None = None,
    wandb: bool = False,
    project: str | None = None,
    extra: Sequence[str] = (),
    jobs: int | None = None,
    python: str = sys.executable,
    only: Sequence[str] | None = None,
) -> Plan:
    """Expand ``sweep`` at ``profile`` into runs (variant-major, then seeds)."""
    if not isinstance(sweep, Sweep):
        sweep = load_sweep(sweep)
    if launcher not in LAUNCHERS:
        raise SweepError(f"launcher={launcher!r} is not one of {list(LAUNCHERS)}")
    if devices is not None and devices < 1:
        raise SweepError(f"devices={devices} must be at least 1")
    prof = sweep.profile(profile)
    if prof.report:  # the profile's report keys win: every reader of plan.sweep.report sees them
        sweep = replace(sweep, report={**sweep.report, **prof.report})
    seed_list = _seed_list(seeds, prof.seeds or sweep.seeds)
    if jobs is not None and jobs < 1:
        raise SweepError(f"jobs={jobs} must be at least 1")
    base = resolve_base(sweep, prof.base or sweep.base)
    variants = prof.variants or sweep.variants
    if only:
        names = [v.name for v in variants]
        unknown = [name for name in only if name not in names]
        if unknown:
            raise SweepError(f"--variant {unknown[0]!r} is not a variant of {sweep.id} at profile {profile}; "
                             f"its variants: {', '.join(names)}")
        variants = [v for v in variants if v.name in only]
    experiment = experiment or default_experiment(sweep, profile)
    root = Path(root)
    device_args: list[str] = []
    if devices is not None:
        device_args = ["--trainer.devices", str(devices)]
        if devices > 1:
            device_args += ["--trainer.strategy", "ddp"]
    tags = list(dict.fromkeys([sweep.axis, profile, sweep.id]))
    overlays: list[str] = []
    for c in prof.configs:
        overlays += ["--config", run_path(_display_path(resolve_base(sweep, c)))]
    runs = []
    for variant in variants:
        config = resolve_base(sweep, variant.base) if variant.base else base
        for seed in seed_list:
            args = [
                "fit", "--config", run_path(_display_path(config)), *overlays,
                *override_args({**sweep.overrides, **prof.overrides, **variant.overrides}),
                *device_args,
                "--seed_everything", str(seed),
                "--run.root", run_path(root),
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
        jobs = jobs if jobs is not None else (prof.jobs or 1)
    else:
        jobs = 1  # torchrun: one multi-process run at a time; slurm: the scheduler decides
    if jobs > 1 and devices is not None and devices > 1:
        raise SweepError(f"--jobs {jobs} with --devices {devices}: run multi-device runs one at a time")
    return Plan(sweep, prof, experiment, root, base, seed_list, variants, runs, jobs)

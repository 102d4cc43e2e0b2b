"""Collecting a plan's results: every run's ``results.json`` (and, for curves, its
``metrics.csv``) per variant, with the planned runs that have none and why.

``collect(plan)`` gives one ``VariantResults`` per planned variant (finished results of the
planned seeds plus any other finished ``seed<k>`` found on disk; the planned seeds without a
result, with the reason: not run, running now (a live lock), or failed or unfinished and the
last error of its log). A finished ``results.json`` that is not this run's (``foreign``: its
``experiment``, ``variant`` or ``seed`` name another run, as when a run directory of another
sweep was copied in, or it lacks the sweep's metric) is left out of the results (so of the
table, the means, the claim checks and the figures) and listed with the reason in ``rejected``
and ``missing``.
``Stat``/``mean_std`` are the mean and sample standard deviation the report shows.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from reproductions.run.curve import still_rising
from reproductions.run.results import RESULTS_FILE, metric_value, read_results, results_state, value_at
from reproductions.run.rundir import describe_holder, is_stale, read_holder
from reproductions.sweeping.launch import last_error
from reproductions.sweeping.plan import LOG_FILE, Plan
from reproductions.sweeping.floors import FLOORS_DIR, floor_of
from reproductions.sweeping.records import FLOORS_DIR_NAME, Record, is_number, records_of
from reproductions.sweeping.spec import Metric, Variant


@dataclass
class Stat:
    mean: float | None
    std: float | None  # sample standard deviation (n - 1); None when n < 2
    n: int
    rising: int = 0  # runs whose validation metric was still improving when they ended (run/curve.py)
    floor: float | None = None  # the runs' pixel logistic-regression floor on this metric (display units)


def mean_std(values: Sequence[float]) -> Stat:
    """Mean and sample standard deviation (ddof = 1) of the finite values."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    n = len(vals)
    if n == 0:
        return Stat(None, None, 0)
    mean = sum(vals) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1)) if n > 1 else None
    return Stat(mean, std, n)


@dataclass
class VariantResults:
    variant: Variant
    results: list[dict] = field(default_factory=list)  # finished runs, by seed
    missing: list[tuple[int, str]] = field(default_factory=list)  # planned seeds without a result
    rejected: list[tuple[int, str]] = field(default_factory=list)  # seeds whose results.json is not theirs
    floors_dir: Path = FLOORS_DIR  # the registry's pixel floors that ``column`` and the tables compare with

    def values(self, path: str) -> list[float]:
        out = []
        for r in self.results:
            v = value_at(r, path)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out.append(float(v))
        return out

    def stat(self, path: str) -> Stat:
        return mean_std(self.values(path))

    def metric(self, plan: Plan) -> Stat:
        """The sweep's metric in display units (e.g. accuracy in percent)."""
        return self.column(plan.sweep.metric)

    def column(self, m: Metric) -> Stat:
        """A metric column in display units (value x ``m.scale``), with how many of its runs were still
        rising and, for test accuracy, the runs' pixel floor (``FLOORED``)."""
        measured = [r for r in self.results if is_number(metric_value(r, m.key))]
        stat = mean_std([float(metric_value(r, m.key)) * m.scale for r in measured])
        floor = floor_of(measured, floors_dir=self.floors_dir) if m.key in FLOORED and measured else None
        return replace(stat, rising=sum(still_rising(r) for r in measured),
                       floor=None if floor is None else FLOORED[m.key](floor) * m.scale)

    def ceiling(self, m: Metric) -> Stat:
        """The data's ceiling for ``m`` (display units) as the results record it; n = 0 if none."""
        return mean_std([v * m.scale for v in self.values(m.ceiling)]) if m.ceiling else Stat(None, None, 0)

    def values_of_metric(self, key: str) -> list[float]:
        values = (metric_value(r, key) for r in self.results)
        return [float(v) for v in values if is_number(v)]

    def seeds(self) -> list[int]:
        return [int(r.get("seed", -1)) for r in self.results]


#: metrics that have a pixel floor, and the floor's value of each (a fraction of 1)
FLOORED = {"test/acc": lambda floor: floor["test_acc"]}


def _seed_of(path: Path) -> int | None:
    try:
        return int(path.name.removeprefix("seed")) if path.name.startswith("seed") else None
    except ValueError:
        return None


def running(run_dir: Path) -> dict | None:
    """The lock's holder if a live run holds ``run_dir`` (or one on another host, which cannot be
    checked from here); None if there is no lock, or a stale or unreadable one."""
    holder = read_holder(run_dir)
    return holder if holder and not is_stale(holder) else None


def foreign(results: dict, plan: Plan, variant: Variant, seed: int) -> str | None:
    """Why a finished ``results.json`` found at ``<experiment>/<variant>/seed<seed>`` does not
    belong there, or None: its ``experiment``, ``variant`` or ``seed`` name another run (a file
    copied in from another sweep), or it has no value of the sweep's metric. A name the file does
    not record is not held against it (the sweep's reuse copies rename theirs)."""
    wrong = [
        f"its {key} is {have!r}, not {want!r}"
        for key, want in (("experiment", plan.experiment), ("variant", variant.name), ("seed", seed))
        if (have := results.get(key)) is not None and have != want
    ]  # fmt: skip
    key = plan.sweep.metric.key
    value = metric_value(results, key)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        wrong.append(f"it has no {key} (the sweep's metric)")
    elif not math.isfinite(value):
        wrong.append(f"its {key} (the sweep's metric) is {value}")
    return "; ".join(wrong) or None


#: what names one run in its results (a run directory's results.json or a registry record)
RUN_IDENTITY = ("experiment", "variant", "seed", "host", "finished_at")


def run_identity(results: dict) -> tuple:
    return tuple(results.get(k) for k in RUN_IDENTITY)


def same_run(a: dict, b: dict) -> bool:
    """Whether two results (a run directory's, a registry record's) are one run."""
    return run_identity(a) == run_identity(b) and a.get("finished_at") is not None


def collect(plan: Plan, *, registry: str | os.PathLike | None = None, local: bool = True,
            read: Sequence[Record] | None = None, floors_dir: str | os.PathLike | None = None) -> list[VariantResults]:  # fmt: skip
    """Finished results per variant (planned seeds and any other finished seed on disk) and
    the planned runs without one, with the reason (not run / running now / failed or unfinished +
    last log line); a results.json that is not the run's (``foreign``) goes to ``rejected`` and
    ``missing`` instead of the results, whether its seed was planned or not.

    Each result says where it came from in ``source``: ``local`` (a run directory under the
    plan's root) or ``registry``. ``registry``: also the records of the results registry at that
    folder (``records``) for this sweep and profile (a record of a run also found locally counts
    once, as the record); ``local=False``: the registry's records alone. ``read``: the registry's
    records already read (``read_registry(registry)``), so a caller that needs them for every
    sweep and profile reads them once. ``floors_dir``: the pixel floors the results are compared
    with (default: the ``registry``'s, else the repository's)."""
    floors = Path(floors_dir) if floors_dir is not None else Path(registry) / FLOORS_DIR_NAME if registry is not None else FLOORS_DIR
    records: dict[str, list[dict]] = {}
    if registry is not None:
        mine = (records_of(plan.sweep.id, plan.profile.name, registry) if read is None else
                [r for r in read if r.data["sweep"] == plan.sweep.id and r.data["profile"] == plan.profile.name])
        for rec in mine:
            records.setdefault(rec.data["variant"], []).append(rec.results())
    out = []
    for variant in plan.variants:
        vr = _collect_local(plan, variant) if local else VariantResults(variant)
        vr.floors_dir = floors
        for rec in records.get(variant.name, []):  # a local run that is a record counts once, as the record
            vr.results = [r for r in vr.results if not same_run(rec, r)] + [rec]
        vr.results.sort(key=lambda r: (int(r.get("seed", -1)), r.get("source") != "local"))
        done = {int(r.get("seed", -1)) for r in vr.results}
        vr.missing = [(seed, why) for seed, why in vr.missing if seed not in done or (seed, why) in vr.rejected]
        if not local:
            vr.missing = [(seed, "no record") for seed in plan.seeds if seed not in done]
        out.append(vr)
    return out


def _collect_local(plan: Plan, variant: Variant) -> VariantResults:
    """One variant's run directories under the plan's root (see ``collect``)."""
    vdir = plan.experiment_dir / variant.name
    seeds = list(plan.seeds)
    if vdir.is_dir():
        seeds += sorted(s for s in (_seed_of(p) for p in vdir.iterdir() if p.is_dir()) if s is not None and s not in seeds)
    vr = VariantResults(variant)
    for seed in sorted(seeds):
        run_dir = vdir / f"seed{seed}"
        res = read_results(run_dir)
        why_not = foreign(res, plan, variant, seed) if res is not None else None
        if why_not is not None:
            why = (f"{RESULTS_FILE} does not belong to this sweep's run ({why_not}): left out of the table, "
                   "the means and the ratios; move it to its own run directory or delete it")
            vr.rejected.append((seed, why))
            vr.missing.append((seed, why))
        elif res is not None:
            vr.results.append({**res, "source": "local"})
        elif seed in plan.seeds:
            if not run_dir.exists():
                vr.missing.append((seed, "not run"))
            elif results_state(run_dir)[0] == "corrupt":
                vr.missing.append((seed, f"corrupt {RESULTS_FILE} (not a complete JSON object): delete it and rerun"))
            elif (holder := running(run_dir)) is not None:
                vr.missing.append((seed, f"running now ({describe_holder(holder)})"))
            else:
                log = run_dir / LOG_FILE
                why = last_error(log) if log.exists() else "no results.json and no stdout.log"
                vr.missing.append((seed, f"failed or unfinished: {why}"))
    return vr


def run_curve(plan: Plan, results: dict, x: str, y: str) -> list[tuple[float, float]]:
    """(x, y) pairs of one run's validations that have both values (e.g. the wall time since fit
    started and the validation accuracy), in order: a registry record's ``curve``, else the rows
    of the run's metrics.csv."""
    curve = results.get("curve")
    if isinstance(curve, dict) and results.get("source") == "registry":
        cols = curve.get("columns") or []
        if x not in cols or y not in cols:
            return []
        i, j = cols.index(x), cols.index(y)
        return [(float(row[i]), float(row[j])) for row in curve.get("rows") or [] if row[i] is not None and row[j] is not None]
    path = plan.experiment_dir / str(results.get("variant")) / f"seed{results.get('seed')}" / "metrics.csv"
    if not path.exists():
        return []
    out = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            try:
                out.append((float(row[x]), float(row[y])))
            except (KeyError, TypeError, ValueError):
                continue
    return out


def curve_keys(plan: Plan) -> tuple[str, str]:
    """The metrics.csv columns of the report's curves: ``report.x`` (default the wall seconds
    since fit started) and ``report.y`` (default the validation accuracy)."""
    rep = plan.sweep.report
    return str(rep.get("x", "time/fit_elapsed_s")), str(rep.get("y", "val/acc"))


def by_name(collected: list[VariantResults]) -> dict[str, VariantResults]:
    return {vr.variant.name: vr for vr in collected}

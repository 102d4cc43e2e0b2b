"""Reports: a sweep's results.json files as one Markdown table beside the paper, and figures.

    python -m reproductions report vit/position --profile cpu [--seeds N] [--root runs] [--wandb]

Reads every ``results.json`` under ``<root>/<sweep>-<profile>/`` (the planned seeds, plus any
other finished ``seed<k>`` found there), and writes, atomically, into that directory:

- ``report.md``: how the runs were made (sweep, profile, command, base config, data, code
  version), the paper's reference and claims, the table (variant, our metric mean ± sample
  std over n seeds, the sweep file's extra metric ``columns``, the paper's value per
  reference column, parameters, GFLOPs per image, total training FLOPs, training images/s,
  training time per run), the numbers the claims are about, the figure, and every planned
  run that is missing or failed (never dropped silently: a variant without results stays in
  the table with n = 0);
- ``<axis>.png``: the sweep file's ``report.plot``:
    ``accuracy_vs_flops``  accuracy against GFLOPs per image and against total training FLOPs
                           (patch size);
    ``bars``               one bar per variant with ± std error bars (position; with
                           ``speed: true`` a second panel of training images/s: attention;
                           ``panels: [test/gauc, ...]`` a panel per further metric column;
                           a dashed line at a column's ceiling when the data records one);
    ``grouped_bars``       bars grouped by ``report.x`` (e.g. the learning rate), one colour per
                           ``report.hue`` (e.g. cls/gap): pooling;
    ``lines``              one line per ``report.hue`` (e.g. the model family) against ``report.x``
                           (a variant axis such as train_samples, or a results.json path such as
                           training.total_train_flops; log scale unless ``logx: false``), a panel
                           for the metric and one per ``report.panels`` column: hybrid, data size;
    ``curves``             every run's metrics.csv: ``report.y`` (default val/acc) against
                           ``report.x`` (default time/fit_elapsed_s, wall seconds since fit
                           started), with ``report.target`` and ``report.budget_s`` lines:
                           time to accuracy.

The sweep file's ``report.check`` picks the claim summary: ``halving`` (compute ratio and
accuracy gain per step of ``report.param``, e.g. patch size), ``baseline`` (gap between
``report.baseline`` and the others, and their spread), ``best_per_group`` (best ``report.x``
per ``report.hue`` and the gap at the best and at a shared value), ``gaps`` (for each pair
``[a, b]`` of ``report.pairs``, values of ``report.hue``: a - b at each value of ``report.along``
for the metric and the ``report.panels`` columns, and whether the gap shrinks),
``time_to_target`` (per run: when the validation curve first reached ``report.target`` and
whether the test metric reached it within ``report.budget_s``), ``speed`` (accuracy and
throughput against ``report.baseline``), ``ordering`` (our ranking against the claimed
orders ``report.orders``, chains of variant names best first, or ``{label, order}`` to say
whose claim it is, pair by pair with standard errors; with ``report.order_reference`` the pairs
ordered as that paper column orders them; the distance of each variant to the ceiling).

More report options (``report:`` in the sweep file): ``unit`` (what one input is called in the
compute columns, default ``image``: ``GFLOPs/image``, ``train images/s``); ``flops: si`` (FLOPs
per input as 1.2M rather than in GFLOPs, for small nets); ``relaimpr:
{baseline: WDL}`` adds a RelaImpr column against that variant, from the main metric's means
(RelaImpr = ((AUC - 0.5) / (AUC_base - 0.5) - 1) x 100%, as DIN and BST report it). A metric
with a ``ceiling`` (a results.json path such as ``data.ceiling.test_auc``; the synthetic CTR
data records the AUC of its own true click probabilities) adds a "to ceiling" column for the
main metric and a ceiling row.

With ``--wandb`` the same table and figure go to W&B as a ``report`` run in the sweep's group
(offline unless a key is configured, the rule of ``reproductions.tracking.wandb_offline``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from reproductions.results import read_results
from utils.atomic import atomic_savefig, atomic_write_text
from reproductions.sweep import (
    DEFAULT_PROFILE,
    LOG_FILE,
    Metric,
    Plan,
    Reference,
    SweepError,
    Variant,
    cli_value,
    last_error,
    make_plan,
)

REPORT_FILE = "report.md"
PLOTS = ("bars", "grouped_bars", "accuracy_vs_flops", "lines", "curves")
CHECKS = ("halving", "baseline", "best_per_group", "speed", "ordering", "gaps", "time_to_target")


# --------------------------------------------------------------------------- collecting


@dataclass
class Stat:
    mean: float | None
    std: float | None  # sample standard deviation (n - 1); None when n < 2
    n: int


def mean_std(values: Sequence[float]) -> Stat:
    """Mean and sample standard deviation (ddof = 1) of the finite values."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    n = len(vals)
    if n == 0:
        return Stat(None, None, 0)
    mean = sum(vals) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1)) if n > 1 else None
    return Stat(mean, std, n)


def _get(d: dict, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


@dataclass
class VariantResults:
    variant: Variant
    results: list[dict] = field(default_factory=list)  # finished runs, by seed
    missing: list[tuple[int, str]] = field(default_factory=list)  # planned seeds without a result

    def values(self, path: str) -> list[float]:
        out = []
        for r in self.results:
            v = _get(r, path)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out.append(float(v))
        return out

    def stat(self, path: str) -> Stat:
        return mean_std(self.values(path))

    def metric(self, plan: Plan) -> Stat:
        """The sweep's metric in display units (e.g. accuracy in percent)."""
        return self.column(plan.sweep.metric)

    def column(self, m: Metric) -> Stat:
        """A metric column in display units (value x ``m.scale``)."""
        return mean_std([v * m.scale for v in self.values_of_metric(m.key)])

    def ceiling(self, m: Metric) -> Stat:
        """The data's ceiling for ``m`` (display units) as the results record it; n = 0 if none."""
        return mean_std([v * m.scale for v in self.values(m.ceiling)]) if m.ceiling else Stat(None, None, 0)

    def values_of_metric(self, key: str) -> list[float]:
        return [float(r["test"][key]) for r in self.results if isinstance((r.get("test") or {}).get(key), (int, float))]

    def seeds(self) -> list[int]:
        return [int(r.get("seed", -1)) for r in self.results]


def _seed_of(path: Path) -> int | None:
    try:
        return int(path.name.removeprefix("seed")) if path.name.startswith("seed") else None
    except ValueError:
        return None


def collect(plan: Plan) -> list[VariantResults]:
    """Finished results per variant (planned seeds and any other finished seed on disk) and
    the planned runs without one, with the reason (not run / failed or unfinished + last log line)."""
    out = []
    for variant in plan.variants:
        vdir = plan.experiment_dir / variant.name
        seeds = list(plan.seeds)
        if vdir.is_dir():
            seeds += sorted(s for s in (_seed_of(p) for p in vdir.iterdir() if p.is_dir()) if s is not None and s not in seeds)
        vr = VariantResults(variant)
        for seed in sorted(seeds):
            run_dir = vdir / f"seed{seed}"
            res = read_results(run_dir)
            if res is not None:
                vr.results.append(res)
            elif seed in plan.seeds:
                if not run_dir.exists():
                    vr.missing.append((seed, "not run"))
                else:
                    log = run_dir / LOG_FILE
                    why = last_error(log) if log.exists() else "no results.json and no stdout.log"
                    vr.missing.append((seed, f"failed or unfinished: {why}"))
        out.append(vr)
    return out


# --------------------------------------------------------------------------- formatting


def fmt_stat(stat: Stat, digits: int = 2) -> str:
    if stat.mean is None:
        return "–"
    if stat.std is None:
        return f"{stat.mean:.{digits}f}"
    return f"{stat.mean:.{digits}f} ± {stat.std:.{digits}f}"


def fmt_si(value: float | None, unit: str = "") -> str:
    """1234 -> 1.23k; 7.3e11 -> 731 G (three significant figures)."""
    if value is None:
        return "–"
    for factor, prefix in ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}" if unit else f"{value / factor:.3g}{prefix}"
    return f"{value:.3g} {unit}" if unit else f"{value:.3g}"


def fmt_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    if seconds < 90:
        return f"{seconds:.1f} s"
    minutes, s = divmod(int(round(seconds)), 60)
    if minutes < 90:
        return f"{minutes} min {s:02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def paper_value(ref: Reference, value: float, metric: Metric = Metric()) -> float:
    """A paper value in the metric's display units: a ``fraction`` (0.7894) times the metric's
    scale, a ``percent`` (78.94) times scale / 100 (so percent metrics show 78.94 both ways, and
    a metric shown as a fraction shows 0.7894)."""
    return value * (metric.scale if ref.scale == "fraction" else metric.scale / 100)


def fmt_paper(ref: Reference, variant: Variant, metric: Metric = Metric()) -> str:
    pv = variant.paper.get(ref.key)
    if pv is None:
        return "–"
    text = f"{paper_value(ref, pv.value, metric):.{metric.digits}f}"
    return text + " (unverified)" if (pv.unverified or ref.unverified) else text


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _unit(plan: Plan) -> str:
    return str(plan.sweep.report.get("unit", "image"))


def relaimpr_spec(plan: Plan) -> dict | None:
    """``report.relaimpr`` ({baseline: <variant>}) checked against the sweep's variants, or None."""
    spec = plan.sweep.report.get("relaimpr")
    if spec is None:
        return None
    if not isinstance(spec, dict) or "baseline" not in spec:
        raise SweepError(f"{plan.sweep.path}: report.relaimpr must be {{baseline: <variant name>}}, got {spec!r}")
    if spec["baseline"] not in {v.name for v in plan.variants}:
        raise SweepError(
            f"{plan.sweep.path}: report.relaimpr.baseline={spec['baseline']!r} is not a variant of profile "
            f"{plan.profile.name!r}: {[v.name for v in plan.variants]}"
        )
    return spec


def relaimpr(value: float | None, base: float | None) -> float | None:
    """RelaImpr in percent of a raw metric mean against the baseline's (None when undefined)."""
    if value is None or base is None or base <= 0.5:
        return None
    from lightning_modules.ctr import rela_impr

    return rela_impr(value, base)


def ceiling_value(collected: list[VariantResults], m: Metric) -> Stat:
    """The ceiling of metric ``m`` over every finished run (one data set: one value)."""
    return mean_std([v * m.scale for vr in collected for v in (vr.values(m.ceiling) if m.ceiling else [])])


def table(plan: Plan, collected: list[VariantResults]) -> tuple[list[str], list[list[str]]]:
    """The report table: header and rows (strings), one row per planned variant, and a last
    ceiling row when the main metric has a ceiling that the results record."""
    sweep = plan.sweep
    m, columns, unit = sweep.metric, sweep.columns, _unit(plan)
    rel = relaimpr_spec(plan)
    header = ["variant", f"ours: {m.label}, mean ± std", "n"]
    header += [f"{c.label}, mean ± std" for c in columns]
    if rel:
        header.append(f"RelaImpr vs {rel['baseline']} (%)")
    if m.ceiling:
        header.append(f"to ceiling ({m.label})")
    header += [ref.label for ref in sweep.references]
    si_flops = plan.sweep.report.get("flops") == "si"
    header += ["params", f"{'FLOPs' if si_flops else 'GFLOPs'}/{unit}", "training FLOPs", f"train {unit}s/s", "time/run"]
    by = _by_name(collected)
    base_raw = mean_std(by[rel["baseline"]].values_of_metric(m.key)).mean if rel else None
    ceiling = ceiling_value(collected, m)
    rows = []
    for vr in collected:
        flops = vr.stat("model.flops_per_sample").mean
        stat = vr.metric(plan)
        row = [vr.variant.name, fmt_stat(stat, m.digits), str(len(vr.values_of_metric(m.key)))]
        row += [fmt_stat(vr.column(c), c.digits) for c in columns]
        if rel:
            ri = relaimpr(mean_std(vr.values_of_metric(m.key)).mean, base_raw)
            row.append("–" if ri is None else f"{ri:+.2f}")
        if m.ceiling:
            gap = None if ceiling.mean is None or stat.mean is None else ceiling.mean - stat.mean
            row.append("–" if gap is None else f"{gap:.{m.digits}f}")
        row += [fmt_paper(ref, vr.variant, m) for ref in sweep.references]
        params = vr.stat("model.params").mean
        row += [
            fmt_si(params),
            "–" if flops is None else (fmt_si(flops) if si_flops else f"{flops / 1e9:.3g}"),
            fmt_si(vr.stat("training.total_train_flops").mean, "FLOP"),
            fmt_stat(vr.stat("training.samples_per_sec"), 0),
            fmt_seconds(vr.stat("training.fit_time_s").mean),
        ]
        rows.append(row)
    if ceiling.mean is not None:
        row = [str(sweep.report.get("ceiling_label", "ceiling")), f"{ceiling.mean:.{m.digits}f}", "–"]
        row += ["–" if c.ceiling is None else fmt_stat(Stat(ceiling_value(collected, c).mean, None, 1), c.digits)
                for c in columns]  # fmt: skip
        if rel:
            ri = relaimpr(ceiling.mean / m.scale, base_raw)
            row.append("–" if ri is None else f"{ri:+.2f}")
        row.append(f"{0.0:.{m.digits}f}")
        row += ["–"] * (len(header) - len(row))
        rows.append(row)
    return header, rows


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(_md_cell(h) for h in header) + " |"]
    lines.append("|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|")
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def text_table(header: list[str], rows: list[list[str]]) -> str:
    """The table for a terminal: aligned columns."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    fmt = lambda cells: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
    return "\n".join([fmt(header), "  ".join("-" * w for w in widths), *[fmt(r) for r in rows]])


# --------------------------------------------------------------------------- claims


def _by_name(collected: list[VariantResults]) -> dict[str, VariantResults]:
    return {vr.variant.name: vr for vr in collected}


def _pm(stat: Stat, m: Metric = Metric()) -> str:
    return fmt_stat(stat, m.digits) if stat.mean is not None else "no result"


def _std_error(a: Stat, b: Stat) -> float | None:
    """Standard error of b.mean - a.mean (independent runs) when both have n >= 2."""
    if a.std is None or b.std is None:
        return None
    return math.sqrt(a.std**2 / a.n + b.std**2 / b.n)


def _delta(a: Stat, b: Stat, m: Metric = Metric()) -> str:
    """b - a in the metric's unit (points), with the combined standard error when both have n >= 2."""
    if a.mean is None or b.mean is None:
        return "n/a"
    d = b.mean - a.mean
    d = 0.0 if abs(d) < 0.5 * 10**-m.digits else d  # no "-0.00"
    unit = f" {m.unit}" if m.unit else ""
    se = _std_error(a, b)
    if se is not None:
        return f"{d:+.{m.digits}f}{unit} (± {se:.{m.digits}f} s.e.)"
    return f"{d:+.{m.digits}f}{unit}"


def check_halving(plan: Plan, collected: list[VariantResults]) -> list[str]:
    param = plan.sweep.report.get("param", plan.sweep.axis)
    points = []
    for vr in collected:
        value = vr.variant.axes.get(param)
        flops = vr.stat("model.flops_per_sample").mean
        if isinstance(value, (int, float)) and flops:
            points.append((float(value), flops, vr.metric(plan), vr.variant.name))
    points.sort(reverse=True)  # large patches (cheap) first
    lines = []
    for (p1, f1, s1, n1), (p2, f2, s2, n2) in zip(points, points[1:]):
        lines.append(
            f"{param} {p1:g} -> {p2:g} (side x{p2 / p1:.2f}): GFLOPs/image x{f2 / f1:.2f}, "
            f"accuracy {_pm(s1)} -> {_pm(s2)}: {_delta(s1, s2)}"
        )
    return lines


def check_baseline(plan: Plan, collected: list[VariantResults]) -> list[str]:
    base_name = plan.sweep.report.get("baseline")
    by = _by_name(collected)
    if base_name not in by:
        return [f"(no baseline variant {base_name!r} in this sweep)"]
    m = plan.sweep.metric
    base = by[base_name].metric(plan)
    others = [(vr.variant.name, vr.metric(plan)) for vr in collected if vr.variant.name != base_name]
    others = [(n, s) for n, s in others if s.mean is not None]
    if base.mean is None or not others:
        return ["not enough results yet"]
    best = max(others, key=lambda x: x[1].mean)
    worst = min(others, key=lambda x: x[1].mean)
    unit = f" {m.unit}" if m.unit else ""
    return [
        f"{base_name}: {_pm(base, m)}; best other, {best[0]}: {_pm(best[1], m)}: gap {_delta(base, best[1], m)}; "
        f"worst other, {worst[0]}: {_pm(worst[1], m)}: gap {_delta(base, worst[1], m)}",
        f"spread among the {len(others)} other variants (best - worst mean): "
        f"{best[1].mean - worst[1].mean:.{m.digits}f}{unit}",
    ]


def _axis_sort_key(value: Any) -> tuple:
    return (0, float(value), "") if isinstance(value, (int, float)) else (1, 0.0, str(value))


def check_best_per_group(plan: Plan, collected: list[VariantResults]) -> list[str]:
    x, hue = plan.sweep.report.get("x"), plan.sweep.report.get("hue")
    groups: dict[Any, dict[Any, Stat]] = {}
    for vr in collected:
        if x in vr.variant.axes and hue in vr.variant.axes:
            groups.setdefault(vr.variant.axes[hue], {})[vr.variant.axes[x]] = vr.metric(plan)
    lines, best = [], {}
    for h, by_x in groups.items():
        done = {k: s for k, s in by_x.items() if s.mean is not None}
        if not done:
            lines.append(f"{hue}={h}: no results")
            continue
        bx = max(done, key=lambda k: done[k].mean)
        best[h] = done[bx]
        lines.append(f"{hue}={h}: best {x}={bx} with {_pm(done[bx])}")
    if len(best) == 2:
        (h1, s1), (h2, s2) = best.items()
        lines.append(f"at each one's best {x}: {hue}={h2} - {hue}={h1}: {_delta(s1, s2)}")
        shared = sorted(set.intersection(*(set(v) for v in groups.values())), key=_axis_sort_key)
        for xv in shared:
            a, b = groups[h1][xv], groups[h2][xv]
            lines.append(f"at the shared {x}={xv}: {hue}={h2} - {hue}={h1}: {_delta(a, b)}")
    return lines


def check_speed(plan: Plan, collected: list[VariantResults]) -> list[str]:
    base_name = plan.sweep.report.get("baseline")
    by = _by_name(collected)
    if base_name not in by:
        return [f"(no baseline variant {base_name!r} in this sweep)"]
    base = by[base_name]
    lines = []
    for vr in collected:
        if vr is base:
            continue
        speed_b, speed_v = base.stat("training.samples_per_sec"), vr.stat("training.samples_per_sec")
        ratio = f"x{speed_b.mean / speed_v.mean:.2f}" if speed_b.mean and speed_v.mean else "n/a"
        lines.append(
            f"{vr.variant.name} vs {base_name}: accuracy {_delta(base.metric(plan), vr.metric(plan), plan.sweep.metric)}; "
            f"{base_name} trains {ratio} as many {_unit(plan)}s/s ({fmt_stat(speed_b, 0)} vs {fmt_stat(speed_v, 0)})"
        )
    return lines


def _chains(plan: Plan) -> list[tuple[str, list[str]]]:
    """The claimed orders to check: ``report.orders`` (chains of variant names, best first) and,
    with ``report.order_reference``, the order of that paper column's values."""
    rep, sweep = plan.sweep.report, plan.sweep
    names = {v.name for v in plan.variants}
    chains = []
    for i, item in enumerate(rep.get("orders") or []):
        label, chain = ("claimed", item) if not isinstance(item, dict) else (str(item.get("label", "claimed")), item.get("order"))
        if not isinstance(chain, list) or len(chain) < 2 or any(c not in names for c in chain):
            raise SweepError(
                f"{sweep.path}: report.orders[{i}]={item!r} must list at least two variant names of profile "
                f"{plan.profile.name!r} (best first), or be {{label, order: [...]}}: {sorted(names)}"
            )
        chains.append((label, [str(c) for c in chain]))
    ref = rep.get("order_reference")
    if ref is not None:
        if ref not in {r.key for r in sweep.references}:
            raise SweepError(f"{sweep.path}: report.order_reference={ref!r} is not a reference column")
        valued = [(v.paper[ref].value, v.name) for v in plan.variants if ref in v.paper]
        chains.append((f"by the {ref} column", [n for _, n in sorted(valued, reverse=True)]))
    return chains


def check_ordering(plan: Plan, collected: list[VariantResults]) -> list[str]:
    """Our ranking against the claimed orders, pair by pair, and each variant's distance to the ceiling."""
    m = plan.sweep.metric
    by = _by_name(collected)
    done = sorted(((vr.metric(plan), vr.variant.name) for vr in collected if vr.metric(plan).mean is not None),
                  key=lambda x: -x[0].mean)  # fmt: skip
    if not done:
        return ["not enough results yet"]
    lines = ["our order (mean " + m.label + "): " + " > ".join(f"{n} ({s.mean:.{m.digits}f})" for s, n in done)]
    for source, chain in _chains(plan):
        stats = [by[n].metric(plan) for n in chain]
        pairs, agree = 0, 0
        for i in range(len(chain)):
            for j in range(i + 1, len(chain)):
                if stats[i].mean is not None and stats[j].mean is not None:
                    pairs += 1
                    agree += stats[i].mean > stats[j].mean
        lines.append(f"{source}: {' > '.join(chain)}: {agree} of {pairs} pairs in that order here")
        for (a, sa), (b, sb) in zip(zip(chain, stats), zip(chain[1:], stats[1:])):
            if sa.mean is None or sb.mean is None:
                lines.append(f"  {a} > {b}? no result")
                continue
            se = _std_error(sb, sa)
            d = sa.mean - sb.mean
            verdict = "yes" if d > 0 else "no"
            if se is not None and abs(d) < 2 * se:
                verdict += ", within 2 s.e."
            lines.append(f"  {a} > {b}? {verdict}: {a} - {b} = {_delta(sb, sa, m)}")
    ceiling = ceiling_value(collected, m)
    if ceiling.mean is not None:
        gaps = ", ".join(f"{n} {ceiling.mean - s.mean:.{m.digits}f}" for s, n in done)
        lines.append(f"ceiling {ceiling.mean:.{m.digits}f} ({m.label} of the true probabilities); distance to it: {gaps}")
    return lines


def panel_metrics(plan: Plan) -> list[Metric]:
    """The metric columns named by ``report.panels`` (beyond the main metric), in that order; a
    name that is not a metric column is an error."""
    by_key = {c.key: c for c in [plan.sweep.metric, *plan.sweep.columns]}
    panels = plan.sweep.report.get("panels") or []
    unknown = [k for k in panels if k not in by_key]
    if unknown:
        raise SweepError(f"{plan.sweep.path}: report.panels {unknown} are not metric columns: {list(by_key)}")
    return [by_key[k] for k in panels if k != plan.sweep.metric.key]


def _axis_order(plan: Plan, axis: str) -> list[Any]:
    """The values of ``axis`` over the plan's variants: numbers ascending, names in sweep-file order."""
    values = list(dict.fromkeys(v.axes[axis] for v in plan.variants if axis in v.axes))
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return sorted(values)
    return values


def check_gaps(plan: Plan, collected: list[VariantResults]) -> list[str]:
    """``report.pairs`` ([[a, b], ...] values of ``report.hue``): a - b at each value of
    ``report.along`` (model size, training-set size), for the main metric and the ``report.panels``
    columns, with the compute ratio, and whether the gap shrinks from the first to the last value."""
    rep = plan.sweep.report
    hue, along = rep.get("hue"), rep.get("along")
    pairs = rep.get("pairs") or []
    hues = _axis_order(plan, hue) if hue else []
    if not hue or not along or not pairs or any(not isinstance(pr, list) or len(pr) != 2 or set(pr) - set(hues) for pr in pairs):
        raise SweepError(f"{plan.sweep.path}: report.check=gaps needs report.hue and report.along (variant axes) and "
                         f"report.pairs, a list of [a, b] values of {hue!r}: {hues}")  # fmt: skip
    metrics = [plan.sweep.metric, *panel_metrics(plan)]
    cell = {(vr.variant.axes.get(hue), vr.variant.axes.get(along)): vr for vr in collected}
    lines = []
    for a, b in pairs:
        for m in metrics:
            gaps = []
            for xv in _axis_order(plan, along):
                va, vb = cell.get((a, xv)), cell.get((b, xv))
                if va is None or vb is None:
                    continue
                sa, sb = va.column(m), vb.column(m)
                fa, fb = va.stat("model.flops_per_sample").mean, vb.stat("model.flops_per_sample").mean
                ratio = f"; FLOPs/{_unit(plan)} x{fa / fb:.2f}" if fa and fb else ""
                lines.append(f"{m.label}, {along}={xv}: {a} - {b} = {_delta(sb, sa, m)} ({_pm(sa, m)} vs {_pm(sb, m)}{ratio})")
                if sa.mean is not None and sb.mean is not None:
                    gaps.append((xv, sa.mean - sb.mean))
            if len(gaps) >= 2:
                (x0, g0), (x1, g1) = gaps[0], gaps[-1]
                trend = "shrinks" if abs(g1) < abs(g0) else "grows"
                if (g0 > 0) != (g1 > 0) and g0 != 0 and g1 != 0:
                    trend = "changes sign"
                lines.append(f"  -> {m.label}: {a} - {b} {trend} from {g0:+.{m.digits}f} at {along}={x0} "
                             f"to {g1:+.{m.digits}f} at {along}={x1}")  # fmt: skip
    return lines or ["not enough results yet"]


def run_curve(plan: Plan, variant: Variant, seed: int, x: str, y: str) -> list[tuple[float, float]]:
    """(x, y) pairs of one run's metrics.csv rows that have both columns (e.g. the wall time since
    fit started and the validation accuracy of each validation), in file order."""
    import csv

    path = plan.experiment_dir / variant.name / f"seed{seed}" / "metrics.csv"
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


def _curve_keys(plan: Plan) -> tuple[str, str]:
    rep = plan.sweep.report
    return str(rep.get("x", "time/fit_elapsed_s")), str(rep.get("y", "val/acc"))


def check_time_to_target(plan: Plan, collected: list[VariantResults]) -> list[str]:
    """Per variant: when each run's validation curve first reached ``report.target`` (a fraction,
    e.g. 0.92) on ``report.x`` (wall seconds since fit started), and its test metric against the
    target after the whole run, within ``report.budget_s`` or not."""
    rep = plan.sweep.report
    target, budget = rep.get("target"), rep.get("budget_s")
    if not isinstance(target, (int, float)):
        raise SweepError(f"{plan.sweep.path}: report.check=time_to_target needs report.target (e.g. 0.92)")
    x, y = _curve_keys(plan)
    m = plan.sweep.metric
    lines = []
    for vr in collected:
        for r in vr.results:
            seed = int(r.get("seed", -1))
            curve = run_curve(plan, vr.variant, seed, x, y)
            hit = next((t for t, v in curve if v >= target), None)
            test = (r.get("test") or {}).get(m.key)
            fit_s = _get(r, "training.fit_time_s")
            within = "" if budget is None or fit_s is None else (" (within" if fit_s <= budget else " (over") + f" the {budget:g} s budget)"
            reached = "n/a" if test is None else ("reached" if test >= target else "not reached")
            lines.append(
                f"{vr.variant.name} seed{seed}: {y} >= {target:g} first at {x} = "
                + (f"{hit:.0f}" if hit is not None else "never")
                + f"; {m.key} {'n/a' if test is None else f'{test * m.scale:.{m.digits}f}'}: target {reached} after "
                f"{fmt_seconds(fit_s)} of fit{within}"
            )
    return lines or ["not enough results yet"]


_CHECKERS = {
    "time_to_target": check_time_to_target,
    "gaps": check_gaps,
    "halving": check_halving,
    "baseline": check_baseline,
    "best_per_group": check_best_per_group,
    "speed": check_speed,
    "ordering": check_ordering,
}


# --------------------------------------------------------------------------- figures


def _bar_limits(ax, lows: list[float], highs: list[float], horizontal: bool) -> None:
    """Zoom the value axis onto the data when the differences are small (said on the axis)."""
    if not lows:
        return
    lo, hi = min(lows), max(highs)
    span = max(hi - lo, 1e-9)
    start = max(0.0, lo - 0.5 * span)
    if start > 0:
        (ax.set_xlim if horizontal else ax.set_ylim)(start, hi + 0.25 * span)


def figure(plan: Plan, collected: list[VariantResults], path: Path) -> Path | None:
    """Draw the sweep's ``report.plot`` into ``path`` (PNG); None when nothing finished."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    rep = plan.sweep.report
    kind = rep.get("plot", "bars")
    if kind not in PLOTS:
        raise SweepError(f"{plan.sweep.path}: report.plot={kind!r} is not one of {list(PLOTS)}")
    label = plan.sweep.metric.label
    have = [vr for vr in collected if vr.metric(plan).mean is not None]
    if not have:
        return None
    title = f"{plan.sweep.title}\n{plan.experiment}: mean ± std over seeds"

    if kind == "accuracy_vs_flops":
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        for ax, path_key, xlabel, scale in (
            (axes[0], "model.flops_per_sample", "GFLOPs per image (forward)", 1e-9),
            (axes[1], "training.total_train_flops", "total training FLOPs", 1.0),
        ):
            for vr in have:
                xs = vr.stat(path_key).mean
                if xs is None:
                    continue
                s = vr.metric(plan)
                ax.errorbar(xs * scale, s.mean, yerr=s.std or 0, fmt="o", capsize=4)
                ax.annotate(vr.variant.name, (xs * scale, s.mean), textcoords="offset points", xytext=(6, 6), fontsize=8)
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # overlapping 2x10^-3 ... labels
            ax.margins(x=0.2)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
        fig.suptitle(title, fontsize=10)

    elif kind == "lines":
        hue, x = rep.get("hue"), rep.get("x")
        if not hue or not x:
            raise SweepError(f"{plan.sweep.path}: report.plot=lines needs report.x (a variant axis or a results.json "
                             "path such as training.total_train_flops) and report.hue (a variant axis)")  # fmt: skip
        metrics = [plan.sweep.metric, *panel_metrics(plan)]
        fig, axes = plt.subplots(1, len(metrics), figsize=(5.5 * len(metrics), 4.2), squeeze=False)
        for ax, m in zip(axes[0], metrics):
            for h in _axis_order(plan, hue):
                pts = []
                for vr in have:
                    if vr.variant.axes.get(hue) != h:
                        continue
                    xv = vr.variant.axes[x] if x in vr.variant.axes else vr.stat(x).mean
                    s = vr.column(m)
                    if isinstance(xv, (int, float)) and s.mean is not None:
                        pts.append((float(xv), s.mean, s.std or 0.0))
                if pts:
                    pts.sort()
                    ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o",
                                capsize=4, label=f"{h}")  # fmt: skip
            if rep.get("logx", True):
                ax.set_xscale("log")
            ax.set_xlabel(rep.get("xlabel", x))
            ax.set_ylabel(m.label)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.suptitle(title, fontsize=10)

    elif kind == "curves":
        x, y = _curve_keys(plan)
        fig, ax = plt.subplots(figsize=(7, 4.2))
        colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        for i, vr in enumerate(collected):
            for j, seed in enumerate(vr.seeds()):
                curve = run_curve(plan, vr.variant, seed, x, y)
                if curve:
                    ax.plot([c[0] for c in curve], [c[1] for c in curve], marker=".", color=colors[i % len(colors)],
                            alpha=0.85, label=vr.variant.name if j == 0 else None)  # fmt: skip
        if isinstance(rep.get("target"), (int, float)):
            ax.axhline(rep["target"], color="tab:red", linestyle="--", linewidth=1, label=f"target {rep['target']:g}")
            low, high = ax.get_ylim()
            ax.set_ylim(low, max(high, rep["target"] + 0.1 * (high - low)))  # the target line clear of the frame
        if isinstance(rep.get("budget_s"), (int, float)):
            ax.axvline(rep["budget_s"], color="gray", linestyle=":", linewidth=1, label=f"budget {rep['budget_s']:g} s")
        ax.set_xlabel(rep.get("xlabel", x))
        ax.set_ylabel(rep.get("ylabel", y))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title(f"{plan.sweep.title}\n{plan.experiment}: one line per run", fontsize=10)

    elif kind == "grouped_bars":
        x, hue = rep.get("x"), rep.get("hue")
        xs = sorted({vr.variant.axes.get(x) for vr in collected}, key=_axis_sort_key)
        hues = list(dict.fromkeys(vr.variant.axes.get(hue) for vr in collected))
        width = 0.8 / max(1, len(hues))
        fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(xs) + 2), 4.2))
        lows, highs = [], []
        for j, h in enumerate(hues):
            means, errs, pos = [], [], []
            for i, xv in enumerate(xs):
                vr = next((v for v in collected if v.variant.axes.get(x) == xv and v.variant.axes.get(hue) == h), None)
                s = vr.metric(plan) if vr else Stat(None, None, 0)
                if s.mean is None:
                    continue
                means.append(s.mean)
                errs.append(s.std or 0)
                pos.append(i + (j - (len(hues) - 1) / 2) * width)
                lows.append(s.mean - (s.std or 0))
                highs.append(s.mean + (s.std or 0))
            ax.bar(pos, means, width, yerr=errs, capsize=4, label=f"{hue}={h}")
        ax.set_xticks(range(len(xs)), [f"{x}={xv}" for xv in xs])
        _bar_limits(ax, lows, highs, horizontal=False)
        ax.set_ylabel(label + (" (axis zoomed)" if ax.get_ylim()[0] > 0 else ""))
        ax.legend()
        ax.grid(axis="y", alpha=0.3)
        ax.set_title(title, fontsize=10)

    else:  # bars
        speed = bool(rep.get("speed"))
        extra = panel_metrics(plan)
        ncols = 1 + len(extra) + int(speed)
        fig, axes = plt.subplots(1, ncols, figsize=(6 * ncols, max(3, 0.45 * len(collected) + 1.5)), squeeze=False)
        names = [vr.variant.name for vr in collected][::-1]
        panels = [(axes[0][0], lambda vr: vr.metric(plan), label, plan.sweep.metric)]
        for i, col in enumerate(extra, 1):
            panels.append((axes[0][i], lambda vr, col=col: vr.column(col), col.label, col))
        if speed:
            panels.append((axes[0][-1], lambda vr: vr.stat("training.samples_per_sec"), f"training {_unit(plan)}s/s", None))
        for ax, get, xlabel, col in panels:
            stats = [get(vr) for vr in collected][::-1]
            means = [s.mean if s.mean is not None else 0.0 for s in stats]
            ax.barh(names, means, xerr=[s.std or 0 for s in stats], capsize=4, color="tab:blue")
            ceiling = ceiling_value(collected, col) if col is not None else Stat(None, None, 0)
            lows = [s.mean - (s.std or 0) for s in stats if s.mean is not None]
            highs = [s.mean + (s.std or 0) for s in stats if s.mean is not None]
            if ceiling.mean is not None:
                ax.axvline(ceiling.mean, color="tab:red", linestyle="--", linewidth=1.2,
                           label=f"ceiling {ceiling.mean:.{col.digits}f}")  # fmt: skip
                ax.legend(loc="lower right", fontsize=8)
                lows.append(ceiling.mean)
                highs.append(ceiling.mean)
            _bar_limits(ax, lows, highs, horizontal=True)
            for i, s in enumerate(stats):
                if s.mean is None:
                    ax.text(ax.get_xlim()[0], i, "  no result", va="center", fontsize=8, color="tab:red")
                else:
                    ax.annotate(f"n={s.n}", (s.mean + (s.std or 0), i), xytext=(6, 0), textcoords="offset points",
                                va="center", fontsize=7)  # fmt: skip
            ax.set_xlabel(xlabel + (" (axis zoomed)" if ax.get_xlim()[0] > 0 else ""))
            ax.grid(axis="x", alpha=0.3)
        fig.suptitle(title, fontsize=10)

    atomic_savefig(fig, path)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- the report


@dataclass
class Report:
    path: Path
    figures: list[Path]
    header: list[str]
    rows: list[list[str]]
    missing: list[str]
    markdown: str
    claims: list[str] = field(default_factory=list)  # the report.check summary lines


def _first(collected: list[VariantResults]) -> dict | None:
    return next((r for vr in collected for r in vr.results), None)


def _overrides_text(overrides: dict) -> str:
    return ", ".join(f"`{k}={cli_value(v)}`" for k, v in overrides.items()) or "none"


def build_report(plan: Plan, collected: list[VariantResults], figures: list[Path]) -> Report:
    sweep, prof = plan.sweep, plan.profile
    header, rows = table(plan, collected)
    first = _first(collected)
    missing = [
        f"`{vr.variant.name}` seed {seed}: {why} (`{plan.experiment_dir / vr.variant.name / f'seed{seed}'}`)"
        for vr in collected for seed, why in vr.missing
    ]  # fmt: skip
    n_done = sum(len(vr.results) for vr in collected)
    lines = [f"# {sweep.title}", ""]
    if sweep.description:
        lines += [sweep.description.strip(), ""]
    own = [(v.name, v.base) for v in plan.variants if v.base]
    metrics = ", ".join(f"`{c.key}` ({c.label})" for c in [sweep.metric, *sweep.columns])
    lines += [
        f"- Sweep `{sweep.id}` (`{_rel(sweep.path)}`), profile `{prof.name}`"
        + (f" ({prof.description.strip()})" if prof.description else "")
        + f", experiment `{plan.experiment}`",
        f"- Made by: `{plan.sweep_command()}`; this report: `{plan.sweep_command('report')}`",
        f"- Base config: `{_rel(plan.base)}`"
        + (f" (variants with their own: {', '.join(f'{n} `{b}`' for n, b in own)})" if own else "")
        + f"; sweep overrides: {_overrides_text(sweep.overrides)}; "
        f"profile overrides: {_overrides_text(prof.overrides)}",
        f"- Seeds planned: {', '.join(map(str, plan.seeds))}; {n_done} finished runs over {len(collected)} variants; "
        f"{'metric' if not sweep.columns else 'metrics'} {metrics}, mean ± sample std (n - 1) over the n seeds",
    ]
    if first is not None:
        data = first.get("data") or {}
        tr = first.get("training") or {}
        git = first.get("git") or {}
        lines.append(
            f"- Data: {_data_text(data)}; "
            f"{tr.get('epochs', '?')} epochs, {tr.get('steps', '?')} steps of batch {tr.get('global_batch_size', '?')}; "
            f"{tr.get('devices', '?')} device(s), precision {tr.get('precision', '?')}, host `{first.get('host', '?')}`; "
            f"test weights: {first.get('test_ckpt', '?')}"
        )
        commits = sorted({str((r.get("git") or {}).get("commit"))[:10] + (" (dirty)" if (r.get("git") or {}).get("dirty") else "")
                          for vr in collected for r in vr.results})  # fmt: skip
        lines.append(f"- Code: git {', '.join(commits) if git else 'unknown'}; torch {(first.get('versions') or {}).get('torch')}")
    lines.append(f"- Written {_dt.datetime.now(_dt.timezone.utc).isoformat(timespec='seconds')}")
    lines.append("")
    if sweep.references or sweep.claims:
        lines += ["## The paper", ""]
        for ref in sweep.references:
            mark = " (unverified)" if ref.unverified else ""
            if sweep.metric.scale == 100:
                scale = "fractions in the paper, shown as percent" if ref.scale == "fraction" else "percent"
            elif sweep.metric.scale == 1:
                scale = "fractions, as the paper prints them" if ref.scale == "fraction" else "percent in the paper, shown as fractions"
            else:
                scale = f"shown in our metric's units (x {sweep.metric.scale:g} of a fraction)"
            lines.append(f"- **{ref.label}**{mark} ({scale})" + (f": {ref.note.strip()}" if ref.note else ""))
        for claim in sweep.claims:
            lines.append(f"- Claim: {claim.strip()}")
        lines.append("")
    lines += ["## Results", "", markdown_table(header, rows), ""]
    check = sweep.report.get("check")
    claims: list[str] = []
    if check:
        if check not in _CHECKERS:
            raise SweepError(f"{sweep.path}: report.check={check!r} is not one of {list(_CHECKERS)}")
        claims = _CHECKERS[check](plan, collected)
        lines += ["## Our numbers on the claim", ""]
        lines += [f"- {line}" if not line.startswith("  ") else f"  - {line.strip()}" for line in claims]
        lines.append("")
    if figures:
        lines += ["## Figures", ""]
        lines += [f"![{f.stem}]({f.name})" for f in figures]
        lines.append("")
    lines += ["## Missing or failed runs", ""]
    lines += [f"- {m}" for m in missing] if missing else ["None: every planned run finished."]
    lines.append("")
    text = "\n".join(lines)
    return Report(plan.experiment_dir / REPORT_FILE, figures, header, rows, missing, text, claims)


def _data_text(data: dict) -> str:
    """One line about the data from results.json's ``data`` (images: sizes and input shape;
    behaviour data: samples per split, users, sequence length and the ceiling)."""
    source = f"`{data.get('source', '?')}`"
    if isinstance(data.get("splits"), dict):
        splits = data["splits"]
        names = [k for k in ("train", "val", "test") if k in splits] + [k for k in splits if k not in ("train", "val", "test")]
        sizes = ", ".join(f"{k} {(splits[k] or {}).get('samples', '?')}" for k in names)
        text = f"{source} ({sizes} samples"
        if data.get("seq_len") is not None:
            text += f", sequence length {data['seq_len']}"
        sizes = data.get("feature_sizes") or {}
        if sizes:
            text += ", " + ", ".join(f"{k} {sizes[k]}" for k in ("n_users", "n_items", "n_categories") if k in sizes)
        ceiling = data.get("ceiling") or {}
        if ceiling.get("test_auc") is not None:
            text += f"; ceiling test AUC {ceiling['test_auc']:.4f}, GAUC {ceiling.get('test_gauc', float('nan')):.4f}"
        return text + ")"
    return (
        f"{source} (train {data.get('train_size', '?')}, val {data.get('val_size', '?')}, "
        f"test {data.get('test_size', '?')} images, input {data.get('input_shape', '?')})"
    )


def _rel(path: Path) -> str:
    for root in (Path.cwd(), Path(__file__).resolve().parents[1]):
        try:
            return str(Path(path).resolve().relative_to(root.resolve()))
        except ValueError:
            continue
    return str(path)


def log_to_wandb(plan: Plan, report: Report, project: str = "attention-repro") -> None:
    """The table and figures as a ``report`` run in the sweep's W&B group (offline without a key)."""
    import wandb

    from reproductions.tracking import wandb_offline

    run = wandb.init(
        project=project,
        group=plan.experiment,
        name=f"{plan.experiment}/report",
        job_type="report",
        tags=list(dict.fromkeys([plan.sweep.axis, plan.profile.name, plan.sweep.id])),
        dir=str(plan.experiment_dir),
        mode="offline" if wandb_offline() else "online",
        reinit="finish_previous",  # never hand back a run left open in this process
        config={"sweep": plan.sweep.id, "profile": plan.profile.name, "seeds": plan.seeds},
    )
    try:
        payload: dict[str, Any] = {"report/table": wandb.Table(columns=report.header, data=report.rows)}
        for fig in report.figures:
            payload[f"report/{fig.stem}"] = wandb.Image(str(fig))
        run.log(payload)
        run.summary["report/missing_runs"] = len(report.missing)
        run.save(str(report.path), base_path=str(report.path.parent), policy="now")
    finally:
        run.finish()


def render(plan: Plan, figure_dir: str | os.PathLike | None = None) -> Report:
    """Collect the results, draw the figure (into ``figure_dir``, default the experiment's
    directory) and build the report, writing no report.md (the notebook's entry point)."""
    collected = collect(plan)
    figures = []
    fig_dir = Path(figure_dir) if figure_dir is not None else plan.experiment_dir
    fig = figure(plan, collected, fig_dir / f"{plan.sweep.axis}.png")
    if fig is not None:
        figures.append(fig)
    return build_report(plan, collected, figures)


def write_report(plan: Plan, *, wandb: bool = False, project: str = "attention-repro", out: TextIO | None = None) -> Report:
    """Collect, draw, write ``report.md`` atomically, print the table (and log to W&B)."""
    out = out or sys.stdout
    report = render(plan)
    atomic_write_text(report.path, report.markdown)
    print(f"\n{plan.sweep.title} ({plan.experiment})", file=out)
    print(text_table(report.header, report.rows), file=out)
    for line in report.claims:
        print(f"  {line}", file=out)
    if report.missing:
        print(f"missing or failed runs ({len(report.missing)}):", file=out)
        for m in report.missing:
            print(f"  {m.replace('`', '')}", file=out)
    print(f"report: {report.path}" + "".join(f"\nfigure: {f}" for f in report.figures), file=out)
    if wandb:
        log_to_wandb(plan, report, project)
    return report


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    p = argparse.ArgumentParser(
        prog="python -m reproductions report",
        description="Write a sweep's report: Markdown table beside the paper's values, and figures.",
        allow_abbrev=False,
    )
    p.add_argument("sweep", help="a sweep name (vit/position) or a sweep YAML file")
    p.add_argument("--profile", default=DEFAULT_PROFILE)
    p.add_argument("--seeds", type=int, default=None, help="the planned seeds 0..N-1 (default: the profile's)")
    p.add_argument("--root", default="runs")
    p.add_argument("--experiment", default=None, help="experiment name (default <sweep>-<profile>)")
    p.add_argument("--wandb", action="store_true", help="also log the table and figures to W&B (the sweep's group)")
    p.add_argument("--project", default="attention-repro", help="W&B project")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        plan = make_plan(args.sweep, args.profile, seeds=args.seeds, root=args.root, experiment=args.experiment)
    except SweepError as e:
        print(f"report: {e}", file=sys.stderr)
        return 2
    if not plan.experiment_dir.is_dir():
        print(f"report: no runs under {plan.experiment_dir}; run first: {plan.sweep_command()}", file=sys.stderr)
        return 1
    write_report(plan, wandb=args.wandb, project=args.project, out=out)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

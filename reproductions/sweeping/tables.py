"""The report's table: one row per planned variant (our metric mean ± std over the seeds, the
sweep's further metric ``columns``, RelaImpr, the distance to the ceiling, the paper's values,
parameters, FLOPs, throughput, time per run), as Markdown or aligned text; the number
formats; and the ``report:`` options that the table, the claim checks and the figures share
(``unit``, ``flops``, ``relaimpr``, ``panels``, the axes' order).

RelaImpr = ((AUC - 0.5) / (AUC_base - 0.5) - 1) x 100 % (Yan et al. 2014, as DIN and BST report
it), from the main metric's means against ``report.relaimpr.baseline``, with the training code's
formula (``lightning_modules.metrics.rela_impr``).

Image sweeps whose main metric is test accuracy get the pixel floor (``floors``: a logistic
regression on the raw pixels of the same training subset, C chosen on validation) as a row per
distinct training set, and a variant whose mean is below its floor is marked "(below floor)".
"""

from __future__ import annotations

from typing import Any

from reproductions.sweeping.collect import Stat, VariantResults, by_name, mean_std
from reproductions.sweeping.floors import floor_label, floor_of
from reproductions.sweeping.plan import Plan
from reproductions.sweeping.spec import Metric, Reference, SweepError, Variant


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


# --------------------------------------------------------------------------- report options


def input_unit(plan: Plan) -> str:
    """What one input is called in the compute columns (``report.unit``, default ``image``)."""
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
    from lightning_modules.metrics import rela_impr  # here, so that a report without RelaImpr loads no torch

    return rela_impr(value, base)


def panel_metrics(plan: Plan) -> list[Metric]:
    """The metric columns named by ``report.panels`` (beyond the main metric), in that order; a
    name that is not a metric column is an error."""
    by_key = {c.key: c for c in [plan.sweep.metric, *plan.sweep.columns]}
    panels = plan.sweep.report.get("panels") or []
    unknown = [k for k in panels if k not in by_key]
    if unknown:
        raise SweepError(f"{plan.sweep.path}: report.panels {unknown} are not metric columns: {list(by_key)}")
    return [by_key[k] for k in panels if k != plan.sweep.metric.key]


def axis_order(plan: Plan, axis: str) -> list[Any]:
    """The values of ``axis`` over the plan's variants: numbers ascending, names in sweep-file order."""
    values = list(dict.fromkeys(v.axes[axis] for v in plan.variants if axis in v.axes))
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return sorted(values)
    return values


def axis_sort_key(value: Any) -> tuple:
    return (0, float(value), "") if isinstance(value, (int, float)) else (1, 0.0, str(value))


# --------------------------------------------------------------------------- the table


def ceiling_value(collected: list[VariantResults], m: Metric) -> Stat:
    """The ceiling of metric ``m`` over every finished run (one data set: one value)."""
    return mean_std([v * m.scale for vr in collected for v in (vr.values(m.ceiling) if m.ceiling else [])])


FLOOR_METRIC = "test/acc"
"""The metric a pixel floor is measured in (its test accuracy)."""
BELOW_FLOOR = "(below floor)"


def variant_floors(plan: Plan, collected: list[VariantResults]) -> dict[str, dict]:
    """Each variant's pixel floor (``floors.floor_of`` its runs, from its ``floors_dir``), for a sweep whose
    main metric is test accuracy; variants without one (no runs, no recorded floor, other data) are left out."""
    if plan.sweep.metric.key != FLOOR_METRIC:
        return {}
    out = {}
    for vr in collected:
        floor = floor_of(vr.results, floors_dir=vr.floors_dir) if vr.results else None
        if floor is not None:
            out[vr.variant.name] = floor
    return out


def distinct_floors(floors: dict[str, dict]) -> list[dict]:
    """The floors of ``variant_floors`` once each, smallest training set first."""
    seen = {}
    for f in floors.values():
        seen.setdefault((f["dataset"], f.get("train_samples")), f)
    return [seen[k] for k in sorted(seen, key=lambda k: (k[0], k[1] is None, k[1] or 0))]


def table(plan: Plan, collected: list[VariantResults]) -> tuple[list[str], list[list[str]]]:
    """The report table: header and rows (strings), one row per planned variant, a pixel-floor row per
    training set when the metric is test accuracy, and a last ceiling row when the main metric has a
    ceiling that the results record."""
    sweep = plan.sweep
    m, columns, unit = sweep.metric, sweep.columns, input_unit(plan)
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
    by = by_name(collected)
    base_raw = mean_std(by[rel["baseline"]].values_of_metric(m.key)).mean if rel else None
    ceiling = ceiling_value(collected, m)
    floors = variant_floors(plan, collected)
    rows = []
    for vr in collected:
        flops = vr.stat("model.flops_per_sample").mean
        stat = vr.metric(plan)
        below = stat.floor is not None and stat.mean is not None and stat.mean < stat.floor
        row = [vr.variant.name, fmt_stat(stat, m.digits) + (f" {BELOW_FLOOR}" if below else ""),
               str(len(vr.values_of_metric(m.key)))]  # fmt: skip
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
    for floor in distinct_floors(floors):
        row = [floor_label(floor), f"{floor['test_acc'] * m.scale:.{m.digits}f}", "–"]
        rows.append(row + ["–"] * (len(header) - len(row)))
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


def markdown_table(header: list[str], rows: list[list[str]], *, numbers: bool = True) -> str:
    """A Markdown table; ``numbers``: every column after the first is right-aligned."""
    lines = ["| " + " | ".join(_md_cell(h) for h in header) + " |"]
    lines.append("|" + "|".join("---" if i == 0 or not numbers else "---:" for i in range(len(header))) + "|")
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def text_table(header: list[str], rows: list[list[str]]) -> str:
    """The table for a terminal: aligned columns."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    fmt = lambda cells: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
    return "\n".join([fmt(header), "  ".join("-" * w for w in widths), *[fmt(r) for r in rows]])

"""The claim checks: our numbers on the paper's claim, as the lines of the report's "Our numbers
on the claim" section. The sweep file's ``report.check`` picks one (``CHECKERS``):

- ``halving``: compute ratio and accuracy gain per step of ``report.param`` (e.g. patch size);
- ``baseline``: the gap between ``report.baseline`` and the others, and their spread;
- ``best_per_group``: the best ``report.x`` per ``report.hue`` and the gap at the best and at
  a shared value;
- ``gaps``: for each pair ``[a, b]`` of ``report.pairs`` (values of ``report.hue``), a - b at
  each value of ``report.along`` for the metric and the ``report.panels`` columns, and whether
  the gap shrinks;
- ``time_to_target``: per run, when the validation curve first reached ``report.target`` and
  whether the test metric reached it within ``report.budget_s``;
- ``speed``: accuracy and throughput against ``report.baseline``;
- ``ordering``: our ranking against the claimed orders ``report.orders`` (chains of variant
  names, best first, or ``{label, order}`` to say whose claim it is), pair by pair with standard
  errors; with ``report.order_reference`` the pairs ordered as that paper column orders them;
  the distance of each variant to the ceiling.

Each takes the plan and the collected results and returns ``ClaimLine``s: the line's text (a
line starting with two spaces is a sub-item) and, where the line checks a claim "a > b", that
``Comparison`` as data (the two sides, a - b, its standard error and the verdict), which the
report's lines, its W&B claims table and ``repro claims`` all read. ``check_claims`` runs the
sweep's ``report.check``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from reproductions.run.results import metric_value
from reproductions.sweeping.collect import (
    Stat,
    VariantResults,
    by_name,
    curve_keys,
    run_curve,
    value_at,
)
from reproductions.sweeping.plan import Plan
from reproductions.sweeping.spec import Metric, SweepError
from reproductions.sweeping.tables import (
    axis_order,
    axis_sort_key,
    ceiling_value,
    fmt_seconds,
    fmt_stat,
    input_unit,
    panel_metrics,
)


def _pm(stat: Stat, m: Metric = Metric()) -> str:
    return fmt_stat(stat, m.digits) if stat.mean is not None else "no result"


def _std_error(a: Stat, b: Stat) -> float | None:
    """Standard error of b.mean - a.mean (independent runs) when both have n >= 2."""
    if a.std is None or b.std is None:
        return None
    return math.sqrt(a.std**2 / a.n + b.std**2 / b.n)


def claim_verdict(a: Stat, b: Stat) -> str:
    """Whether "a > b" holds: ``holds`` / ``does not hold`` when the gap is at least 2 standard
    errors of the difference, ``within noise`` when it is smaller; with fewer than 2 seeds a side
    there is no standard error and the verdict says so."""
    d = a.mean - b.mean
    se = _std_error(a, b)
    if se is None:
        return ("holds" if d > 0 else "does not hold") + " (one seed: no s.e.)"
    if abs(d) < 2 * se:
        return "within noise (under 2 s.e.)"
    return "holds" if d > 0 else "does not hold"


#: a Comparison's verdict, without its note (docs/claims.md defines each)
VERDICTS = ("holds", "does not hold", "within noise", "under-trained", "no result")


def verdict_counts(comparisons) -> str:
    """``12 holds, 30 does not hold, 20 within noise, 14 under-trained``: the comparisons by verdict (each
    claim at each scale counts once), leaving out verdicts with none."""
    verdicts = [c.verdict for c in comparisons if c.difference is not None]
    return ", ".join(f"{verdicts.count(v)} {v}" for v in VERDICTS if verdicts.count(v)) or "no verdict"


def training_gaps(name: str, stat: Stat, m: Metric = Metric()) -> list[str]:
    """Why one side of a claim is not trained as well as the budget allows: its mean below its pixel
    floor, or runs whose validation metric was still rising when they ended (run/curve.py)."""
    reasons = []
    if stat.floor is not None and stat.mean is not None and stat.mean < stat.floor:
        reasons.append(f"{name} {stat.mean:.{m.digits}f} is below its pixel floor {stat.floor:.{m.digits}f}")
    if stat.rising:
        reasons.append(f"{name} still rising at the end in {stat.rising} of {stat.n} runs")
    return reasons


@dataclass(frozen=True)
class Comparison:
    """One claim "a > b" on our numbers: the two sides' results (display units of ``metric``)
    and, derived from them, a - b, its standard error and the verdict (``claim_verdict``).
    ``context`` says where the comparison is made (``at the shared lr=0.001``, a metric and a
    training-set size, the source of a claimed order); with the two names it is the claim."""

    a: str
    b: str
    stat_a: Stat
    stat_b: Stat
    metric: Metric = Metric()
    context: str = ""

    @property
    def claim(self) -> str:
        return (f"{self.context}: " if self.context else "") + f"{self.a} > {self.b}"

    @property
    def difference(self) -> float | None:
        """a - b, None when a side has no result."""
        if self.stat_a.mean is None or self.stat_b.mean is None:
            return None
        return self.stat_a.mean - self.stat_b.mean

    @property
    def se(self) -> float | None:
        return _std_error(self.stat_b, self.stat_a)

    @property
    def under_trained(self) -> list[str]:
        """Why the comparison measures the budget rather than the models (``training_gaps`` of each side)."""
        return [*training_gaps(self.a, self.stat_a, self.metric), *training_gaps(self.b, self.stat_b, self.metric)]

    @property
    def verdict_text(self) -> str:
        """``claim_verdict`` with its note; "under-trained (why)" when a side is below its floor or
        still rising, whatever the gap; or "no result"."""
        if self.difference is None:
            return "no result"
        gaps = self.under_trained
        if gaps:
            return f"under-trained ({'; '.join(gaps)})"
        return claim_verdict(self.stat_a, self.stat_b)

    @property
    def verdict(self) -> str:
        """One of ``VERDICTS``."""
        return next(v for v in VERDICTS if self.verdict_text.startswith(v))

    @property
    def note(self) -> str | None:
        """Why the verdict is weaker than it reads ("one seed: no s.e."), or None."""
        text = self.verdict_text
        return text[text.index("(") + 1 : -1] if self.verdict in ("holds", "does not hold", "under-trained") and "(" in text else None

    def delta_text(self) -> str:
        """a - b in the metric's unit, with its standard error where both sides have n >= 2."""
        return _delta(self.stat_b, self.stat_a, self.metric)


@dataclass(frozen=True)
class ClaimLine:
    """A line of the claim checks and the comparison it checks, if it checks one."""

    text: str
    comparison: Comparison | None = None


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


def check_halving(plan: Plan, collected: list[VariantResults]) -> list[ClaimLine]:
    param = plan.sweep.report.get("param", plan.sweep.axis)
    m = plan.sweep.metric
    points = []
    for vr in collected:
        value = vr.variant.axes.get(param)
        flops = vr.stat("model.flops_per_sample").mean
        if isinstance(value, (int, float)) and flops:
            points.append((float(value), flops, vr.metric(plan), vr.variant.name))
    points.sort(reverse=True)  # large patches (cheap) first
    lines = []
    for (p1, f1, s1, n1), (p2, f2, s2, n2) in zip(points, points[1:]):
        c = Comparison(f"{param} {p2:g}", f"{param} {p1:g}", s2, s1, m)
        lines.append(ClaimLine(
            f"{param} {p1:g} -> {p2:g} (side x{p2 / p1:.2f}): GFLOPs/image x{f2 / f1:.2f}, "
            f"accuracy {_pm(s1, m)} -> {_pm(s2, m)}: {c.delta_text()}; {c.claim}? {c.verdict_text}", c,
        ))  # fmt: skip
    return lines


def baseline_variant(plan: Plan, collected: list[VariantResults]) -> tuple[str, VariantResults | None]:
    """``report.baseline``'s name and its collected results (None when the sweep has no such variant)."""
    name = plan.sweep.report.get("baseline")
    return name, by_name(collected).get(name)


def _no_baseline(name: str) -> list[ClaimLine]:
    return [ClaimLine(f"(no baseline variant {name!r} in this sweep)")]


def check_baseline(plan: Plan, collected: list[VariantResults]) -> list[ClaimLine]:
    base_name, base_results = baseline_variant(plan, collected)
    if base_results is None:
        return _no_baseline(base_name)
    m = plan.sweep.metric
    base = base_results.metric(plan)
    others = [(vr.variant.name, vr.metric(plan)) for vr in collected if vr.variant.name != base_name]
    others = [(n, s) for n, s in others if s.mean is not None]
    if base.mean is None or not others:
        return [ClaimLine("not enough results yet")]
    best = max(others, key=lambda x: x[1].mean)
    worst = min(others, key=lambda x: x[1].mean)
    unit = f" {m.unit}" if m.unit else ""
    lines = [ClaimLine(text) for text in (
        f"{base_name}: {_pm(base, m)}; best other, {best[0]}: {_pm(best[1], m)}: gap {_delta(base, best[1], m)}; "
        f"worst other, {worst[0]}: {_pm(worst[1], m)}: gap {_delta(base, worst[1], m)}",
        f"spread among the {len(others)} other variants (best - worst mean): "
        f"{best[1].mean - worst[1].mean:.{m.digits}f}{unit}",
        f"each variant against {base_name} (holds / does not hold: a gap of at least 2 standard errors):",
    )]  # fmt: skip
    for name, s in others:
        c = Comparison(name, base_name, s, base, m)
        lines.append(ClaimLine(f"  {c.claim}? {c.verdict_text}: {c.delta_text()}", c))
    return lines


def check_best_per_group(plan: Plan, collected: list[VariantResults]) -> list[ClaimLine]:
    x, hue = plan.sweep.report.get("x"), plan.sweep.report.get("hue")
    m = plan.sweep.metric
    groups: dict[Any, dict[Any, Stat]] = {}
    for vr in collected:
        if x in vr.variant.axes and hue in vr.variant.axes:
            groups.setdefault(vr.variant.axes[hue], {})[vr.variant.axes[x]] = vr.metric(plan)
    lines, best = [], {}
    for h, by_x in groups.items():
        done = {k: s for k, s in by_x.items() if s.mean is not None}
        if not done:
            lines.append(ClaimLine(f"{hue}={h}: no results"))
            continue
        bx = max(done, key=lambda k: done[k].mean)
        best[h] = done[bx]
        lines.append(ClaimLine(f"{hue}={h}: best {x}={bx} with {_pm(done[bx], m)}"))
    if len(best) == 2:
        (h1, s1), (h2, s2) = best.items()
        pairs = [(f"at each one's best {x}", s2, s1)]
        shared = sorted(set.intersection(*(set(v) for v in groups.values())), key=axis_sort_key)
        pairs += [(f"at the shared {x}={xv}", groups[h2][xv], groups[h1][xv]) for xv in shared]
        for where, sa, sb in pairs:
            c = Comparison(f"{hue}={h2}", f"{hue}={h1}", sa, sb, m, where)
            lines.append(ClaimLine(f"{where}: {c.a} - {c.b}: {c.delta_text()}; {c.a} > {c.b}? {c.verdict_text}", c))
    return lines


def check_speed(plan: Plan, collected: list[VariantResults]) -> list[ClaimLine]:
    base_name, base = baseline_variant(plan, collected)
    if base is None:
        return _no_baseline(base_name)
    lines = []
    for vr in collected:
        if vr is base:
            continue
        speed_b, speed_v = base.stat("training.samples_per_sec"), vr.stat("training.samples_per_sec")
        ratio = f"x{speed_b.mean / speed_v.mean:.2f}" if speed_b.mean and speed_v.mean else "n/a"
        c = Comparison(vr.variant.name, base_name, vr.metric(plan), base.metric(plan), plan.sweep.metric)
        lines.append(ClaimLine(
            f"{c.a} vs {c.b}: accuracy {c.delta_text()} ({c.claim}? {c.verdict_text}); "
            f"{base_name} trains {ratio} as many {input_unit(plan)}s/s ({fmt_stat(speed_b, 0)} vs {fmt_stat(speed_v, 0)})", c,
        ))  # fmt: skip
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


def check_ordering(plan: Plan, collected: list[VariantResults]) -> list[ClaimLine]:
    """Our ranking against the claimed orders, pair by pair, and each variant's distance to the ceiling."""
    m = plan.sweep.metric
    by = by_name(collected)
    done = sorted(((vr.metric(plan), vr.variant.name) for vr in collected if vr.metric(plan).mean is not None),
                  key=lambda x: -x[0].mean)  # fmt: skip
    if not done:
        return [ClaimLine("not enough results yet")]
    lines = [ClaimLine("our order (mean " + m.label + "): " + " > ".join(f"{n} ({s.mean:.{m.digits}f})" for s, n in done))]
    for source, chain in _chains(plan):
        stats = [by[n].metric(plan) for n in chain]
        pairs, agree = 0, 0
        for i in range(len(chain)):
            for j in range(i + 1, len(chain)):
                if stats[i].mean is not None and stats[j].mean is not None:
                    pairs += 1
                    agree += stats[i].mean > stats[j].mean
        lines.append(ClaimLine(f"{source}: {' > '.join(chain)}: {agree} of {pairs} pairs in that order here"))
        for (a, sa), (b, sb) in zip(zip(chain, stats), zip(chain[1:], stats[1:])):
            c = Comparison(a, b, sa, sb, m, source)
            if c.difference is None:
                lines.append(ClaimLine(f"  {a} > {b}? no result", c))
                continue
            lines.append(ClaimLine(f"  {a} > {b}? {c.verdict_text}: {a} - {b} = {c.delta_text()}", c))
    ceiling = ceiling_value(collected, m)
    if ceiling.mean is not None:
        gaps = ", ".join(f"{n} {ceiling.mean - s.mean:.{m.digits}f}" for s, n in done)
        lines.append(ClaimLine(f"ceiling {ceiling.mean:.{m.digits}f} ({m.label} of the true probabilities); distance to it: {gaps}"))
    return lines


def check_gaps(plan: Plan, collected: list[VariantResults]) -> list[ClaimLine]:
    """``report.pairs`` ([[a, b], ...] values of ``report.hue``): a - b at each value of
    ``report.along`` (model size, training-set size), for the main metric and the ``report.panels``
    columns, with the compute ratio and whether "a > b" holds there, and whether the gap shrinks
    from the first to the last value."""
    rep = plan.sweep.report
    hue, along = rep.get("hue"), rep.get("along")
    pairs = rep.get("pairs") or []
    hues = axis_order(plan, hue) if hue else []
    if not hue or not along or not pairs or any(not isinstance(pr, list) or len(pr) != 2 or set(pr) - set(hues) for pr in pairs):
        raise SweepError(f"{plan.sweep.path}: report.check=gaps needs report.hue and report.along (variant axes) and "
                         f"report.pairs, a list of [a, b] values of {hue!r}: {hues}")  # fmt: skip
    metrics = [plan.sweep.metric, *panel_metrics(plan)]
    cell = {(vr.variant.axes.get(hue), vr.variant.axes.get(along)): vr for vr in collected}
    lines = []
    for a, b in pairs:
        for m in metrics:
            gaps = []
            for xv in axis_order(plan, along):
                va, vb = cell.get((a, xv)), cell.get((b, xv))
                if va is None or vb is None:
                    continue
                sa, sb = va.column(m), vb.column(m)
                fa, fb = va.stat("model.flops_per_sample").mean, vb.stat("model.flops_per_sample").mean
                ratio = f"; FLOPs/{input_unit(plan)} x{fa / fb:.2f}" if fa and fb else ""
                c = Comparison(str(a), str(b), sa, sb, m, f"{m.label}, {along}={xv}")
                lines.append(ClaimLine(f"{c.context}: {a} - {b} = {c.delta_text()} ({_pm(sa, m)} vs {_pm(sb, m)}{ratio}); "
                                       f"{c.a} > {c.b}? {c.verdict_text}", c))  # fmt: skip
                if sa.mean is not None and sb.mean is not None:
                    gaps.append((xv, sa.mean - sb.mean))
            if len(gaps) >= 2:
                (x0, g0), (x1, g1) = gaps[0], gaps[-1]
                trend = "shrinks" if abs(g1) < abs(g0) else "grows"
                if (g0 > 0) != (g1 > 0) and g0 != 0 and g1 != 0:
                    trend = "changes sign"
                lines.append(ClaimLine(f"  -> {m.label}: {a} - {b} {trend} from {g0:+.{m.digits}f} at {along}={x0} "
                                       f"to {g1:+.{m.digits}f} at {along}={x1}"))  # fmt: skip
    return lines or [ClaimLine("not enough results yet")]


def check_time_to_target(plan: Plan, collected: list[VariantResults]) -> list[ClaimLine]:
    """Per variant: when each run's validation curve first reached ``report.target`` (a fraction,
    e.g. 0.92) on ``report.x`` (wall seconds since fit started), and its test metric against the
    target after the whole run, within ``report.budget_s`` or not."""
    rep = plan.sweep.report
    target, budget = rep.get("target"), rep.get("budget_s")
    if not isinstance(target, (int, float)):
        raise SweepError(f"{plan.sweep.path}: report.check=time_to_target needs report.target (e.g. 0.92)")
    x, y = curve_keys(plan)
    m = plan.sweep.metric
    lines = []
    for vr in collected:
        for r in vr.results:
            seed = int(r.get("seed", -1))
            curve = run_curve(plan, r, x, y)
            hit = next((t for t, v in curve if v >= target), None)
            test = metric_value(r, m.key)
            fit_s = value_at(r, "training.fit_time_s")
            within = "" if budget is None or fit_s is None else (" (within" if fit_s <= budget else " (over") + f" the {budget:g} s budget)"
            reached = "n/a" if test is None else ("reached" if test >= target else "not reached")
            lines.append(ClaimLine(
                f"{vr.variant.name} seed{seed}: {y} >= {target:g} first at {x} = "
                + (f"{hit:.0f}" if hit is not None else "never")
                + f"; {m.key} {'n/a' if test is None else f'{test * m.scale:.{m.digits}f}'}: target {reached} after "
                f"{fmt_seconds(fit_s)} of fit{within}"
            ))  # fmt: skip
    return lines or [ClaimLine("not enough results yet")]


CHECKERS = {
    "time_to_target": check_time_to_target,
    "gaps": check_gaps,
    "halving": check_halving,
    "baseline": check_baseline,
    "best_per_group": check_best_per_group,
    "speed": check_speed,
    "ordering": check_ordering,
}


def check_claims(plan: Plan, collected: list[VariantResults]) -> list[ClaimLine]:
    """The sweep's ``report.check`` on the collected results; none without a check."""
    check = plan.sweep.report.get("check")
    if not check:
        return []
    if check not in CHECKERS:
        raise SweepError(f"{plan.sweep.path}: report.check={check!r} is not one of {list(CHECKERS)}")
    return CHECKERS[check](plan, collected)

"""The report's figure: the sweep file's ``report.plot``, drawn from the collected results.

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

``figure`` picks the kind (``PLOTTERS``), draws it with one ``plot_<kind>`` function (each takes
the plan, every variant's results and those with a result, and returns the matplotlib figure)
and saves it atomically.

Where the runs' data has a pixel floor (``tables.variant_floors``: a logistic regression on the raw
pixels, for a test-accuracy metric), ``figure`` draws it on the metric's panel: a dashed line
against ``train_samples`` on a ``lines`` plot over training sizes, else a straight line at the
floor (vertical across horizontal bars, horizontal elsewhere).

``plot_claim_by_scale`` draws one claim "a > b" across a sweep's profiles for ``repro claims``:
a - b at each scale with ± 2 standard-error bars, the zero line, and the side of zero where the
claim holds shaded; ``png_bytes`` renders a figure without writing it.
"""

from __future__ import annotations

import io
from pathlib import Path

from reproductions.sweeping.collect import Stat, VariantResults, curve_keys, run_curve
from reproductions.sweeping.plan import Plan
from reproductions.sweeping.spec import SweepError
from reproductions.sweeping.tables import (
    axis_order,
    axis_sort_key,
    ceiling_value,
    distinct_floors,
    input_unit,
    panel_metrics,
    variant_floors,
)
from utils.atomic import atomic_savefig


def pyplot():
    """matplotlib.pyplot on the Agg backend (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _title(plan: Plan) -> str:
    return f"{plan.sweep.title}\n{plan.experiment}: mean ± std over seeds"


def _bar_limits(ax, lows: list[float], highs: list[float], horizontal: bool) -> None:
    """Zoom the value axis onto the data when the differences are small (said on the axis)."""
    if not lows:
        return
    lo, hi = min(lows), max(highs)
    span = max(hi - lo, 1e-9)
    start = max(0.0, lo - 0.5 * span)
    if start > 0:
        (ax.set_xlim if horizontal else ax.set_ylim)(start, hi + 0.25 * span)


def plot_accuracy_vs_flops(plan: Plan, collected: list[VariantResults], have: list[VariantResults]):
    """The metric against GFLOPs per image and against total training FLOPs, one point per variant."""
    import matplotlib.ticker

    plt = pyplot()
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
        ax.set_ylabel(plan.sweep.metric.label)
        ax.grid(alpha=0.3)
    fig.suptitle(_title(plan), fontsize=10)
    return fig


def plot_lines(plan: Plan, collected: list[VariantResults], have: list[VariantResults]):
    """One line per ``report.hue`` against ``report.x``; a panel for the metric and per ``report.panels`` column."""
    rep = plan.sweep.report
    hue, x = rep.get("hue"), rep.get("x")
    if not hue or not x:
        raise SweepError(f"{plan.sweep.path}: report.plot=lines needs report.x (a variant axis or a results.json "
                         "path such as training.total_train_flops) and report.hue (a variant axis)")  # fmt: skip
    metrics = [plan.sweep.metric, *panel_metrics(plan)]
    plt = pyplot()
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.5 * len(metrics), 4.2), squeeze=False)
    for ax, m in zip(axes[0], metrics):
        for h in axis_order(plan, hue):
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
        values = axis_order(plan, x) if any(x in vr.variant.axes for vr in have) else []
        if values and all(isinstance(v, (int, float)) for v in values):
            scale_ticks(ax, [float(v) for v in values])  # the sweep's own values, not log-minor labels
        ax.set_xlabel(rep.get("xlabel", x))
        ax.set_ylabel(m.label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(_title(plan), fontsize=10)
    return fig


def plot_curves(plan: Plan, collected: list[VariantResults], have: list[VariantResults]):
    """Every run's metrics.csv curve (``report.y`` against ``report.x``), with the target and budget lines."""
    rep = plan.sweep.report
    x, y = curve_keys(plan)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, vr in enumerate(collected):
        for j, r in enumerate(vr.results):
            curve = run_curve(plan, r, x, y)
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
    return fig


def plot_grouped_bars(plan: Plan, collected: list[VariantResults], have: list[VariantResults]):
    """Bars grouped by ``report.x``, one colour per ``report.hue``."""
    rep = plan.sweep.report
    x, hue = rep.get("x"), rep.get("hue")
    xs = sorted({vr.variant.axes.get(x) for vr in collected}, key=axis_sort_key)
    hues = list(dict.fromkeys(vr.variant.axes.get(hue) for vr in collected))
    width = 0.8 / max(1, len(hues))
    plt = pyplot()
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
    ax.set_ylabel(plan.sweep.metric.label + (" (axis zoomed)" if ax.get_ylim()[0] > 0 else ""))
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(_title(plan), fontsize=10)
    return fig


def plot_bars(plan: Plan, collected: list[VariantResults], have: list[VariantResults]):
    """One horizontal bar per variant; a panel per ``report.panels`` column and, with ``speed``, images/s."""
    rep = plan.sweep.report
    speed = bool(rep.get("speed"))
    extra = panel_metrics(plan)
    ncols = 1 + len(extra) + int(speed)
    plt = pyplot()
    fig, axes = plt.subplots(1, ncols, figsize=(6 * ncols, max(3, 0.45 * len(collected) + 1.5)), squeeze=False)
    names = [vr.variant.name for vr in collected][::-1]
    panels = [(axes[0][0], lambda vr: vr.metric(plan), plan.sweep.metric.label, plan.sweep.metric)]
    for i, col in enumerate(extra, 1):
        panels.append((axes[0][i], lambda vr, col=col: vr.column(col), col.label, col))
    if speed:
        panels.append((axes[0][-1], lambda vr: vr.stat("training.samples_per_sec"), f"training {input_unit(plan)}s/s", None))
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
    fig.suptitle(_title(plan), fontsize=10)
    return fig


def scale_ticks(ax, xs: list[float]) -> None:
    """Tick a numeric x axis at the profiles' own values alone (16, 49, 196; 1k, 54k), no log-minor labels."""
    import matplotlib.ticker

    values = sorted(set(xs))
    ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(values))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FixedFormatter([_tick(v) for v in values]))
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())


def _tick(value: float) -> str:
    """54000 -> 54k, 1000 -> 1k, 196 -> 196, 0.5 -> 0.5."""
    if value >= 1000 and value % 100 == 0:
        return f"{value / 1000:g}k"
    return f"{value:g}"


#: the marker of each scale series on a claim's figure: the sweep's main line first, then each other protocol
SERIES_MARKERS = ("o", "D", "s", "^", "v")


def _series_offsets(xs: list[float], series: list[str | None], log: bool) -> list[float]:
    """``xs`` with the points of different series at one value moved apart a little (their bars would
    overlap): by a factor on a log axis, by a share of the span on a linear one."""
    span = (max(xs) - min(xs)) or max(abs(xs[0]), 1.0)
    out = list(xs)
    for x in set(xs):
        at = [i for i, v in enumerate(xs) if v == x]
        names = list(dict.fromkeys(series[i] for i in at))
        if len(names) < 2:
            continue
        for i in at:
            k = names.index(series[i]) - (len(names) - 1) / 2
            out[i] = x * 1.08**k if log else x + 0.025 * span * k
    return out


def plot_claim_by_scale(claim: str, points: list[tuple[str, float | None, float, float | None, str | None]], *, xlabel: str,
                        ylabel: str, title: str, sides: list[tuple[float | None, float | None, float | None]] | None = None,
                        names: tuple[str, str] = ("a", "b"), metric_label: str = ""):  # fmt: skip
    """One claim's difference a - b against the profiles' scale. ``points``: (label, x, a - b,
    standard error, series) per profile in scale order; x None for all: one evenly spaced, labelled
    position per profile (scales on different axes, or data sets by name); a log axis when the
    numbers span 8x or more, ticked at the profiles' own values. A line joins the points of one
    series (the profiles' ``scale.series``: None is the sweep's main protocol) where its scale grows;
    each other series has its own marker, and points of two series at one value sit a little apart.
    Bars: ± 2 s.e. (the verdict's threshold: a bar that crosses zero is within noise); a point
    without one (one seed) is drawn hollow. ``sides``: per point (a's mean, b's mean, the pixel
    floor) in the metric's units; when a floor is given, a second panel draws a and b against the
    scale with the floor marked, joined within each series as the left panel is."""
    plt = pyplot()
    with_floor = sides is not None and any(f is not None for _, _, f in sides)
    fig, axes = plt.subplots(1, 2 if with_floor else 1, figsize=(12 if with_floor else 6.5, 4.2), squeeze=False)
    ax = axes[0][0]
    numeric = all(x is not None for _, x, _, _, _ in points)
    ticks = [float(x) for _, x, _, _, _ in points] if numeric else list(range(len(points)))
    log = numeric and min(ticks) > 0 and max(ticks) / min(ticks) >= 8
    series = [s for _, _, _, _, s in points]
    order = sorted(dict.fromkeys(series), key=lambda s: s is not None)  # the main line's circles first
    marker = {s: SERIES_MARKERS[k % len(SERIES_MARKERS)] for k, s in enumerate(order)}
    xs = _series_offsets(ticks, series, log) if numeric else ticks
    ys = [d for _, _, d, _, _ in points]

    def joined(panel, values: list[float | None], color: str, **style) -> None:
        """One line per series through its points, where its scale grows."""
        for s in order:
            pts = [(x, v) for x, v, si in zip(xs, values, series) if si == s and v is not None]
            if len(pts) > 1 and all(a[0] < b[0] for a, b in zip(pts, pts[1:])):
                panel.plot([p[0] for p in pts], [p[1] for p in pts], color=color, linestyle="-" if s is None else ":", **style)

    joined(ax, ys, "tab:blue", linewidth=1, alpha=0.6)
    for k, ((label, _, d, se, s), x) in enumerate(zip(points, xs)):
        hollow = se is None
        ax.errorbar([x], [d], yerr=[2 * se if se is not None else 0.0], fmt=marker[s], capsize=4, color="tab:blue",
                    markerfacecolor="white" if hollow else "tab:blue",
                    label=None if s is None or s in [p[4] for p in points[:k]] else f"{s} (a separate series)")  # fmt: skip
        if numeric:  # the last point's label to its left: it stays inside the panel
            last = k == len(points) - 1 and len(points) > 1
            ax.annotate(label + (" (one seed)" if hollow else ""), (x, d), textcoords="offset points",
                        xytext=(-6 if last else 6, 6), ha="right" if last else "left", fontsize=8)  # fmt: skip
    for panel in axes[0]:
        if numeric:
            if log:
                panel.set_xscale("log")
            scale_ticks(panel, ticks)
            panel.margins(x=0.15)
        else:
            panel.set_xticks(xs, [label + ("\n(one seed)" if se is None else "") for label, _, _, se, _ in points], fontsize=8)
            panel.set_xlim(-0.5, len(xs) - 0.5)
        panel.set_xlabel(xlabel)
        panel.grid(alpha=0.3)
    ax.axhline(0.0, color="black", linewidth=1)
    low, high = ax.get_ylim()
    span = max(high - low, 1e-9)
    low, high = min(low, -0.15 * span), max(high, 0.15 * span)  # both sides of zero in view
    ax.set_ylim(low, high)
    ax.axhspan(0.0, high, color="tab:green", alpha=0.12, label=f"the claim's side: {claim}")
    ax.set_ylabel(ylabel + " (± 2 s.e.)")
    ax.legend(fontsize=8, loc="best")
    if with_floor:
        right = axes[0][1]
        for k, (name, color) in enumerate(zip(names, ("tab:blue", "tab:orange"))):
            values = [side[k] for side in sides]
            joined(right, values, color)
            for s in order:
                pts = [(x, v) for x, v, si in zip(xs, values, series) if si == s and v is not None]
                right.plot([p[0] for p in pts], [p[1] for p in pts], linestyle="none", marker=marker[s], color=color,
                           label=name if s == order[0] else None)  # fmt: skip
        floor_pts = [(x, side[2]) for x, side in zip(xs, sides) if side[2] is not None]
        right.plot([p[0] for p in floor_pts], [p[1] for p in floor_pts], linestyle="none", marker="_", markersize=22,
                   markeredgewidth=2, color="black", label="pixel logistic regression (floor of each profile's data)")  # fmt: skip
        right.set_ylabel(metric_label or "metric")
        right.legend(fontsize=8, loc="best")
    fig.suptitle(title, fontsize=10)
    return fig


def png_bytes(fig, *, dpi: int = 120) -> bytes:
    """The figure as PNG bytes (closed afterwards): drawn now, written later."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    pyplot().close(fig)
    return buf.getvalue()


#: ``report.plot`` -> the function that draws it
PLOTTERS = {
    "bars": plot_bars,
    "grouped_bars": plot_grouped_bars,
    "accuracy_vs_flops": plot_accuracy_vs_flops,
    "lines": plot_lines,
    "curves": plot_curves,
}
PLOTS = tuple(PLOTTERS)


FLOOR_STYLE = {"color": "black", "linestyle": "--", "linewidth": 1.2}


def draw_floors(fig, kind: str, plan: Plan, floors: list[dict]) -> None:
    """The pixel floors (``tables.distinct_floors``) on the figure's metric panel(s), in display units."""
    if not floors or kind == "curves":
        return
    scale = plan.sweep.metric.scale
    axes = fig.axes[:2] if kind == "accuracy_vs_flops" else fig.axes[:1]
    sizes = [f.get("train_samples") for f in floors]
    for ax in axes:
        if kind == "lines" and plan.sweep.report.get("x") == "train_samples" and None not in sizes and len(floors) > 1:
            ax.plot(sizes, [f["test_acc"] * scale for f in floors], marker="x", label="pixel logistic regression (floor)",
                    **FLOOR_STYLE)  # fmt: skip
        else:
            value = min(f["test_acc"] for f in floors) * scale
            label = f"pixel logistic regression (floor) {value:.{plan.sweep.metric.digits}f}"
            if kind == "bars":
                ax.axvline(value, label=label, **FLOOR_STYLE)
                low, high = ax.get_xlim()
                ax.set_xlim(min(low, value - 0.05 * (high - low)), max(high, value + 0.05 * (high - low)))
            else:
                ax.axhline(value, label=label, **FLOOR_STYLE)
                low, high = ax.get_ylim()
                ax.set_ylim(min(low, value - 0.05 * (high - low)), max(high, value + 0.05 * (high - low)))
        ax.legend(fontsize=8)


def figure(plan: Plan, collected: list[VariantResults], path: Path) -> Path | None:
    """Draw the sweep's ``report.plot`` into ``path`` (PNG, atomically), with the pixel floors of its runs'
    data; None when nothing finished."""
    kind = plan.sweep.report.get("plot", "bars")
    if kind not in PLOTTERS:
        raise SweepError(f"{plan.sweep.path}: report.plot={kind!r} is not one of {list(PLOTS)}")
    have = [vr for vr in collected if vr.metric(plan).mean is not None]
    if not have:
        return None
    fig = PLOTTERS[kind](plan, collected, have)
    draw_floors(fig, kind, plan, distinct_floors(variant_floors(plan, collected)))
    atomic_savefig(fig, path)
    pyplot().close(fig)
    return path

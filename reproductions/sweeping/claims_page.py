"""The claims page (``repro claims``): every claim check of every sweep, at every profile (scale)
that has finished runs, on one Markdown page, with a figure per claim measured at two or more
scales.

``gather(sweeps, root)`` collects each sweep at each of its profiles (``collect``) and runs its
claim checks (``claims.check_claims``: the checks of ``repro report``, as data); ``build_page``
makes the page and draws the figures into memory; ``write_page`` writes them, atomically, only
once everything is built.

The page's head: the commands that made the runs and the one that regenerates the page, and the
hardware the runs recorded (results.json's ``hardware`` and ``host``). Then per sweep the
profiles without finished runs (one line: "not measured: gpu, imagenet") and, per claim (a
``claims.Comparison``: "a > b", with where it is made), a table with one row per profile in
scale order: profile, scale, runs per side, a - b ± its standard error, the verdict (holds /
does not hold / within noise); the sweeps without any finished run in one list at the end. Scale order (``scale_key``): the profiles' ``scale`` axes in the
order the sweep file first names them, numbers ascending, data sets by name in file order,
profiles without a scale last. A claim with a difference at two or more scales gets a figure
(``figures.plot_claim_by_scale``: ticked at the profiles' own scale values; for test accuracy with
a second panel of both sides and the pixel floor of each profile's data, ``floors``), linked from
the page by a relative path. The ``smoke``
profiles (seconds per run, for tests; not a result) are left out unless asked for.

The attention-distance claim, which no sweep checks (every ViT fit measures it), has its own
section (``attention_claim``) after the sweeps.

Layer: beside ``report``, above ``figures`` (imports spec, plan, collect, claims, figures,
attention_claim).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reproductions.run.results import hardware_label
from reproductions.sweeping.attention_claim import DistanceGroup, distance_section
from reproductions.run.curve import LAST_PART, PLATEAU_THRESHOLD
from reproductions.sweeping.checks import ClaimLine, Comparison, check_claims, verdict_counts
from reproductions.sweeping.collect import VariantResults, collect, run_identity
from reproductions.sweeping.figures import plot_claim_by_scale, png_bytes
from reproductions.sweeping.plan import Plan, make_plan
from reproductions.sweeping.records import SMOKE_PROFILE, Record, is_smoke
from reproductions.sweeping.spec import SCALE_AXES, Profile, Sweep, load_sweep
from utils.atomic import atomic_write_bytes, atomic_write_text



@dataclass
class Measured:
    """One profile of a sweep with finished runs: its plan, results and claim checks."""

    plan: Plan
    collected: list[VariantResults]
    lines: list[ClaimLine]

    @property
    def profile(self) -> Profile:
        return self.plan.profile

    @property
    def runs(self) -> int:
        return sum(len(vr.results) for vr in self.collected)


@dataclass
class SweepClaims:
    """A sweep's profiles with finished runs (in scale order) and those without."""

    sweep: Sweep
    measured: list[Measured]
    not_run: list[str]
    #: local run directories left out, each with why: a corrupt results.json, or one not its run's
    left_out: list[str] = field(default_factory=list)

    def claims(self) -> dict[str, list[tuple[Measured, Comparison]]]:
        """Each claim (``Comparison.claim``) -> its comparison at each measured profile, in scale
        order; claims in the order they first appear."""
        out: dict[str, list[tuple[Measured, Comparison]]] = {}
        for m in self.measured:
            seen: dict[str, int] = {}
            for line in m.lines:
                c = line.comparison
                if c is None:
                    continue
                seen[c.claim] = seen.get(c.claim, 0) + 1  # one check comparing the same pair twice
                key = c.claim if seen[c.claim] == 1 else f"{c.claim} ({seen[c.claim]})"
                out.setdefault(key, []).append((m, c))
        return out


@dataclass
class Page:
    path: Path
    markdown: str
    figures: dict[Path, bytes] = field(default_factory=dict)  # drawn, not yet written
    figure_dir: Path | None = None  # the page's own folder of figures

    def stale_figures(self) -> list[Path]:
        """PNGs in the page's figure folder that it no longer shows (removed when it is written)."""
        if self.figure_dir is None or not self.figure_dir.is_dir():
            return []
        return sorted(p for p in self.figure_dir.glob("*.png") if p not in self.figures)


def scale_key(sweep: Sweep) -> Callable[[Profile], tuple]:
    """Sort key of a sweep's profiles by scale (see the module docstring)."""
    names = list(sweep.profiles)
    axes = list(dict.fromkeys(p.scale.axis for p in sweep.profiles.values() if p.scale is not None))

    def key(profile: Profile) -> tuple:
        index = names.index(profile.name) if profile.name in names else len(names)
        scale = profile.scale
        if scale is None:
            return (len(axes), 0.0, index)
        return (axes.index(scale.axis), 0.0 if scale.axis == "dataset" else float(scale.value), index)

    return key


def gather(sweeps: Sequence[str | os.PathLike | Sweep], root: str | os.PathLike, *, smoke: bool = False,
           registry: str | os.PathLike | None = None, local: bool = True,
           read: Sequence[Record] | None = None) -> list[SweepClaims]:  # fmt: skip
    """Each sweep's profiles with finished runs (collected, claims checked, in scale order) and
    the names of those without; ``smoke`` profiles only with ``smoke``. The runs: the records of
    ``registry`` (None: none; ``read``: its records, already read) and, unless ``local`` is false,
    the run directories under ``root``."""
    out = []
    for ref in sweeps:
        sweep = ref if isinstance(ref, Sweep) else load_sweep(ref)
        measured, not_run, left_out = [], [], []
        for name in sweep.profiles:
            if is_smoke(name) and not smoke:
                continue
            plan = make_plan(sweep, name, root=root)
            collected = collect(plan, registry=registry, local=local and plan.experiment_dir.is_dir(), read=read)
            left_out += [f"{plan.experiment_dir / vr.variant.name / f'seed{seed}'}: {why}" for vr in collected
                         for seed, why in vr.missing if why.startswith("corrupt") or (seed, why) in vr.rejected]  # fmt: skip
            if any(vr.results for vr in collected):
                measured.append(Measured(plan, collected, check_claims(plan, collected)))
            else:
                not_run.append(name)
        key = scale_key(sweep)
        measured.sort(key=lambda m: key(m.profile))
        out.append(SweepClaims(sweep, measured, not_run, left_out))
    return out


# --------------------------------------------------------------------------- the page


def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def scale_label(profile: Profile) -> str:
    return profile.scale.label if profile.scale is not None else "– (no scale in the sweep file)"


def scale_labels(profiles: list[Profile]) -> list[str]:
    """Each profile's ``scale_label``, with the profile's name added where two of ``profiles`` share a
    label (two protocols at one budget), so that no two read the same."""
    labels = [scale_label(p) for p in profiles]
    return [f"{label}, `{p.name}`" if labels.count(label) > 1 else label for p, label in zip(profiles, labels)]


def _hardware_lines(gathered: list[SweepClaims]) -> list[str]:
    """One line per kind of hardware: its hosts and the sweeps and profiles measured on it."""
    found: dict[str, dict[str, Any]] = {}
    for sc in gathered:
        for m in sc.measured:
            for vr in m.collected:
                for r in vr.results:
                    entry = found.setdefault(hardware_label(r), {"hosts": set(), "where": {}})
                    if r.get("host"):
                        entry["hosts"].add(str(r["host"]))
                    where = f"{sc.sweep.id} `{m.profile.name}`"
                    entry["where"][where] = entry["where"].get(where, 0) + 1
    lines = []
    for label, entry in found.items():
        hosts = ", ".join(f"`{h}`" for h in sorted(entry["hosts"])) or "not recorded"
        where = "; ".join(f"{w} ({n} runs)" for w, n in entry["where"].items())
        lines.append(f"- {label}; host {hosts}: {where}")
    return lines


def source_counts(gathered: list[SweepClaims], distances: Sequence[DistanceGroup] = ()) -> tuple[int, int]:
    """(registry records, local runs) behind the page."""
    runs = {}
    for r in [r for sc in gathered for m in sc.measured for vr in m.collected for r in vr.results] + \
            [r for g in distances for _, r, _ in g.runs]:
        runs.setdefault(run_identity(r), r)
    registry = sum(1 for r in runs.values() if r.get("source") == "registry")
    return registry, len(runs) - registry


def _figure_name(sweep: Sweep, claim: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", claim).strip("-").lower()[:60]
    digest = hashlib.sha1(f"{sweep.id}\n{claim}".encode()).hexdigest()[:8]
    return f"{sweep.id.replace('/', '-')}-{slug}-{digest}.png"


def _figure_points(rows: list[tuple[Measured, Comparison]]) -> tuple[list[tuple[str, float | None, float, float | None, str | None]], str]:
    """The figure's points (the profiles with a difference, each with its scale's ``series``) and its x
    label: the scale's numbers when all share one numeric axis (two profiles at one value are told
    apart by their series), else one labelled position per profile."""
    done = [(m, c) for m, c in rows if c.difference is not None]
    scales = [m.profile.scale for m, _ in done]
    axes = {s.axis for s in scales if s is not None}
    numeric = None not in scales and len(axes) == 1 and "dataset" not in axes
    numeric = numeric and len({(s.value, s.series) for s in scales}) == len(scales)  # one series, one value: by name
    if numeric:
        (axis,) = axes
        data = {s.data for s in scales}
        points = [(m.profile.name + (f" ({m.profile.scale.data})" if len(data) > 1 and m.profile.scale.data else ""),
                   float(m.profile.scale.value), c.difference, c.se, m.profile.scale.series) for m, c in done]  # fmt: skip
        return points, SCALE_AXES[axis]
    points = [(f"{m.profile.name}\n" + scale_label(m.profile).replace(" (", "\n("), None, c.difference, c.se, None) for m, c in done]
    return points, "profile (scale)"


def _sides(rows: list[tuple[Measured, Comparison]]) -> list[tuple[float | None, float | None, float | None]]:
    """Per point of the figure (the profiles with a difference): a's and b's means and the pixel floor of
    their runs (each side's training set: a claim at one subset size gets that size's floor; a metric
    with a floor alone), in the metric's units."""
    out = []
    for _, c in rows:
        if c.difference is None:
            continue
        floor = c.stat_a.floor if c.stat_a.floor is not None else c.stat_b.floor
        out.append((c.stat_a.mean, c.stat_b.mean, floor))
    return out


def _verdict_cell(c: Comparison) -> str:
    return c.verdict + (f" ({c.note})" if c.note else "")


def _sweep_section(sc: SweepClaims, page_dir: Path, figure_dir: Path, figures: dict[Path, bytes]) -> list[str]:
    sweep = sc.sweep
    lines = [f"## {sweep.title} (`{sweep.id}`)", ""]
    lines += [f"- Paper: {claim.strip()}" for claim in sweep.claims]
    measured = ", ".join(f"`{m.profile.name}` ({scale_label(m.profile)}, {m.runs} runs)" for m in sc.measured)
    lines.append(f"- Measured: {measured}")
    lines.append(f"- Not measured: {', '.join(sc.not_run)}" if sc.not_run else "- Not measured: none (every profile has runs)")
    lines.append("")
    check = sweep.report.get("check")
    claims = sc.claims()
    if not check:
        return lines + ["Its sweep file has no claim check (`report.check`).", ""]
    if not claims:
        reports = ", ".join(f"`{m.plan.sweep_command('report')}`" for m in sc.measured)
        return lines + [f"Its check (`{check}`) compares no pair of variants; its numbers are in the report: {reports}.", ""]
    m0 = sweep.metric
    for claim, rows in claims.items():
        lines += [f"### {claim}", ""]
        label = rows[0][1].metric.label if rows else m0.label  # the claim's own metric (a 5-shot claim's, too)
        lines.append(f"| profile | scale | runs (n: a / b) | a - b ({label}) | verdict |")
        lines.append("|---|---|---:|---:|---|")
        for m, c in rows:
            lines.append(f"| `{m.profile.name}` | {_md(scale_label(m.profile))} | {c.stat_a.n} / {c.stat_b.n} | "
                         f"{_md(c.delta_text())} | {_md(_verdict_cell(c))} |")  # fmt: skip
        lines.append("")
        points, xlabel = _figure_points(rows)
        if len(points) >= 2:
            path = figure_dir / _figure_name(sweep, claim)
            first = rows[0][1]
            fig = plot_claim_by_scale(claim, points, xlabel=xlabel, ylabel=f"{first.a} - {first.b} ({first.metric.unit})",
                                      title=f"{sweep.title}\n{claim}", sides=_sides(rows),
                                      names=(first.a, first.b), metric_label=first.metric.label)  # fmt: skip
            figures[path] = png_bytes(fig)
            link = Path(os.path.relpath(path, page_dir)).as_posix()
            lines += [f"![{_md(claim)}]({link})", ""]
    return lines


def build_page(gathered: list[SweepClaims], out: str | os.PathLike, figure_dir: str | os.PathLike, *, root: str | os.PathLike,
               command: str, distances: list[DistanceGroup] | None = None, registry: str = "results/") -> Page:  # fmt: skip
    """The page at ``out`` and its figures under ``figure_dir`` (drawn in memory, not written);
    ``distances`` (``attention_claim.distance_groups``) adds the attention-distance section; a claim
    figure of test accuracy draws the pixel floors its results were collected with."""
    out, figure_dir = Path(out), Path(figure_dir)
    page_dir = out.parent
    figures: dict[Path, bytes] = {}
    made_by = [m.plan.sweep_command() for sc in gathered for m in sc.measured]
    n_registry, n_local = source_counts(gathered, distances or [])
    sources = f"the {n_registry} records of the results registry (`{registry}`)"
    sources += f" and {n_local} finished local runs under `{root}`" if n_local else " (no local runs)"
    lines = [
        "# Claims at every scale",
        "",
        f"Every claim check of every sweep (its sweep file's `report.check`, as `repro report` runs it) on "
        f"{sources}, at each profile (scale) that has any. Generated by `repro claims`: no "
        "verdict on this page is written by hand.",
        "",
        "Regenerate it: the runs (each then recorded with `repro registry add runs/<experiment>`), then the page:",
        "",
        "```bash",
        *made_by,
        command,
        "```",
        "",
        "Measured on (as each run's record or results.json says):",
        "",
        *_hardware_lines(gathered),
        "",
        "Each claim reads \"a > b\" as the sweep's check states it. A row gives a - b in the metric's unit with the "
        "standard error of the difference, sqrt(s_a²/n_a + s_b²/n_b) over the seeds (n: runs of a / of b). "
        "**holds** / **does not hold**: the gap is at least 2 standard errors; **within noise**: under 2; "
        "*one seed*: a side has one run, so there is no standard error and the verdict is the sign alone. "
        "**under-trained**, whatever the gap: a side's mean test accuracy is below its pixel floor (a logistic "
        "regression on the raw pixels of the same training images, its regularisation chosen on validation: "
        "[floors.md](floors.md)), or a run of a side was still improving when it ended (the best validation "
        f"metric over the last {LAST_PART:.0%} of its steps beat the best before them by more than "
        f"{PLATEAU_THRESHOLD:g} in the metric's own units, or, for an accuracy, by more than two binomial standard "
        "errors of it on the validation set where that is larger; and early stopping had not ended it): the "
        "comparison then measures the training budget, not the models, and a longer run could turn it; the "
        "reason follows the word. A run whose learning rate anneals to zero (warm-up + cosine over its whole "
        "budget) is flat in its last part by construction, so passing this rule does not show that a longer "
        "schedule would gain nothing: a profile at a larger budget, a later row of the same claim, shows that. "
        "**no result**: a side has no finished run. "
        "Rows go from the smallest scale to the largest. A claim measured at two or more scales has a figure: "
        "a - b against the scale with ± 2 s.e. bars (a bar across zero is within noise); the shaded side of "
        "zero is where the claim holds.",
        "",
    ]
    comparisons = [c for sc in gathered for measured in sc.claims().values() for _, c in measured]
    lines += [f"Verdicts on this page, a claim at a scale each: {verdict_counts(comparisons)}.", ""]
    for sc in gathered:
        if sc.measured:
            lines += _sweep_section(sc, page_dir, figure_dir, figures)
    if distances is not None:
        lines += distance_section(distances, page_dir, figure_dir, figures)
    unmeasured = [sc for sc in gathered if not sc.measured]
    if unmeasured:
        lines += ["## Sweeps not measured", ""]
        lines += [f"- `{sc.sweep.id}` ({sc.sweep.title}): {', '.join(sc.not_run) or 'no profile'}" for sc in unmeasured]
        lines.append("")
    return Page(out, "\n".join(lines).rstrip() + "\n", figures, figure_dir)


def write_page(page: Page) -> Page:
    """The figures, then the page, each atomically; then the figures it no longer shows are removed."""
    stale = page.stale_figures()
    for path, data in page.figures.items():
        atomic_write_bytes(path, data)
    atomic_write_text(page.path, page.markdown)
    for path in stale:
        path.unlink(missing_ok=True)
    return page

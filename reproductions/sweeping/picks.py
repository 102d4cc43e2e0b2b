"""Tuned values: a tuning sweep's best point per group, and whether the sweeps that use them say the same.

A tuning sweep (``vit/tune``, ``bst/tune``) names its groups and the profiles that take its picks in
``report.picks`` (the sweep's or a profile's ``report``):

    report:
      picks:
        by: [model, train_samples]     # one pick per value of these variant axes; the product's other axes are tuned
        into:                          # the sweep profiles whose variants carry the picks
          - {sweep: vit/data_size, profile: cpu, map: {train_samples: {3000: 1000, 30000: 54000}}}
          - {sweep: bst/position, profile: cpu-movielens, set: {model: BST-b1}}

``map`` sends a value of a ``by`` axis the tuning did not run to the tuned value it takes (a size between
two tuned ones); ``set`` gives a ``by`` axis that the target's variants do not have (every variant of
bst/position is a BST-b1); ``name_is: model``: the target variant's name is its value of that axis (bst/table's
variants are named by their model and have no axes). ``only`` / ``except`` (axis -> list of values, every axis
matching) take a part of the target's variants, where two tunings share a profile (vit/data_size cpu-crop-flip:
its ViT at 1k-10k from the augmented tuning, the rest from the plain one).

``picks(plan, collected)``: per group, the variant with the best mean of the sweep's metric (higher is
better: the tuning metrics are validation accuracy and AUC), how many of the group's grid points have a
result (a pick of an incomplete group is provisional), and which tuned values sit at the grid's edge (its
smallest or largest value tried: a wider grid might move it; a smallest value of 0 is no edge). ``usages(plan, found)``: for each variant of
each ``into`` profile, whether the values its runs are given (the sweep's, profile's and variant's
overrides) are its group's pick. ``repro report`` prints both; ``repro registry check --definitions``
fails on a sweep file that disagrees with the recorded picks.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

from reproductions.sweeping.collect import VariantResults, by_name, collect
from reproductions.sweeping.plan import Plan, cli_value, make_plan
from reproductions.sweeping.records import REGISTRY_DIR
from reproductions.sweeping.spec import SweepError, Variant, load_sweep, profiles_by_sweep


@dataclass(frozen=True)
class Pick:
    group: tuple[tuple[str, Any], ...]  # the ``by`` axes and their values
    variant: str | None  # the best variant's name; None when no run of the group finished
    values: dict[str, Any]  # the tuned axes' values of that variant (short names)
    score: float | None  # its mean metric, display units
    done: int  # grid points of the group with a result
    total: int  # grid points of the group
    edges: list[str] = field(default_factory=list)  # "lr 0.004 is the largest tried"

    @property
    def complete(self) -> bool:
        return self.total > 0 and self.done == self.total


@dataclass(frozen=True)
class Usage:
    target: str  # "vit/data_size cpu"
    variant: str
    pick: Pick | None
    differs: list[str]  # "lr 0.002 (the pick: 0.004)"; empty when it agrees

    @property
    def at_pick(self) -> bool:
        """Runs at its group's complete pick: nothing to say about it."""
        return self.pick is not None and self.pick.variant is not None and not self.differs and self.pick.complete

    @property
    def status(self) -> str:
        if self.pick is None or self.pick.variant is None:
            return "not tuned: no run of its group"
        which = "the pick" if self.pick.complete else f"the provisional pick ({self.pick.done} of {self.pick.total} runs)"
        return f"differs from {which}: " + "; ".join(self.differs) if self.differs else which


def spec_of(plan: Plan) -> dict[str, Any] | None:
    """The plan's ``report.picks``, checked; None when the sweep has none."""
    spec = plan.sweep.report.get("picks")
    if spec is None:
        return None
    where = f"{plan.sweep.path}: report.picks"
    if not isinstance(spec, dict) or not isinstance(spec.get("by"), list) or not spec["by"]:
        raise SweepError(f"{where}={spec!r}: expected a mapping with by: [variant axes] (and into: [...])")
    into = spec.get("into") or []
    if not isinstance(into, list) or any(not isinstance(t, dict) or not t.get("sweep") or not t.get("profile") for t in into):
        raise SweepError(f"{where}.into={into!r}: expected a list of {{sweep: ..., profile: ...}} (map, set optional)")
    for t in into:
        for key in ("only", "except"):
            part = t.get(key)
            if part is not None and (not isinstance(part, dict) or any(not isinstance(v, list) for v in part.values())):
                raise SweepError(f"{where}.into {t['sweep']} {t['profile']}: {key}={part!r}: expected axis: [values, ...]")
    return spec


def _matches(axes: dict[str, Any], part: dict[str, list]) -> bool:
    """Every axis of ``part`` has one of its values among a target variant's ``axes`` (``only`` / ``except``)."""
    return all(axes.get(k) in values for k, values in part.items())


def tuned_axes(plan: Plan, by: list[str]) -> list[str]:
    """The axes the tuning varies inside a group (lr, weight decay), in the variants' order: the axes that are not
    ``by`` and take more than one value among the variants of one group (not BST's blocks, one per model)."""
    seen: dict[tuple[tuple, str], set] = {}
    order: list[str] = []
    for v in plan.variants:
        for k, x in v.axes.items():
            if k not in by:
                seen.setdefault((_group(v, by), k), set()).add(repr(x))
                order += [k] if k not in order else []
    return [k for k in order if any(len(vals) > 1 for (_, key), vals in seen.items() if key == k)]


def _group(variant: Variant, by: list[str]) -> tuple[tuple[str, Any], ...]:
    return tuple((k, variant.axes.get(k)) for k in by)


def picks(plan: Plan, collected: list[VariantResults]) -> list[Pick]:
    """The best variant of each group of ``plan`` (see the module docstring), in the plan's order."""
    spec = spec_of(plan)
    if spec is None:
        return []
    by = spec["by"]
    missing = [k for k in by if any(k not in v.axes for v in plan.variants)]
    if missing:
        raise SweepError(f"{plan.sweep.path}: report.picks.by names {missing[0]!r}, not an axis of every variant")
    tuned = tuned_axes(plan, by)
    results = by_name(collected)
    groups: dict[tuple, list[Variant]] = {}
    for v in plan.variants:
        groups.setdefault(_group(v, by), []).append(v)
    out = []
    for group, variants in groups.items():
        scored = []
        for v in variants:
            vr = results.get(v.name)
            mean = vr.metric(plan).mean if vr is not None else None
            if mean is not None and math.isfinite(mean):
                scored.append((mean, v))
        if not scored:
            out.append(Pick(group, None, {}, None, 0, len(variants)))
            continue
        score, best = max(scored, key=lambda sv: sv[0])  # the first of equals, in the plan's order
        values = {k: best.axes.get(k) for k in tuned}
        edges = []
        for k in tuned:
            tried = sorted({v.axes.get(k) for _, v in scored if isinstance(v.axes.get(k), (int, float))})  # run, not planned
            low = values[k] == tried[0] and values[k] > 0  # 0 (no dropout) cannot go lower: not an edge
            if len(tried) > 1 and (low or values[k] == tried[-1]):
                edges.append(f"{k} {cli_value(values[k])} is the {'smallest' if values[k] == tried[0] else 'largest'} tried")
        out.append(Pick(group, best.name, values, score, len(scored), len(variants), edges))
    return out


def usages(plan: Plan, found: list[Pick], *, root: str = "runs") -> list[Usage]:
    """Each variant of each ``report.picks.into`` profile, with whether it runs at its group's pick."""
    spec = spec_of(plan)
    if spec is None:
        return []
    by, aliases = spec["by"], plan.sweep.aliases
    tuned = tuned_axes(plan, by)
    by_group = {p.group: p for p in found}
    out = []
    for target in spec.get("into") or []:
        tplan = make_plan(target["sweep"], target["profile"], root=root)
        label = f"{tplan.sweep.id} {tplan.profile.name}"
        mapping, named = target.get("map") or {}, target.get("name_is")
        only, skip = target.get("only"), target.get("except")
        for v in tplan.variants:
            fixed = {**({named: v.name} if named else {}), **(target.get("set") or {})}
            axes = {**v.axes, **fixed}
            if (only is not None and not _matches(axes, only)) or (skip is not None and _matches(axes, skip)):
                continue
            group = []
            for k in by:
                if k not in fixed and k not in v.axes:
                    raise SweepError(f"{plan.sweep.path}: report.picks.into {label}: variant {v.name!r} has no axis {k!r}; "
                                     f"give it with set: {{{k}: ...}}")  # fmt: skip
                value = fixed.get(k, v.axes.get(k))
                group.append((k, (mapping.get(k) or {}).get(value, value)))
            pick = by_group.get(tuple(group))
            given = {**tplan.sweep.overrides, **tplan.profile.overrides, **v.overrides}
            differs = []
            if pick is not None and pick.variant is not None:
                for k in tuned:
                    key = aliases.get(k, k)
                    have = given.get(key, "(not set by the sweep file)")
                    if not _same(have, pick.values.get(k)):
                        differs.append(f"{k} {cli_value(have)} (the pick: {cli_value(pick.values.get(k))})")
            out.append(Usage(label, v.name, pick, differs))
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) and not isinstance(b, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
    return a == b


def picks_markdown(plan: Plan, found: list[Pick], used: list[Usage], *, heading: bool = True) -> list[str]:
    """The report's section: the picks table, then every usage that is not the complete pick; ``heading``: under
    a ``##`` heading (the report), else a bold line (a README block)."""
    if not found:
        return []
    m = plan.sweep.metric
    by = [k for k, _ in found[0].group]
    tuned = tuned_axes(plan, by)
    title = f"Picks: the best point of each {by[0] if len(by) == 1 else '(' + ', '.join(by) + ')'} ({m.label})"
    lines = [f"## {title}" if heading else f"**{title}**", "",
             "| " + " | ".join([*by, *tuned, m.label, "runs", "at the grid's edge"]) + " |",
             "|" + "|".join(["---"] * len(by) + ["---:"] * (len(tuned) + 2) + ["---"]) + "|"]  # fmt: skip
    for p in found:
        cells = [cli_value(v) for _, v in p.group]
        cells += [cli_value(p.values[k]) if k in p.values else "–" for k in tuned]
        cells += ["–" if p.score is None else f"{p.score:.{m.digits}f}", f"{p.done} of {p.total}",
                  "–" if p.variant is None else "; ".join(p.edges) or "no"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    if used:
        odd = [u for u in used if not u.at_pick]
        targets = sorted({u.target for u in used})
        lines.append(f"Used by {', '.join(f'`{t}`' for t in targets)}: "
                     + ("every variant runs at its group's complete pick." if not odd else f"{len(used) - len(odd)} of "
                        f"{len(used)} variants run at their group's complete pick; the others:"))  # fmt: skip
        grouped: dict[tuple[str, str], list[str]] = {}  # one line per variant and status, naming its profiles
        for u in odd:
            grouped.setdefault((u.variant, u.status), []).append(u.target)
        every = "both" if len(targets) == 2 else f"all {len(targets)}"  # a variant off its pick wherever it is used
        lines += [f"- `{v}` ({every if len(targets) > 1 and sorted(ts) == targets else ', '.join(f'`{t}`' for t in ts)}): "
                  f"{status}" for (v, status), ts in grouped.items()]  # fmt: skip
        lines.append("")
    return lines


def disagreements(used: list[Usage]) -> list[str]:
    """The usages whose values differ from their group's complete pick (every grid point has a result), one
    line each; a provisional pick may still change, so a sweep file is not held to it."""
    return [f"{u.target} {u.variant}: {u.status}" for u in used if u.differs and u.pick is not None and u.pick.complete]


def registry_disagreements(records: list, registry: str | os.PathLike = REGISTRY_DIR) -> list[str]:
    """``disagreements`` of every sweep profile with ``report.picks``, its picks taken from ``records`` (those of
    the results registry at ``registry``, ``read_registry``): what ``repro registry check --definitions`` reports."""
    out = []
    for sweep_id, profiles in profiles_by_sweep().items():
        sweep = load_sweep(sweep_id)
        for profile in profiles:
            if "picks" not in {**sweep.report, **sweep.profile(profile).report}:
                continue
            plan = make_plan(sweep, profile)
            found = picks(plan, collect(plan, registry=registry, local=False, read=records))
            out += [f"{sweep_id} --profile {profile} picks: {line}" for line in disagreements(usages(plan, found))]
    return out

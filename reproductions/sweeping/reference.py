"""A rerun beside the reference: a user's runs of a sweep profile against the registry's records
of the same profile, per variant, with a verdict.

For each variant: the reference (the registry's records: mean ± sample std, n, the hardware they
ran on) and the user's runs (mean ± std, n), the difference (yours - reference) and its standard
error sqrt(s_ref²/n_ref + s_yours²/n_yours). A side with one run has no standard deviation of its
own; the other side's stands in for it (the seed-to-seed spread is the noise of one run). Then:

- **reproduced**: the difference is under 2 standard errors (within the reference's noise);
- **differs by k s.e.**: k = |difference| / standard error is 2 or more (higher or lower);
- **one run each**: neither side has a spread, so only the difference is shown;
- your runs that are the reference's own records (the same run found in both places) are left
  out of "yours";
- **not comparable: ...**: what decides the number differs between your runs and the reference
  (``comparable``: the data, the model, the budget or another setting of the resolved config):
  the row names what differs, part by part, and gives no difference and no verdict (a run on
  other data, with another model or budget, is another experiment, not a failed reproduction);
- a seed run on the same hardware (the same CPU and instruction set, or GPU model) as a
  reference record of that seed repeats it exactly when the code and versions are the same:
  such seeds are counted (``exact``: "2 of 3 seeds repeat the reference exactly"); a mismatch
  there points at a change in code, versions or data rather than noise.

Layer: beside ``report`` (imports collect, comparable, reuse, tables and results).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from reproductions.run.results import hardware_summary, metric_value, same_hardware
from reproductions.sweeping.collect import Stat, VariantResults, same_run
from reproductions.sweeping.comparable import Difference, describe, differences
from reproductions.sweeping.plan import Plan
from reproductions.sweeping.reuse import run_config
from reproductions.sweeping.tables import fmt_stat, markdown_table

#: |difference| below this many standard errors: within the reference's noise
NOISE_SE = 2.0


@dataclass
class Against:
    variant: str
    reference: Stat
    yours: Stat
    hardware: str  # the reference's
    difference: float | None
    se: float | None
    exact: tuple[int, int]  # (seeds that repeat the reference exactly, seeds with a same-hardware reference)
    own: int = 0  # your runs that are the reference's own records (left out of "yours")
    differs: list[Difference] = field(default_factory=list)  # what decides the number and differs (none: comparable)
    differs_text: str = ""  # ``comparable.describe`` of ``differs``

    @property
    def comparable(self) -> bool:
        return not self.differs

    @property
    def k(self) -> float | None:
        if self.difference is None or not self.se:
            return None
        return abs(self.difference) / self.se

    def verdict(self, unit: str, digits: int) -> str:
        if self.reference.n == 0:
            return "no reference record"
        if self.yours.n == 0:
            return f"the reference's own {self.own} run{'s' if self.own != 1 else ''}: nothing to compare" if self.own else "not run"
        if not self.comparable:
            return f"not comparable: {self.differs_text}"
        exact = f"; {self.exact[0]} of {self.exact[1]} seeds repeat the reference exactly" if self.exact[1] else ""
        if self.exact[1] and self.exact[0] == self.exact[1] == self.yours.n:
            return "reproduced exactly (same hardware, same seeds)"
        if self.k is None:
            return f"one run each: no noise estimate ({self.difference:+.{digits}f} {unit}){exact}"
        if self.k < NOISE_SE:
            return f"reproduced (within the reference's noise: {self.k:.1f} s.e.){exact}"
        side = "higher" if (self.difference or 0) > 0 else "lower"
        return f"differs by {self.k:.1f} s.e. ({side}){exact}"


def _pair_se(a: Stat, b: Stat) -> float | None:
    sa, sb = a.std if a.std is not None else b.std, b.std if b.std is not None else a.std
    if sa is None or sb is None or a.n == 0 or b.n == 0:
        return None
    return math.sqrt(sa**2 / a.n + sb**2 / b.n)


def against_reference(plan: Plan, yours: list[VariantResults], reference: list[VariantResults]) -> list[Against]:
    """One comparison per planned variant (see the module docstring)."""
    m = plan.sweep.metric
    ref_by = {vr.variant.name: vr for vr in reference}
    out = []
    for vr in yours:
        ref = ref_by.get(vr.variant.name) or VariantResults(vr.variant, floors_dir=vr.floors_dir)
        own = [r for r in vr.results if any(same_run(r, x) for x in ref.results)]
        vr = VariantResults(vr.variant, [r for r in vr.results if not any(r is x for x in own)], floors_dir=vr.floors_dir)
        a, b = ref.column(m), vr.column(m)
        diff = None if a.mean is None or b.mean is None else b.mean - a.mean
        differs: list[Difference] = []
        pair: tuple[dict, dict] = ({}, {})  # the first run that differs and its reference record
        for r in vr.results:
            twin = next((x for x in ref.results if x.get("seed") == r.get("seed")), ref.results[0] if ref.results else None)
            found = differences(r, _config_of(plan, r), twin) if twin is not None else []
            if found and not differs:
                pair = (r, twin)
            differs += found
        same = exact = 0
        for r in vr.results:
            twins = [x for x in ref.results if x.get("seed") == r.get("seed") and same_hardware(x.get("hardware"), r.get("hardware"))]
            if twins:
                same += 1
                exact += any(metric_value(x, m.key) == metric_value(r, m.key) for x in twins)
        out.append(Against(vr.variant.name, a, b, hardware_summary(ref.results), diff, _pair_se(a, b), (exact, same), len(own),
                           differs, describe(differs, *pair) if differs else ""))  # fmt: skip
    return out


def _config_of(plan: Plan, results: dict) -> dict | None:
    """A run's resolved config: a record's ``config``, else its run directory's ``config.yaml``
    (None where there is none: the config is then not compared)."""
    if isinstance(results.get("config"), dict):
        return results["config"]
    return run_config(plan.experiment_dir / str(results.get("variant")) / f"seed{results.get('seed')}")


def reference_table(plan: Plan, rows: list[Against]) -> tuple[list[str], list[list[str]]]:
    m = plan.sweep.metric
    header = ["variant", f"reference: {m.label}", "ref. n", "reference hardware", f"yours: {m.label}", "your n", "yours - reference",
              "verdict"]  # fmt: skip
    body = []
    for a in rows:
        diff = "–" if a.difference is None or not a.comparable else (
            f"{a.difference:+.{m.digits}f}" + (f" ± {a.se:.{m.digits}f}" if a.se else ""))
        body.append([a.variant, fmt_stat(a.reference, m.digits), str(a.reference.n), a.hardware, fmt_stat(a.yours, m.digits),
                     str(a.yours.n), diff, a.verdict(m.unit, m.digits)])  # fmt: skip
    return header, body


def reference_markdown(plan: Plan, rows: list[Against], registry_label: str = "results/") -> list[str]:
    """The report's section: how to read it and the table."""
    m = plan.sweep.metric
    return [
        "## Beside the reference",
        "",
        f"The reference is the registry's records of `{plan.sweep.id}` at `{plan.profile.name}` (`{registry_label}`). "
        f"Yours - reference in {m.unit} ± the standard error sqrt(s_ref²/n_ref + s_yours²/n_yours) (a side with one "
        f"run borrows the other's spread); **reproduced** under {NOISE_SE:g} standard errors, else **differs by k s.e.** "
        "A variant is judged only where what decides its number is the same on both sides: the data (its source, "
        "the counts and samples per split the runs recorded), the model (`model.*`), the budget (epochs, steps, batch "
        "size) and every other setting of the resolved config; where one differs the row says **not comparable** and "
        "names it (another experiment, not a failed reproduction).",
        "",
        markdown_table(*reference_table(plan, rows)),
        "",
    ]

"""The report: a sweep's results as one Markdown file beside the paper, with its figure, on
stdout and (optionally) in W&B.

``write_report(plan)`` reads every ``results.json`` under ``<root>/<sweep>-<profile>/`` (the
planned seeds, plus any other finished ``seed<k>`` found there) and writes, atomically, into
that directory:

- ``report.md``: how the runs were made (sweep, profile, command, base config, data, code
  version), the paper's reference and claims, the table (``reproductions.sweeping.tables``:
  variant, our metric mean ± sample std over n seeds, the sweep file's extra metric
  ``columns``, the paper's value per reference column, parameters, GFLOPs per image, total
  training FLOPs, training images/s, training time per run), the numbers the claims are about
  (``report.check``, ``reproductions.sweeping.checks``), the figure, and every planned run that
  is missing or failed (never dropped silently: a variant without results stays in the table
  with n = 0), and every run left out because its ``results.json`` is not its own (another
  experiment's, variant's or seed's, or without the sweep's metric: ``collect.foreign``), which
  the terminal also shows as a ``warning:`` line per run directory;
- ``<axis>.png``: the sweep file's ``report.plot`` (``reproductions.sweeping.figures``).

More report options (``report:`` in the sweep file): ``unit`` (what one input is called in the
compute columns, default ``image``: ``GFLOPs/image``, ``train images/s``); ``flops: si`` (FLOPs
per input as 1.2M rather than in GFLOPs, for small nets); ``relaimpr:
{baseline: WDL}`` adds a RelaImpr column against that variant, from the main metric's means
(RelaImpr = ((AUC - 0.5) / (AUC_base - 0.5) - 1) x 100%, as DIN and BST report it). A metric
with a ``ceiling`` (a results.json path such as ``data.ceiling.test_auc``; the synthetic CTR
data records the AUC of its own true click probabilities) adds a "to ceiling" column for the
main metric and a ceiling row.

``write_comparison(plans)``: one sweep at several profiles (``report vit/position --profile cpu
--profile fmnist``) side by side, into ``<root>/<sweep>-<p1>+<p2>/report.md``: per variant our
metric at each profile (mean ± std, n) beside the paper's values, then the claim checks of each
profile, each marked holds / does not hold / within noise with its standard error.

``render(plan)`` does the same without writing report.md (the notebooks' entry point). With
``wandb=True`` the same table and figure go to W&B as a ``report`` run in the sweep's group
(offline unless a key is configured, the rule of ``reproductions.run.tracking.wandb_offline``).
"""

from __future__ import annotations

import datetime as _dt
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from reproductions.sweeping.checks import ClaimLine, check_claims
from reproductions.sweeping.collect import VariantResults, collect
from reproductions.sweeping.figures import figure
from reproductions.sweeping.floors import FLOORS_DIR
from reproductions.sweeping.plan import Plan, cli_value
from reproductions.sweeping.picks import picks, picks_markdown, usages
from reproductions.sweeping.records import FLOORS_DIR_NAME, REGISTRY_DIR
from reproductions.sweeping.reference import against_reference, reference_markdown, reference_table
from reproductions.sweeping.spec import REPO_ROOT, SweepError
from reproductions.sweeping.tables import (
    fmt_paper,
    fmt_seconds,
    fmt_stat,
    markdown_table,
    table,
    text_table,
    variant_floors,
)
from utils.atomic import atomic_write_text

REPORT_FILE = "report.md"
FLOOR_NOTE = ("The pixel logistic regression rows are the floors of the same training images (raw pixels in "
              "[0, 1], C chosen on the validation split, then one test evaluation; `results/floors/`, made by "
              "`repro registry floors`, docs/floors.md): a model below its floor, marked \"(below floor)\", is "
              "under-trained, whatever the claim.")  # fmt: skip


@dataclass
class Report:
    path: Path
    figures: list[Path]
    header: list[str]
    rows: list[list[str]]
    missing: list[str]
    markdown: str
    claims: list[str] = field(default_factory=list)  # the report.check summary lines
    warnings: list[str] = field(default_factory=list)  # one per run left out: its results.json is not its own
    claim_lines: list[ClaimLine] = field(default_factory=list)  # the same lines with the comparisons they check
    reference: tuple[list[str], list[list[str]]] | None = None  # your runs beside the registry's (header, rows)
    source: str = "local"  # what the table shows: ``local`` runs, or the ``registry``'s records (no local run)


def rejected_warnings(plan: Plan, collected: list[VariantResults]) -> list[str]:
    """One line per run directory whose finished results.json was left out (``collect.foreign``)."""
    return [f"{plan.experiment_dir / vr.variant.name / f'seed{seed}'}: {why}" for vr in collected for seed, why in vr.rejected]


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
    if variant_floors(plan, collected):
        lines += [FLOOR_NOTE, ""]
    found = picks(plan, collected)
    lines += picks_markdown(plan, found, usages(plan, found, root=str(plan.root)))
    claim_lines = check_claims(plan, collected)
    claims = [line.text for line in claim_lines]
    if sweep.report.get("check"):
        lines += ["## Our numbers on the claim", ""]
        lines += claims_markdown(claims)
        lines.append("")
    if figures:
        lines += ["## Figures", ""]
        lines += [f"![{f.stem}]({f.name})" for f in figures]
        lines.append("")
    lines += ["## Missing or failed runs", ""]
    lines += [f"- {m}" for m in missing] if missing else ["None: every planned run finished."]
    lines.append("")
    text = "\n".join(lines)
    return Report(plan.experiment_dir / REPORT_FILE, figures, header, rows, missing, text, claims,
                  rejected_warnings(plan, collected), claim_lines)


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
    for root in (Path.cwd(), REPO_ROOT):
        try:
            return str(Path(path).resolve().relative_to(root.resolve()))
        except ValueError:
            continue
    return str(path)


def log_to_wandb(plan: Plan, report: Report, project: str = "attention-repro") -> None:
    """The report as the sweep's W&B ``report`` run, as data (``reproductions.sweeping.publish``)."""
    from reproductions.sweeping.publish import publish

    publish(plan, report, project)


def claims_markdown(claims: Sequence[str]) -> list[str]:
    """The claim lines as a markdown list, each pair's check (indented) nested under its claim."""
    return [f"- {line}" if not line.startswith("  ") else f"  - {line.strip()}" for line in claims]


def render(plan: Plan, figure_dir: str | os.PathLike | None = None, *,
           registry: str | os.PathLike | None = REGISTRY_DIR) -> Report:  # fmt: skip
    """Collect the results, draw the figure (into ``figure_dir``, default the experiment's
    directory) and build the report, writing no report.md (the notebook's entry point).

    With a ``registry`` that holds records of this sweep and profile: your runs (under the
    plan's root) get a section beside that reference (``reference``); with no run of yours, the
    report is the reference's own (its records, said so at the top)."""
    floors_dir = Path(registry) / FLOORS_DIR_NAME if registry is not None else FLOORS_DIR
    collected = collect(plan, floors_dir=floors_dir)
    reference = collect(plan, registry=registry, local=False) if registry is not None else []
    own, recorded = any(vr.results for vr in collected), any(vr.results for vr in reference)
    source = "registry" if recorded and not own else "local"
    if source == "registry":
        collected = reference
    figures = []
    fig_dir = Path(figure_dir) if figure_dir is not None else plan.experiment_dir
    fig = figure(plan, collected, fig_dir / f"{plan.sweep.axis}.png")
    if fig is not None:
        figures.append(fig)
    report = build_report(plan, collected, figures)
    label = _rel(Path(registry)) + "/" if registry is not None else ""
    if source == "registry":
        note = (f"No runs of yours under `{plan.experiment_dir}`: this is the reference, the {sum(len(vr.results) for vr in reference)} "
                f"records of the results registry (`{label}`). Run `{plan.sweep_command()}` to compare yours with it.")  # fmt: skip
        report.markdown = report.markdown.replace("\n## ", f"\n{note}\n\n## ", 1)
        report.source = "registry"
    elif recorded:
        rows = against_reference(plan, collected, reference)
        report.reference = reference_table(plan, rows)
        section = "\n".join(reference_markdown(plan, rows, label))
        marker = "## Figures" if "\n## Figures" in report.markdown else "## Missing or failed runs"
        report.markdown = report.markdown.replace(f"\n{marker}", f"\n{section}\n{marker}", 1)
    return report


def print_report(report: Report, title: str, out: TextIO) -> None:
    """The terminal's view of a written report: table, claim lines, missing runs, where it lies."""
    print(f"\n{title}", file=out)
    for line in report.warnings:
        print(f"warning: {line}", file=out)
    if report.source == "registry":
        print("no runs of yours here: the reference records of the results registry", file=out)
    print(text_table(report.header, report.rows), file=out)
    for line in report.claims:
        print(f"  {line}", file=out)
    if report.reference is not None:
        print("beside the reference (the results registry):", file=out)
        print(text_table(*report.reference), file=out)
    if report.missing:
        print(f"missing or failed runs ({len(report.missing)}):", file=out)
        for m in report.missing:
            print(f"  {m.replace('`', '')}", file=out)
    print(f"report: {report.path}" + "".join(f"\nfigure: {f}" for f in report.figures), file=out)


def write_report(plan: Plan, *, wandb: bool = False, project: str = "attention-repro", out: TextIO | None = None,
                 registry: str | os.PathLike | None = REGISTRY_DIR) -> Report:  # fmt: skip
    """Collect, draw, write ``report.md`` atomically, print the table (and log to W&B)."""
    out = out or sys.stdout
    report = render(plan, registry=registry)
    atomic_write_text(report.path, report.markdown)
    print_report(report, f"{plan.sweep.title} ({plan.experiment})", out)
    if wandb:
        log_to_wandb(plan, report, project)
    return report


def comparison_dir(plans: list[Plan]) -> Path:
    """``<root>/<sweep>-<p1>+<p2>...``: beside the profiles' own experiment directories."""
    first = plans[0]
    name = f"{first.sweep.id}-" + "+".join(p.profile.name for p in plans)
    return first.experiment_dir.parent / Path(name).name


def build_comparison(plans: list[Plan], collected: list[list[VariantResults]]) -> Report:
    """The side-by-side table and every profile's claim lines (see the module docstring)."""
    sweep = plans[0].sweep
    m = sweep.metric
    names = list(dict.fromkeys(vr.variant.name for col in collected for vr in col))
    variants = {vr.variant.name: vr.variant for col in reversed(collected) for vr in col}
    per_profile = [{vr.variant.name: vr for vr in col} for col in collected]
    header = ["variant"]
    for plan in plans:
        header += [f"{plan.profile.name}: {m.label}", "n", f"{plan.profile.name}: time/run"]
    header += [ref.label for ref in sweep.references]
    rows = []
    for name in names:
        row = [name]
        for by in per_profile:
            vr = by.get(name)
            stat = vr.metric(plans[0]) if vr is not None else None
            row += [fmt_stat(stat, m.digits) if stat is not None else "(not in this profile)",
                    str(stat.n) if stat is not None else "–",
                    fmt_seconds(vr.stat("training.fit_time_s").mean) if vr is not None else "–"]
        row += [fmt_paper(ref, variants[name], m) for ref in sweep.references]
        rows.append(row)
    lines = [f"# {sweep.title}: " + " vs ".join(f"`{p.profile.name}`" for p in plans), ""]
    for plan, col in zip(plans, collected):
        done = sum(len(vr.results) for vr in col)
        desc = plan.profile.description.strip() if plan.profile.description else ""
        lines.append(f"- `{plan.profile.name}`" + (f" ({desc})" if desc else "")
                     + f": {done} finished runs, seeds planned {', '.join(map(str, plan.seeds))}; `{plan.sweep_command()}`")
    lines += [
        f"- This comparison: `repro report {sweep.id} "
        + " ".join(f"--profile {p.profile.name}" for p in plans) + "`",
        f"- {m.label}: mean ± sample std (n - 1) over the n seeds",
        f"- Written {_dt.datetime.now(_dt.timezone.utc).isoformat(timespec='seconds')}",
        "",
    ]
    if sweep.references or sweep.claims:
        lines += ["## The paper", ""]
        lines += [f"- **{ref.label}**" + (f": {ref.note.strip()}" if ref.note else "") for ref in sweep.references]
        lines += [f"- Claim: {claim.strip()}" for claim in sweep.claims]
        lines.append("")
    lines += ["## Results", "", markdown_table(header, rows), ""]
    claims: list[str] = []
    claim_lines: list[ClaimLine] = []
    if sweep.report.get("check"):
        lines += ["## Our numbers on the claim, per profile", ""]
        for plan, col in zip(plans, collected):
            checked = check_claims(plan, col)
            claim_lines += checked
            these = [line.text for line in checked]
            claims += [f"[{plan.profile.name}] {line}" if not line.startswith("  ") else line for line in these]
            lines += [f"### `{plan.profile.name}`", ""]
            lines += [f"- {line}" if not line.startswith("  ") else f"  - {line.strip()}" for line in these]
            lines.append("")
    missing = [
        f"`{plan.profile.name}` `{vr.variant.name}` seed {seed}: {why}"
        for plan, col in zip(plans, collected) for vr in col for seed, why in vr.missing
    ]  # fmt: skip
    lines += ["## Missing or failed runs", ""]
    lines += [f"- {x}" for x in missing] if missing else ["None: every planned run finished."]
    lines.append("")
    warnings = [w for plan, col in zip(plans, collected) for w in rejected_warnings(plan, col)]
    return Report(comparison_dir(plans) / REPORT_FILE, [], header, rows, missing, "\n".join(lines), claims, warnings,
                  claim_lines)


def write_comparison(plans: list[Plan], *, out: TextIO | None = None) -> Report:
    """Collect every profile's runs, write the comparison's report.md atomically, print the table."""
    out = out or sys.stdout
    ids = {p.sweep.id for p in plans}
    if len(ids) != 1 or len(plans) < 2:
        raise SweepError(f"a comparison needs one sweep at two or more profiles, got {sorted(ids)} x {len(plans)}")
    report = build_comparison(plans, [collect(p) for p in plans])
    atomic_write_text(report.path, report.markdown)
    print_report(report, plans[0].sweep.title, out)
    return report

"""A sweep's report in W&B, as data: the ``report`` run of ``report --wandb`` (and ``sweep --wandb``).

One report run per sweep and profile: its id is kept in ``<root>/<sweep>-<profile>/wandb/run_id``
(as a run directory keeps its own), so reporting again continues that run (one more step of its
history) instead of adding one. It lies in the sweep's W&B group with job type ``report``, name
``<experiment>/report`` and ``run.variant`` = ``report`` in its config (so grouping the group's
runs by ``run.variant`` puts it apart from the variants). Each report logs:

- ``report/numbers``: one row per variant, one column per number: the variant, each ablation
  axis's value, ``mean``, ``std``, ``n``, ``s.e.`` (std / sqrt n) of the sweep's metric (in its
  display units), per paper column the paper's value and ``ours - paper``, ``params``,
  ``GFLOPs/sample``, ``samples/s`` (training throughput) and ``time/run (s)``;
- ``report/claims``: one row per comparison the claim checks make (``claims.Comparison``): the
  claim (``a > b``, with where it is made), the line it comes from, the difference a - b, its
  standard error and the verdict (``holds``, ``does not hold``, ``within noise``, ``no result``);
- ``report/table``: the Markdown report's table as text, and the figures as images;
- report.md as a file of the run.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any

from reproductions.sweeping.checks import VERDICTS, ClaimLine
from reproductions.sweeping.collect import VariantResults, collect
from reproductions.sweeping.plan import Plan
from reproductions.sweeping.tables import paper_value


def _axes(plan: Plan) -> list[str]:
    return list(dict.fromkeys(k for v in plan.variants for k in v.axes))


def _cell(value: Any) -> Any:
    """A W&B table cell: numbers as numbers, the rest as text (None stays empty)."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return str(value)


def numbers_table(plan: Plan, collected: list[VariantResults]) -> tuple[list[str], list[list[Any]]]:
    """The report as numbers: ``report/numbers``'s columns and rows (see the module docstring)."""
    sweep, m = plan.sweep, plan.sweep.metric
    axes = _axes(plan)
    columns = ["variant", *axes, "mean", "std", "n", "s.e."]
    for col in sweep.columns:
        columns += [f"{col.key} mean", f"{col.key} std"]
    for ref in sweep.references:
        columns += [f"paper: {ref.label}", f"ours - paper: {ref.label}"]
    columns += ["params", "GFLOPs/sample", "samples/s", "time/run (s)"]
    rows = []
    for vr in collected:
        stat = vr.metric(plan)
        se = stat.std / math.sqrt(stat.n) if stat.std is not None and stat.n else None
        row: list[Any] = [vr.variant.name, *(_cell(vr.variant.axes.get(a)) for a in axes), stat.mean, stat.std, stat.n, se]
        for col in sweep.columns:
            extra = vr.column(col)
            row += [extra.mean, extra.std]
        for ref in sweep.references:
            pv = vr.variant.paper.get(ref.key)
            paper = paper_value(ref, pv.value, m) if pv is not None else None
            row += [paper, None if paper is None or stat.mean is None else stat.mean - paper]
        flops = vr.stat("model.flops_per_sample").mean
        row += [vr.stat("model.params").mean, None if flops is None else flops / 1e9,
                vr.stat("training.samples_per_sec").mean, vr.stat("training.fit_time_s").mean]
        rows.append(row)
    return columns, rows


def claims_table(lines: list[ClaimLine]) -> tuple[list[str], list[list[Any]]]:
    """The claim checks' comparisons as rows: claim, comparison (the line), difference a - b,
    standard error, verdict. Lines that compare nothing (spreads, headings) are left out."""
    rows = [[c.claim, line.text.strip(), c.difference, c.se, c.verdict]
            for line in lines if (c := line.comparison) is not None]  # fmt: skip
    return ["claim", "comparison", "difference", "s.e.", "verdict"], rows


def report_config(plan: Plan, collected) -> dict[str, Any]:
    """The report run's config, equal to what its tables show: the seeds of the finished runs the
    tables hold (``seeds``; the plan's ``seeds_planned`` beside them), the grid (variants and their
    seeds), the metric, the command that made the runs and the one that made this report."""
    import shlex

    grid = {vr.variant.name: sorted(int(r.get("seed")) for r in vr.results if isinstance(r.get("seed"), int))
            for vr in collected}  # fmt: skip
    return {"sweep": plan.sweep.id, "profile": plan.profile.name,
            "seeds": sorted({s for seeds in grid.values() for s in seeds}), "seeds_planned": list(plan.seeds),
            "grid": grid, "finished_runs": sum(len(v) for v in grid.values()), "metric": plan.sweep.metric.key,
            "made_by": plan.sweep_command(), "command": shlex.join(["repro", *sys.argv[1:]]),
            "run": {"variant": "report", "experiment": plan.experiment}}  # fmt: skip


def publish(plan: Plan, report, project: str = "attention-repro") -> str:
    """Log ``report`` (a ``reproductions.sweeping.sweep_report.Report``) as the sweep's report run;
    returns its W&B run id. Online or offline as ``tracking.wandb_mode`` says (said in one line)."""
    import wandb

    from reproductions.run.artifacts import keep_tables
    from reproductions.run.tracking import init_run, keep_run_id, save_with_run

    directory = plan.experiment_dir
    run_id = keep_run_id(directory)
    step = len(list((directory / "wandb").glob(f"*run-*-{run_id}")))  # one step per report made
    collected = collect(plan)
    run = init_run(dict(
        project=project, id=run_id, resume="allow", group=plan.experiment, name=f"{plan.experiment}/report",
        job_type="report", tags=list(dict.fromkeys([plan.sweep.axis, plan.profile.name, plan.sweep.id])),
        dir=str(directory), reinit="finish_previous",  # never hand back a run left open in this process
        config=report_config(plan, collected),
    ))  # fmt: skip
    try:
        columns, rows = numbers_table(plan, collected)
        claim_columns, claim_rows = claims_table(report.claim_lines)
        tables = {"report/numbers": (columns, rows), "report/claims": (claim_columns, claim_rows),
                  "report/table": (report.header, report.rows)}
        if run.offline:  # kept as files with a pending entry, logged by repro sync (see keep_tables)
            keep_tables(run, directory, tables)
            payload: dict[str, Any] = {}
        else:
            payload = {key: wandb.Table(columns=list(c), data=[list(r) for r in rs]) for key, (c, rs) in tables.items()}
        for fig in report.figures:
            payload[f"report/{fig.stem}"] = wandb.Image(str(fig))
        run.log(payload, step=step)
        run.summary["report/missing_runs"] = len(report.missing)
        run.summary["report/finished_runs"] = sum(row[columns.index("n")] or 0 for row in rows)
        save_with_run(run, report.path.parent, [report.path.name])  # a copy with the run, not a link
        return run.id
    finally:
        run.finish()


def log_references(records, *, project: str = "attention-repro", root: str | os.PathLike = "runs",
                   group: str | None = None) -> list[str]:  # fmt: skip
    """Each registry record (``records.Record``) as a W&B run of job type ``reference`` in its
    sweep's group (``group``, default the group of the sweep's own runs, ``<sweep>-<profile>``), so a team's charts
    and tables show the repository's reference beside their runs. Name
    ``<experiment>/<variant>/seed<k>/reference``; tags ``reference``, the variant, the profile,
    the sweep and ``seed<k>``; config: the sweep, profile, variant, seed, overrides, config digest,
    hardware, versions and commit the record holds, with ``run.variant`` as the sweep's runs
    have it (grouping by ``run.variant`` puts each reference beside that variant's runs); history:
    the record's validation curve at its steps (``time/fit_elapsed_s`` and the ``val/`` metrics);
    summary: the results as a fit's summary has them (``test/...``, ``final/...``, ``results/...``).

    The run id is fixed by the record (``ref<record id>``), so logging a record again resumes the
    same run. Files go under ``<root>/registry/<sweep>/<profile>/<variant>/seed<k>/``: offline
    here, ``repro sync <root>/registry`` uploads them (online when a key is configured,
    ``tracking.wandb_mode``). Returns one line per record."""
    from pathlib import Path

    from reproductions.run.tracking import init_run, results_summary

    lines = []
    for rec in records:
        d = rec.data
        directory = Path(root) / "registry" / d["sweep"] / d["profile"] / d["variant"] / f"seed{d['seed']}"
        directory.mkdir(parents=True, exist_ok=True)
        group_name = group or f"{d['sweep']}-{d['profile']}"
        run = init_run(dict(
            project=project, id="ref" + d["id"], resume="allow", group=group_name, job_type="reference",
            name=f"{group_name}/{d['variant']}/seed{d['seed']}/reference",
            tags=list(dict.fromkeys(["reference", d["variant"], d["profile"], d["sweep"], f"seed{d['seed']}"])),
            dir=str(directory), reinit="finish_previous",
            config={"sweep": d["sweep"], "profile": d["profile"], "seed_everything": d["seed"],
                    "run": {"variant": d["variant"], "experiment": group_name}, "overrides": d["overrides"],
                    "config_digest": d["config_digest"], "record": d["id"],
                    "facts": {"hardware": d["hardware"], "versions": d["versions"], "git": d["git"], "host": d["host"],
                              "finished_at": d["finished_at"]}},
        ))  # fmt: skip
        try:
            columns, rows = d["curve"]["columns"], d["curve"]["rows"]
            for row in rows:
                values = dict(zip(columns, row))
                step = values.pop("step", None)
                logged = {k: v for k, v in values.items() if v is not None}
                if step is not None and logged:
                    run.log(logged, step=int(step))
            run.summary.update(results_summary({**d, "status": "finished"}))
            lines.append(f"{rec.path.name}: W&B run {run.id} ({'offline' if run.offline else 'online'}) "
                         f"in group {group_name}, {len(rows)} validations")  # fmt: skip
        finally:
            run.finish()
    return lines


def claims_rows(gathered) -> tuple[list[str], list[list[Any]]]:
    """The claims page's comparisons as one table: per sweep, claim and profile (in scale order),
    the scale, the runs on each side, a - b, its standard error and the verdict."""
    columns = ["sweep", "claim", "profile", "scale", "n a", "n b", "difference", "s.e.", "verdict"]
    rows = []
    for sc in gathered:
        for claim, measured in sc.claims().items():
            for m, c in measured:
                scale = m.profile.scale
                rows.append([sc.sweep.id, claim, m.profile.name,
                             None if scale is None else f"{scale.axis}={scale.value}", c.stat_a.n, c.stat_b.n,
                             c.difference, c.se, c.verdict])  # fmt: skip
    return columns, rows


def log_claims(page, gathered, *, command: str, root: str | os.PathLike = "runs",
               project: str = "attention-repro") -> str:  # fmt: skip
    """The claims page as a W&B run (job type ``claims``, group ``claims``): the table of every
    comparison (``claims_rows``), each scale figure as an image, the page's Markdown as a file,
    the command and the counts in its config. One run kept in ``<root>/claims/`` (its id in
    ``wandb/run_id``; each page a new step); offline its table waits for ``repro sync <root>/claims``
    as the report's do (``artifacts.keep_tables``). Returns the run id."""
    from pathlib import Path

    import wandb

    from reproductions.run.artifacts import keep_tables
    from reproductions.run.tracking import init_run, keep_run_id, save_with_run

    directory = Path(root) / "claims"
    directory.mkdir(parents=True, exist_ok=True)
    run_id = keep_run_id(directory)
    step = len(list((directory / "wandb").glob(f"*run-*-{run_id}")))  # one step per page made
    columns, rows = claims_rows(gathered)
    run = init_run(dict(
        project=project, id=run_id, resume="allow", group="claims", name="claims", job_type="claims",
        tags=["claims"], dir=str(directory), reinit="finish_previous",
        config={"command": command, "sweeps": [sc.sweep.id for sc in gathered if sc.measured],
                "comparisons": len(rows), "run": {"variant": "claims", "experiment": "claims"}},
    ))  # fmt: skip
    try:
        tables = {"claims/table": (columns, rows)}
        if run.offline:
            keep_tables(run, directory, tables)
            payload: dict[str, Any] = {}
        else:
            payload = {key: wandb.Table(columns=c, data=rs) for key, (c, rs) in tables.items()}
        for fig in sorted(page.figures):
            payload[f"claims/{Path(fig).stem}"] = wandb.Image(str(fig))
        run.log(payload, step=step)
        run.summary["claims/comparisons"] = len(rows)
        run.summary.update({f"claims/{v}": sum(r[-1] == v for r in rows) for v in VERDICTS})
        save_with_run(run, page.path.parent, [page.path.name])
        return run.id
    finally:
        run.finish()

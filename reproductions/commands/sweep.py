"""``repro sweep``: run an ablation grid, variant x seed, each in its own run directory.

    repro sweep vit/position --profile cpu [--seeds N | --seed K ...] [--variant NAME ...] [--dry-run]
        [--launcher local|torchrun|slurm] [--devices N] [--jobs J] [--root runs] [--wandb [--log-model]] [--reuse]
        [--rerun-changed] [--skip-recorded] [-- extra CLI overrides for every run]

The sweep file (``reproductions/<paper>/sweeps/<name>.yaml``, or any path to a YAML file) is
described in ``reproductions/sweeping/spec.py``, where its runs go and what each run's command
is in ``reproductions/sweeping/plan.py``, how they run in ``reproductions/sweeping/launch.py``.

A run whose ``results.json`` says finished is skipped, so a sweep that was stopped continues
where it stopped, and a run an interruption stopped (a signal, a killed process) resumes from its
own last checkpoint (``launch.earlier_attempt``), its line saying from which step; a failed run is logged (``<run dir>/stdout.log``), listed at the end and
makes the exit status 1; the others still run. SIGTERM, SIGINT or SIGUSR1 stops the runs it started at
their step (``reproductions/sweeping/stopping.py``): one ``stopped ...`` line per run, no report, exit
status 128 + the signal's number. After the runs the report is written
(``reproductions/sweeping/sweep_report.py``) unless ``--no-report``. With ``--reuse`` a run whose
resolved config and seed equal those of a run finished in another experiment under ``--root`` is
copied from it instead of trained (``reproductions/sweeping/reuse.py``). A finished run made with another
command than the sweep would use now (its file, profile or overrides changed since: a tuned value taken in) is
kept and skipped with a warning (one whose resolved config is still the same is simply kept);
``--rerun-changed`` moves it to ``<root>/superseded/<UTC time>/`` and runs it again. With
``--skip-recorded`` a run that the registry (``results/``) already holds with the config the sweep
resolves to now is not trained again (``records.recorded_twins``): a campaign goes on where its
records end on a machine that lacks its run directories.

The package ``reproductions/sweeping/`` holds the layers, each importing only those before it:
``spec`` (sweep files) < ``plan`` (runs and commands) < ``launch`` (running, SLURM) and
``reuse`` (copying finished runs of the same config) <
``collect`` (results.json per variant) < ``tables`` (the table, formats, RelaImpr) < ``claims``
(the claim checks) and ``figures`` (one function per plot kind) < ``report`` (report.md, W&B).
This module and ``reproductions/commands/report.py`` are the commands on top.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import textwrap
import time
from collections.abc import Sequence
from typing import TextIO

from reproductions.run.errors import RunInterrupted, UsageError
from reproductions.run.rundir import ReportLock
from reproductions.sweeping.launch import (
    earlier_attempt, execute, format_duration, last_error, resumable_first, slurm_script, subprocess_runner, supersede,
)
from reproductions.sweeping.plan import LAUNCHERS, add_seed_options, add_variant_option, check_counts, chosen_seeds, make_plan
from reproductions.sweeping.publish import log_references
from reproductions.sweeping.records import SMOKE_PROFILE, Record, recorded_twins, records_of
from reproductions.sweeping.sweep_report import write_report
from reproductions.sweeping.reuse import computes_the_same, reuse_finished
from reproductions.sweeping.spec import DEFAULT_PROFILE, SweepError, profiles_help
from reproductions.sweeping.stopping import SWEEP_STOP
from utils.atomic import atomic_write_text


def _split_extra(argv: list[str]) -> tuple[list[str], list[str]]:
    """Everything after ``--`` is passed to every run, as is."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="repro sweep",
        description="Run an ablation sweep: every variant x seed of a sweep file, each in its own run directory.",
        epilog=textwrap.fill(
            "Extra overrides for every run go after '--' (e.g. -- --trainer.max_epochs 5); dotted options "
            "(--trainer.devices 8) are also passed through. Runs go to <root>/<sweep>-<profile>/<variant>/seed<k>/.",
            width=88, break_on_hyphens=False,
        ) + "\n\n" + profiles_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    p.add_argument("sweep", help="a sweep name (vit/position) or a sweep YAML file")
    p.add_argument("--profile", default=DEFAULT_PROFILE, help=f"the scale: one of the sweep's profiles, listed below (default {DEFAULT_PROFILE})")
    add_seed_options(p, "run")
    add_variant_option(p, "run")
    p.add_argument("--dry-run", action="store_true", help="print the commands (or the slurm script); run nothing")
    p.add_argument("--launcher", choices=LAUNCHERS, default="local")
    p.add_argument("--devices", type=int, default=None, help="devices per run, >= 1 (--trainer.devices; ddp when > 1)")
    p.add_argument("--jobs", type=int, default=None, help="local runs at once, >= 1 (default: the profile's, else 1)")
    p.add_argument("--root", default="runs", help="directory of all runs (default runs)")
    p.add_argument("--experiment", default=None, help="experiment name (default <sweep>-<profile>)")
    p.add_argument("--wandb", action="store_true", help="log every run (and the report) to W&B, grouped by sweep")
    p.add_argument("--log-model", action="store_true",
                   help="with --wandb: log each run's last and best checkpoint as a W&B model artifact (--run.log_model true)")
    p.add_argument("--project", default=None, help="W&B project (default: the runs' --run.project default)")
    p.add_argument("--sbatch", action="append", default=[], metavar="OPTION",
                   help="an extra #SBATCH line for --launcher slurm, e.g. --sbatch=--partition=gpu (repeatable)")
    p.add_argument("--reuse", action="store_true",
                   help="copy a run from another experiment under --root whose resolved config and seed are the same, "
                   "instead of training it again (the copy records reused_from; the code is not compared)")
    p.add_argument("--rerun-changed", action="store_true",
                   help="run again the finished runs made with another command than this sweep would use now (the "
                   "sweep file, profile or overrides changed since), after moving each to "
                   "<root>/superseded/<UTC time>/<experiment>/; without it they are kept and skipped, with a warning")
    p.add_argument("--skip-recorded", action="store_true",
                   help="skip the runs the registry (results/) already holds with the config this sweep would use now "
                   "(same variant, seed and resolved config), e.g. to go on with a campaign on a machine without its "
                   "run directories; the report covers the run directories only")
    p.add_argument("--no-report", action="store_true", help="do not write the report after the runs")
    return p


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    own, extra = _split_extra(list(argv))
    parser = build_parser()
    args, unknown = parser.parse_known_args(own)
    bad = [u for u in unknown if u.startswith("-") and "." not in u.split("=")[0]]
    if bad:
        parser.error(f"unrecognized arguments: {' '.join(bad)} (overrides for the runs go after '--')")
    return args, unknown + extra


def main(argv: Sequence[str] | None = None, *, runner=subprocess_runner, out: TextIO | None = None) -> int:
    """``repro sweep ...``; returns the exit status (1 if any run failed).

    A bad option value raises ``UsageError`` (one ``error:`` line, exit status 2) before any run."""
    out = out or sys.stdout
    args, extra = parse_args(sys.argv[1:] if argv is None else argv)
    if args.log_model:
        if not args.wandb:
            raise UsageError("--log-model logs the checkpoints to W&B; add --wandb")
        extra = [*extra, "--run.log_model", "true"]
    check_counts(jobs=args.jobs, devices=args.devices)
    seeds = chosen_seeds(args)
    settings = dict(seeds=seeds, root=args.root, experiment=args.experiment, launcher=args.launcher, devices=args.devices,
                    wandb=args.wandb, project=args.project, extra=extra, jobs=args.jobs)  # fmt: skip
    try:
        plan = make_plan(args.sweep, args.profile, only=args.only, **settings)
    except SweepError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    changed = [r for r in plan.changed() if not computes_the_same(r)]  # another command, another config
    if changed and args.rerun_changed:
        if args.dry_run:
            print(f"--rerun-changed: would move {len(changed)} finished runs made with another config to "
                  f"{plan.root}/superseded/<UTC time>/ and run them again: "
                  + ", ".join(r.label for r in changed), file=out)
        else:
            moved_to = supersede(changed, plan.root)
            print(f"--rerun-changed: moved {len(changed)} finished runs made with another config to {moved_to}/ "
                  f"(to run again): " + ", ".join(r.label for r in changed), file=out)
    again = {id(r) for r in changed} if args.rerun_changed else set()  # moved (or, dry, would be): to run
    finished = [r for r in plan.finished() if id(r) not in again]
    done = {id(r) for r in finished}
    pending = [r for r in plan.runs if id(r) not in done]
    print(
        f"sweep {plan.sweep.id} ({plan.sweep.title}), profile {plan.profile.name}: "
        f"{len(plan.variants)} variants x {len(plan.seeds)} seeds = {len(plan.runs)} runs; "
        f"{len(finished)} already finished (skipped), {len(pending)} to run"
        + (f", {plan.jobs} at a time" if plan.jobs > 1 and args.launcher == "local" else ""),
        file=out,
    )
    print(f"experiment {plan.experiment}: {plan.experiment_dir}/<variant>/seed<k>/", file=out)
    if changed and not args.rerun_changed:
        print(
            f"warning: {len(changed)} finished runs were made with another config than this sweep would use "
            f"now (e.g. {changed[0].label}; see 'command' in its results.json): they are kept and skipped; "
            "--rerun-changed moves them aside and runs them again",
            file=out,
        )

    recorded: dict[int, Record] = {}
    if args.skip_recorded and pending:
        recorded = recorded_twins(pending, plan.sweep.id, plan.profile.name)
        pending = [r for r in pending if id(r) not in recorded]
        print(f"--skip-recorded: {len(recorded)} of the runs to run are in the registry with this config (skipped): "
              + (", ".join(r.label for r in plan.runs if id(r) in recorded) or "none") + f"; {len(pending)} to run",
              file=out)

    reused = []
    if args.reuse and pending:
        reused = reuse_finished(pending, plan.root, own=[r.run_dir for r in plan.runs], out=out, copy=not args.dry_run)
        taken = {id(r.run) for r in reused}
        pending = [r for r in pending if id(r) not in taken]
        print(f"--reuse: {len(reused)} of the runs to run {'would be' if args.dry_run else 'were'} copied from "
              f"finished runs of the same config and seed; {len(pending)} to run", file=out)

    if args.launcher == "slurm":
        script = slurm_script(plan, pending, args.devices, args.sbatch) if pending else None
        if script is None:
            print("nothing to submit: every run has finished", file=out)
            return 0
        if args.dry_run:
            print(script, file=out)
            return 0
        path = plan.experiment_dir / "sweep.sbatch"
        atomic_write_text(path, script)
        path.chmod(0o755)
        print(f"wrote {path}: a job array of {len(pending)} runs\nsubmit with:  sbatch {path}", file=out)
        print(f"report after: {plan.sweep_command('report')}", file=out)
        return 0

    if args.dry_run:
        copies = {id(r.run): r.source for r in reused}
        for k, run in enumerate(plan.runs, 1):
            if id(run) in recorded:
                state = f"recorded, skip: {recorded[id(run)].path.name}"
            elif id(run) in done or id(run) in copies:
                state = "finished, skip" if id(run) in done else f"reuse {copies[id(run)]}"
            else:
                run, afresh = earlier_attempt(run)
                state = (f"resume from step {run.resumes_at}" if run.resumes_at is not None
                         else f"run afresh: {afresh}" if afresh else "run")
            print(f"# {k}/{len(plan.runs)} {run.label} ({state})\n{shlex.join(run.command)}", file=out)
        return 0

    pending, resuming = resumable_first(pending)
    if resuming:
        print(f"interrupted runs resume first: {resuming} (each from its own last checkpoint)", file=out)
    started = time.monotonic()
    outcomes = execute(plan, pending, runner=runner, out=out)
    if SWEEP_STOP.signum is not None:  # the runs are stopped, their locks released: no report
        stopped = [o for o in outcomes if o.stopped]
        out.flush()
        raise RunInterrupted(
            f"sweep {plan.experiment} stopped by {SWEEP_STOP.name}: {len(stopped)} run(s) stopped, "
            f"{sum(1 for o in outcomes if o.finished)} finished, {len(pending) - len(outcomes)} not started; "
            f"rerun the same command to continue (stopped runs resume from their checkpoints): {plan.sweep_command()}",
            signum=SWEEP_STOP.signum)
    failures = [o for o in outcomes if o.failed]
    held = [o for o in outcomes if o.held_by is not None]
    print(
        f"\nsweep {plan.experiment}: {len(outcomes) - len(failures) - len(held)} finished, {len(failures)} failed, "
        f"{len(finished)} skipped (already finished)" + (f", {len(recorded)} skipped (recorded)" if recorded else "")
        + (f", {len(reused)} reused" if reused else "")
        + (f", {len(held)} held by another process (not run here)" if held else "")
        + f" in {format_duration(time.monotonic() - started)}",
        file=out,
    )
    if held:
        print("runs another process holds (its sweep or run is writing them; rerun this sweep once it has ended):",
              file=out)
        for o in held:
            print(f"  {o.run.label}: {o.run.run_dir} in use by {o.held_by}", file=out)
    if failures:
        print("failed runs (rerun the sweep to retry them; finished runs are skipped):", file=out)
        for o in failures:
            print(f"  {o.run.label}: exit status {o.returncode}; {last_error(o.run.log_path)}\n"
                  f"    log: {o.run.log_path}", file=out)  # fmt: skip
    if not args.no_report:
        try:
            # the report is the whole profile's (every variant's finished runs), also after a --variant subset
            whole = plan if not args.only else make_plan(args.sweep, args.profile, **settings)
            with ReportLock(plan.experiment_dir, plan.profile.name, whole.sweep_command()):
                write_report(whole, wandb=args.wandb, out=out, **({"project": args.project} if args.project else {}))
            if args.wandb and (records := records_of(plan.sweep.id, plan.profile.name)):
                # the repository's reference runs in the same W&B group, beside the sweep's own
                log_references(records, project=args.project or "attention-repro", root=plan.root, group=plan.experiment)
                print(f"W&B: the {len(records)} reference records of results/ in group {plan.experiment} "
                      f"(job type reference; files under {plan.root / 'registry'})", file=out)
        except Exception as e:  # the runs are safe on disk; the report can be rerun alone
            print(f"report failed: {type(e).__name__}: {e}\nrerun: {plan.sweep_command('report')}", file=out)
            return 1
    if plan.profile.name != SMOKE_PROFILE and len(outcomes) > len(failures) + len(held):
        print(f"keep the finished runs as the reference (results/): repro registry add {plan.experiment_dir}", file=out)
    return 1 if failures or held else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

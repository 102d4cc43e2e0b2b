"""``repro report``: a sweep's report again, from the runs on disk.

    repro report vit/position --profile cpu [--seeds N] [--root runs] [--wandb]
    repro report vit/position --profile cpu --profile fmnist   # side by side

Writes ``report.md`` (the table beside the paper's values, the claim numbers, every missing or
failed run) and the figure into the experiment's directory and prints the table; what goes in
them is described in ``reproductions/sweeping/sweep_report.py``. With two or more ``--profile``, one
table of the profiles side by side beside the paper's values, and every profile's claim marks,
in ``<root>/<sweep>-<p1>+<p2>/report.md``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TextIO

from reproductions.run.rundir import ReportLock
from reproductions.sweeping.plan import add_seed_options, add_variant_option, chosen_seeds, make_plan
from reproductions.sweeping.records import REGISTRY_DIR, RecordError, records_of
from reproductions.sweeping.sweep_report import write_comparison, write_report
from reproductions.sweeping.spec import DEFAULT_PROFILE, SweepError, profiles_help


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    p = argparse.ArgumentParser(
        prog="repro report",
        description="Write a sweep's report: Markdown table beside the paper's values, and figures.",
        epilog=profiles_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    p.add_argument("sweep", help="a sweep name (vit/position) or a sweep YAML file")
    p.add_argument("--profile", action="append", default=None,
                   help=f"one of the sweep's profiles, listed below (default {DEFAULT_PROFILE}); give it twice or more to compare profiles side by side")
    add_seed_options(p, "the planned")
    add_variant_option(p, "report")
    p.add_argument("--root", default="runs")
    p.add_argument("--experiment", default=None, help="experiment name (default <sweep>-<profile>)")
    p.add_argument("--wandb", action="store_true", help="also log the table and figures to W&B (the sweep's group)")
    p.add_argument("--project", default="attention-repro", help="W&B project")
    p.add_argument("--registry", default=str(REGISTRY_DIR),
                   help="the results registry whose records are the reference (default: the repository's results/)")
    p.add_argument("--no-reference", action="store_true", help="your runs alone, without the registry's reference beside them")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    seeds = chosen_seeds(args)  # a UsageError: one ``error:`` line, exit status 2
    profiles = list(dict.fromkeys(args.profile or [DEFAULT_PROFILE]))
    try:
        plans = [make_plan(args.sweep, p, seeds=seeds, only=args.only, root=args.root, experiment=args.experiment if len(profiles) == 1 else None)
                 for p in profiles]  # fmt: skip
    except SweepError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if len(plans) > 1:
        if args.experiment or args.wandb:
            print("error: --experiment and --wandb name one profile's report; leave them out when comparing profiles",
                  file=sys.stderr)
            return 2
        absent = [p.experiment_dir for p in plans if not p.experiment_dir.is_dir()]
        if len(absent) == len(plans):
            print(f"error: no runs under {', '.join(map(str, absent))}; run the sweeps first", file=sys.stderr)
            return 1
        write_comparison(plans, out=out)
        return 0
    try:
        return _report(plans[0], args, argv, out)
    except RecordError as e:  # a bad record in the registry: bad input, as repro claims and repro registry check say
        print(f"error: {e}", file=sys.stderr)
        return 2


def _report(plan, args: argparse.Namespace, argv: Sequence[str] | None, out: TextIO) -> int:
    registry = None if args.no_reference else args.registry
    if not plan.experiment_dir.is_dir() and (registry is None or not records_of(plan.sweep.id, plan.profile.name, registry)):
        print(f"error: no runs under {plan.experiment_dir}" + ("" if registry is None else " and no records of it in the registry")
              + f"; run first: {plan.sweep_command()}", file=sys.stderr)  # fmt: skip
        return 1
    command = " ".join(["repro report", *(sys.argv[1:] if argv is None else argv)])
    with ReportLock(plan.experiment_dir, plan.profile.name, command):  # one report at a time per sweep and profile
        write_report(plan, wandb=args.wandb, project=args.project, out=out, registry=registry)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

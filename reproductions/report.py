"""``python -m reproductions report``: a sweep's report again, from the runs on disk.

    python -m reproductions report vit/position --profile cpu [--seeds N] [--root runs] [--wandb]

Writes ``report.md`` (the table beside the paper's values, the claim numbers, every missing or
failed run) and the figure into the experiment's directory and prints the table; what goes in
them is described in ``reproductions/sweeping/report.py``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TextIO

from reproductions.sweeping.plan import make_plan
from reproductions.sweeping.report import write_report
from reproductions.sweeping.spec import DEFAULT_PROFILE, SweepError


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    p = argparse.ArgumentParser(
        prog="python -m reproductions report",
        description="Write a sweep's report: Markdown table beside the paper's values, and figures.",
        allow_abbrev=False,
    )
    p.add_argument("sweep", help="a sweep name (vit/position) or a sweep YAML file")
    p.add_argument("--profile", default=DEFAULT_PROFILE)
    p.add_argument("--seeds", type=int, default=None, help="the planned seeds 0..N-1 (default: the profile's)")
    p.add_argument("--root", default="runs")
    p.add_argument("--experiment", default=None, help="experiment name (default <sweep>-<profile>)")
    p.add_argument("--wandb", action="store_true", help="also log the table and figures to W&B (the sweep's group)")
    p.add_argument("--project", default="attention-repro", help="W&B project")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        plan = make_plan(args.sweep, args.profile, seeds=args.seeds, root=args.root, experiment=args.experiment)
    except SweepError as e:
        print(f"report: {e}", file=sys.stderr)
        return 2
    if not plan.experiment_dir.is_dir():
        print(f"report: no runs under {plan.experiment_dir}; run first: {plan.sweep_command()}", file=sys.stderr)
        return 1
    write_report(plan, wandb=args.wandb, project=args.project, out=out)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

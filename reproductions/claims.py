"""``repro claims``: every claim of every sweep, at every scale that has runs, on one page.

    repro claims [--root runs] [--out docs/claims.md] [--figures docs/figures/claims]
                 [--sweep vit/position ...] [--smoke]

Reads the finished runs of every sweep of the repository (or of each ``--sweep``) at each of its
profiles under the root, runs each sweep's claim checks (those of ``repro report``) and writes
one Markdown page: the commands that regenerate it, the hardware the runs recorded, then per
sweep and claim a table with one row per profile in scale order (the sweep file's ``scale`` of
each profile), with a - b ± its standard error and the verdict, and a figure of a - b against
the scale (PNG, under ``--figures``) where a claim was measured at two or more scales; then the
attention-distance claim on every finished ViT run's analysis (not with ``--sweep``). What goes
in the page is described in ``reproductions/sweeping/claims_page.py``. Nothing is written until
all is computed, and then atomically; a root without any finished run is an error (exit 2).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from reproductions.sweeping.attention_claim import distance_groups
from reproductions.sweeping.claims_page import SMOKE_PROFILE, build_page, gather, write_page
from reproductions.sweeping.plan import make_plan
from reproductions.sweeping.spec import DEFAULT_PROFILE, SweepError, load_sweep, profiles_by_sweep

DEFAULT_OUT = "docs/claims.md"
DEFAULT_FIGURES = "docs/figures/claims"


def _command(args: argparse.Namespace) -> str:
    """The command line that makes this page again (the options given, defaults left out)."""
    parts = ["repro", "claims"]
    for flag, value, default in (("--root", args.root, "runs"), ("--out", args.out, DEFAULT_OUT),
                                 ("--figures", args.figures, DEFAULT_FIGURES)):  # fmt: skip
        if value != default:
            parts += [flag, value]
    for sweep in args.sweep or []:
        parts += ["--sweep", sweep]
    return shlex.join(parts + (["--smoke"] if args.smoke else []))


def _first_sweep_command(sweeps: list[str], root: str) -> str:
    """A command that makes runs: the first sweep at its default profile (else its first one but smoke)."""
    sweep = load_sweep(sweeps[0])
    names = [n for n in sweep.profiles if n != SMOKE_PROFILE] or list(sweep.profiles)
    return make_plan(sweep, DEFAULT_PROFILE if DEFAULT_PROFILE in names else names[0], root=root).sweep_command()


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    p = argparse.ArgumentParser(
        prog="repro claims",
        description="Write one Markdown page of every sweep's claims at every scale (profile) that has finished runs, "
        "with a figure of each claim against the scale.",
        allow_abbrev=False,
    )
    p.add_argument("--root", default="runs", help="where the runs are (default runs)")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"the page (default {DEFAULT_OUT})")
    p.add_argument("--figures", default=DEFAULT_FIGURES, help=f"folder of the figures (default {DEFAULT_FIGURES})")
    p.add_argument("--sweep", action="append", default=None,
                   help="a sweep name (vit/position) or sweep YAML file; give it again for more (default: every sweep)")
    p.add_argument("--smoke", action="store_true", help=f"also the {SMOKE_PROFILE!r} profiles (for tests; not a result)")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    sweeps = list(args.sweep or profiles_by_sweep())
    try:
        gathered = gather(sweeps, args.root, smoke=args.smoke)
        distances = distance_groups(args.root, smoke=args.smoke) if not args.sweep else None
        if not any(sc.measured for sc in gathered) and not distances:
            print(f"error: no finished runs under {args.root}: make some first, e.g. "
                  f"{_first_sweep_command(sweeps, args.root)}, then run {_command(args)} again", file=sys.stderr)  # fmt: skip
            return 2
        page = build_page(gathered, args.out, args.figures, root=args.root, command=_command(args),
                          distances=distances)
    except SweepError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write_page(page)
    for sc in gathered:
        if not sc.measured:
            continue
        claims = sc.claims()
        print(f"{sc.sweep.id}: {', '.join(m.profile.name for m in sc.measured)}; {len(claims)} claim{'s' if len(claims) != 1 else ''}"
              + (f"; not run here: {', '.join(sc.not_run)}" if sc.not_run else ""), file=out)  # fmt: skip
    print(f"page: {page.path}" + (f"\nfigures: {len(page.figures)} in {Path(args.figures)}" if page.figures else ""), file=out)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

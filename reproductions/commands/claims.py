"""``repro claims``: every claim of every sweep, at every scale that has runs, on one page.

    repro claims [--root runs] [--no-local] [--out docs/claims.md] [--figures docs/figures/claims]
                 [--sweep vit/position ...] [--smoke] [--check] [--wandb [--project P]]

Reads the records of the results registry (``results/``, ``repro registry``) and the finished
local runs under the root (not with ``--no-local``) of every sweep of the repository (or of each
``--sweep``) at each of its profiles, runs each sweep's claim checks (those of ``repro report``)
and writes one Markdown page: the commands that regenerate it, how many records and local runs it
read, the hardware they recorded, then per sweep and claim a table with one row per profile in
scale order (the sweep file's ``scale`` of each profile), with a - b ± its standard error and
the verdict, and a figure of a - b against the scale (PNG, under ``--figures``) where a claim was
measured at two or more scales; then the attention-distance claim on every finished ViT run's
analysis (not with ``--sweep``). What goes in the page is described in
``reproductions/sweeping/claims_page.py``. Nothing is written until all is computed, and then
atomically; no record and no finished run at all is an error (exit 2). ``--check`` writes
nothing and exits 1 when the page or a figure on disk differs from what it would write (the
committed docs/claims.md is the registry's page: ``repro claims --no-local``). ``--wandb`` also
logs the page as a W&B run (``publish.log_claims``): its comparisons as a table, its figures and
its Markdown.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from reproductions.sweeping.attention_claim import distance_groups
from reproductions.sweeping.claims_page import SMOKE_PROFILE, build_page, gather, source_counts, write_page
from reproductions.sweeping.records import is_smoke
from reproductions.sweeping.plan import make_plan
from reproductions.sweeping.records import REGISTRY_DIR, RecordError, read_registry
from reproductions.sweeping.spec import DEFAULT_PROFILE, REPO_ROOT, SweepError, load_sweep, profiles_by_sweep

DEFAULT_OUT = "docs/claims.md"
DEFAULT_FIGURES = "docs/figures/claims"


def _is_default(value: str, default: str) -> bool:
    """Whether a path option names its default, given relative to here or to the repository root."""
    return Path(value).resolve() in (Path(default).resolve(), (REPO_ROOT / default).resolve())


def _command(args: argparse.Namespace) -> str:
    """The command line that makes this page again (the options given, defaults left out)."""
    parts = ["repro", "claims"]
    if args.root != "runs" and not args.no_local:
        parts += ["--root", args.root]
    if args.no_local:
        parts.append("--no-local")
    if not _is_default(args.registry, "results"):
        parts += ["--registry", args.registry]
    for flag, value, default in (("--out", args.out, DEFAULT_OUT), ("--figures", args.figures, DEFAULT_FIGURES)):
        if not _is_default(value, default):
            parts += [flag, value]
    for sweep in args.sweep or []:
        parts += ["--sweep", sweep]
    return shlex.join(parts + (["--smoke"] if args.smoke else []))


def _first_sweep_command(sweeps: list[str], root: str) -> str:
    """A command that makes runs: the first sweep at its default profile (else its first one but smoke)."""
    sweep = load_sweep(sweeps[0])
    names = [n for n in sweep.profiles if not is_smoke(n)] or list(sweep.profiles)
    return make_plan(sweep, DEFAULT_PROFILE if DEFAULT_PROFILE in names else names[0], root=root).sweep_command()


def _registry_label(registry: str) -> str:
    return "results/" if _is_default(registry, "results") else registry


def same_picture(a: bytes, b: bytes, tolerance: float = 2.0) -> bool:
    """Whether two PNGs show the same picture: equal bytes, or the same size with a mean pixel
    difference under ``tolerance`` (of 255): another machine's font rasteriser may move a few
    pixels of a label without changing the figure."""
    if a == b:
        return True
    import io

    import numpy as np
    from PIL import Image

    x, y = (np.asarray(Image.open(io.BytesIO(d)).convert("RGB"), dtype=np.float32) for d in (a, b))
    return x.shape == y.shape and float(np.abs(x - y).mean()) < tolerance


def page_differences(page) -> list[Path]:
    """The page and figures whose file differs from what ``page`` holds (or is missing; a figure
    by its picture, ``same_picture``), and the figures in its folder that it no longer shows."""
    stale = [] if page.path.is_file() and page.path.read_text() == page.markdown else [page.path]
    stale += [p for p, data in page.figures.items() if not p.is_file() or not same_picture(p.read_bytes(), data)]
    return stale + page.stale_figures()


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    p = argparse.ArgumentParser(
        prog="repro claims",
        description="Write one Markdown page of every sweep's claims at every scale (profile) that has finished runs, "
        "with a figure of each claim against the scale.",
        allow_abbrev=False,
    )
    p.add_argument("--root", default="runs", help="where the local runs are (default runs)")
    p.add_argument("--no-local", action="store_true", help="the registry's records alone, no local runs (the committed page)")
    p.add_argument("--registry", default=str(REGISTRY_DIR), help="the results registry (default: the repository's results/)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if the page or a figure differs from what it would write")
    p.add_argument("--out", default=str(REPO_ROOT / DEFAULT_OUT), help=f"the page (default: the repository's {DEFAULT_OUT})")
    p.add_argument("--figures", default=str(REPO_ROOT / DEFAULT_FIGURES),
                   help=f"folder of the figures (default: the repository's {DEFAULT_FIGURES})")
    p.add_argument("--sweep", action="append", default=None,
                   help="a sweep name (vit/position) or sweep YAML file; give it again for more (default: every sweep)")
    p.add_argument("--smoke", action="store_true", help=f"also the {SMOKE_PROFILE!r} profiles (for tests; not a result)")
    p.add_argument("--wandb", action="store_true",
                   help="also log the page as a W&B run (job type claims: its table, figures and Markdown), kept in "
                        "<root>/claims/; offline unless a key is configured, then repro sync <root>/claims")
    p.add_argument("--project", default="attention-repro", help="W&B project with --wandb (default %(default)s)")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    sweeps = list(args.sweep or profiles_by_sweep())
    local = not args.no_local
    try:
        records = read_registry(args.registry)
        gathered = gather(sweeps, args.root, smoke=args.smoke, registry=args.registry, local=local, read=records)
        distances = (distance_groups(args.root if local else None, smoke=args.smoke, records=records)
                     if not args.sweep else None)  # fmt: skip
        if not any(sc.measured for sc in gathered) and not distances:
            where = f"no records in {args.registry}" + (f" and no finished runs under {args.root}" if local else "")
            print(f"error: {where}: make some first, e.g. "
                  f"{_first_sweep_command(sweeps, args.root)}, then run {_command(args)} again", file=sys.stderr)  # fmt: skip
            return 2
        # a page without local runs is the registry's page, whichever way it was asked for: one command remakes it
        shown = args if source_counts(gathered, distances or [])[1] else argparse.Namespace(**{**vars(args), "no_local": True})
        page = build_page(gathered, args.out, args.figures, root=args.root, command=_command(shown),
                          distances=distances, registry=_registry_label(args.registry))  # fmt: skip
    except (SweepError, RecordError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.check:
        stale = page_differences(page)
        for path in stale:
            print(f"out of date: {path}", file=out)
        if stale:
            print(f"regenerate with: {_command(argparse.Namespace(**{**vars(args), 'check': False}))}", file=out)
            return 1
        print(f"up to date: {page.path} and {len(page.figures)} figures", file=out)
        return 0
    for sc in gathered:
        for line in sc.left_out:
            print(f"warning: {line}", file=sys.stderr)
    write_page(page)
    for sc in gathered:
        if not sc.measured:
            continue
        claims = sc.claims()
        print(f"{sc.sweep.id}: {', '.join(m.profile.name for m in sc.measured)}; {len(claims)} claim{'s' if len(claims) != 1 else ''}"
              + (f"; not measured: {', '.join(sc.not_run)}" if sc.not_run else ""), file=out)  # fmt: skip
    print(f"page: {page.path}" + (f"\nfigures: {len(page.figures)} in {Path(args.figures)}" if page.figures else ""), file=out)
    if args.wandb:
        from reproductions.sweeping.publish import log_claims

        run_id = log_claims(page, gathered, command=_command(shown), root=args.root, project=args.project)
        print(f"W&B: claims run {run_id} in {Path(args.root) / 'claims'}", file=out)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

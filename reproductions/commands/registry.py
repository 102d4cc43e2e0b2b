"""``repro registry``: the results registry in ``results/``, one record per finished sweep run.

    repro registry add PATH [PATH ...] [--allow-changed] [--dry-run]   # record the finished runs under PATH
    repro registry list [--sweep vit/position] [--profile cpu]          # what is recorded: runs per variant, seeds, hardware
    repro registry check [--definitions] [--fix-plateaus]               # every record valid (and its sweep definition unchanged)
    repro registry tables [--check]                                     # the README tables, generated from the records
    repro registry wandb [--sweep ...] [--profile ...] [--project P]    # the records as W&B runs (job type reference)
    repro registry floors [--sweep ...] [--profile ...] [--recompute]   # the pixel floors of the image sweeps (results/floors/)

``add`` records each finished run directory under PATH (a run, an experiment, or all of
``runs/``) as ``results/<sweep>/<profile>/<variant>/seed<k>-<id>.json`` and refuses, one line
each, a run that did not finish, one that is not a sweep profile's, a ``smoke`` run, one whose
config differs from what the sweep file defines now (unless ``--allow-changed``: the differences
are recorded as the record's ``overrides``) and one already recorded. What a record holds:
``reproductions/sweeping/records.py``. Every reader of results (``repro report``, ``repro
claims``, the README tables) reads the registry beside any local runs.

``check`` also reads each record's plateau (whether its validation metric stopped improving) again
from the record's own curve: a record made under an older plateau rule (``reproductions/run/curve.py``)
fails the check, and ``--fix-plateaus`` writes the plateau the rule reads now into it.

``floors`` computes the pixel logistic-regression floor (``docs/floors.md``) of every data set and
training-subset size the image sweeps' profiles use (``--sweep``/``--profile``: those alone; ``smoke``
profiles only when named), skipping those recorded already, into ``results/floors/<dataset>.json``;
``--data.KEY VALUE`` sets a data setting of every profile it walks (``--data.data_dir DIR`` for a
folder source). A profile whose data is not on this machine is listed as skipped.
"""

from __future__ import annotations

import argparse
import errno
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from reproductions.run.errors import RunFailed, UsageError
from reproductions.run.results import hardware_summary
from reproductions.sweeping.records import (
    REGISTRY_DIR,
    RecordError,
    add_run,
    read_registry,
    run_dirs,
    shown_path,
    stale_plateaus,
    stale_records,
)

#: write errors that the registry folder's place or permissions cause (a usage error: choose another
#: folder); any other (a full disk) is a failure
_NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EEXIST)


def _records(registry: Path, sweep: str | None, profile: str | None):
    return [r for r in read_registry(registry)
            if (sweep is None or r.data["sweep"] == sweep) and (profile is None or r.data["profile"] == profile)]  # fmt: skip


def not_writable(registry: Path, error: OSError) -> Exception:
    """The one line for a record the registry folder would not take: it names the folder, not a temporary file."""
    why = error.strerror or type(error).__name__
    if error.errno in _NOT_WRITABLE:
        return UsageError(f"the registry folder {registry} cannot be written ({why}); record into a folder you can "
                          f"write to (repro registry add --registry DIR PATH), or make {registry} writable and add again")
    return RunFailed(f"writing a record into the registry folder {registry} failed ({why}); the records written "
                     "before it are kept: make room (or fix the folder), then add again (recorded runs are skipped)")


def cmd_add(args: argparse.Namespace, out: TextIO) -> int:
    added = refused = duplicates = 0
    existing = {r.data["id"]: r.path for r in read_registry(args.registry)}
    for path in args.path:
        if not Path(path).exists():
            raise UsageError(f"{path} does not exist; give a run directory, an experiment directory or runs/")
        found = run_dirs(path)  # each run where it lies now
        if not found:
            raise UsageError(f"no run directories (seed<k>/ with a results.json or config.yaml) under {path}")
        for run_dir in found:
            try:
                o = add_run(run_dir, args.registry, existing, allow_changed=args.allow_changed, dry_run=args.dry_run)
            except OSError as e:
                raise not_writable(args.registry, e) from e
            if o.added is not None:
                added += 1
                print(f"{'would add' if args.dry_run else 'added'} {shown_path(o.added)}  <- {o.run_dir}", file=out)
            elif o.refused and o.refused.startswith("already in the registry"):
                duplicates += 1
                print(f"skipped {o.run_dir}: {o.refused}", file=out)
            else:
                refused += 1
                print(f"refused {o.run_dir}: {o.refused}", file=out)
    verb = "would be added" if args.dry_run else "added"
    print(f"{added} {verb}, {duplicates} already recorded, {refused} refused", file=out)
    return 1 if refused and not added else 0


def cmd_list(args: argparse.Namespace, out: TextIO) -> int:
    records = _records(args.registry, args.sweep, args.profile)
    groups: dict[tuple[str, str], dict[str, list]] = {}
    for r in records:
        groups.setdefault((r.data["sweep"], r.data["profile"]), {}).setdefault(r.data["variant"], []).append(r)
    for (sweep, profile), variants in sorted(groups.items()):
        n = sum(len(v) for v in variants.values())
        hardware = hardware_summary([r.data for v in variants.values() for r in v])
        print(f"{sweep} --profile {profile}: {n} records, {len(variants)} variants; {hardware}", file=out)
        for variant, recs in variants.items():
            seeds = ", ".join(str(r.data["seed"]) for r in sorted(recs, key=lambda r: r.data["seed"]))
            print(f"  {variant}: seeds {seeds}", file=out)
    print(f"{len(records)} records in {args.registry}", file=out)
    return 0


def cmd_check(args: argparse.Namespace, out: TextIO) -> int:
    records = read_registry(args.registry)  # raises RecordError on the first invalid record
    print(f"{len(records)} records valid (schema)", file=out)
    rc = _check_plateaus(records, args.fix_plateaus, out)
    if not args.definitions:
        return rc
    from reproductions.sweeping.picks import registry_disagreements

    stale = list(stale_records(records))
    for rec, why in stale:
        print(f"stale {rec.path}: {why}", file=out)
    print(f"{len(stale)} of {len(records)} records no longer match their sweep file"
          + ("; rerun those variants and add them (repro registry add), or remove the records" if stale else ""), file=out)  # fmt: skip
    untuned = registry_disagreements(records, args.registry)
    for line in untuned:
        print(f"not at its tuned point: {line}", file=out)
    print(f"{len(untuned)} swept variants not at the pick their tuning sweep recorded"
          + ("; write the picks into the sweep file (repro report <tuning sweep> lists them) and rerun those variants"
             if untuned else ""), file=out)  # fmt: skip
    return 1 if stale or untuned or rc else 0


def _check_plateaus(records, fix: bool, out: TextIO) -> int:
    """Records whose plateau the rule reads otherwise now: listed (exit 1), or rewritten with ``fix``."""
    from utils.atomic import atomic_write_json

    stale = list(stale_plateaus(records))
    for rec, now in stale:
        was = rec.data["plateau"]
        line = f"{shown_path(rec.path)}: plateau reached {was.get('reached')} (gain {was.get('gain')}) -> {now['reached']} (gain {now['gain']})"
        if fix:
            atomic_write_json(rec.path, {**rec.data, "plateau": now})
        print(("rewrote " if fix else "older plateau rule: ") + line, file=out)
    if stale and not fix:
        print(f"{len(stale)} of {len(records)} records hold a plateau the rule (reproductions/run/curve.py) reads otherwise "
              "from their own curve now; rewrite them: repro registry check --fix-plateaus", file=out)  # fmt: skip
        return 1
    print(f"{len(stale)} plateaus rewritten" if fix else "every recorded plateau is the rule's reading of its curve", file=out)
    return 0


def cmd_tables(args: argparse.Namespace, out: TextIO) -> int:
    from reproductions.sweeping.readme_tables import update_docs

    changed = update_docs(args.registry, check=args.check)
    for path in changed:
        print(f"{'out of date' if args.check else 'updated'}: {path}", file=out)
    if args.check and changed:
        print("run `repro registry tables` to regenerate them from the registry", file=out)
        return 1
    if not changed:
        print("every generated table is up to date", file=out)
    return 0


def cmd_wandb(args: argparse.Namespace, out: TextIO) -> int:
    from reproductions.sweeping.publish import log_references

    records = _records(args.registry, args.sweep, args.profile)
    if not records:
        raise UsageError("no records match" + (f" --sweep {args.sweep}" if args.sweep else "")
                         + (f" --profile {args.profile}" if args.profile else "") + "; see repro registry list")  # fmt: skip
    for line in log_references(records, project=args.project, root=Path(args.root)):
        print(line, file=out)
    return 0


def cmd_floors(args: argparse.Namespace, out: TextIO) -> int:
    from reproductions.commands.data import data_settings
    from reproductions.sweeping.floor_targets import build_datamodule, compute, floor_targets, guess_dataset, recorded
    from reproductions.sweeping.records import FLOORS_DIR_NAME

    try:
        extra = data_settings(None, None, args.data)
    except ValueError as e:
        raise UsageError(str(e)) from e
    grid = args.grid
    if any(c <= 0 for c in grid):
        raise UsageError(f"--grid {' '.join(f'{c:g}' for c in grid)}: every C must be positive, e.g. --grid 0.01 0.1 1")
    floors_dir = args.registry / FLOORS_DIR_NAME
    targets = floor_targets([args.sweep] if args.sweep else None, [args.profile] if args.profile else None, extra=extra)
    if not targets:
        raise UsageError("no image sweep profile matches" + (f" --sweep {args.sweep}" if args.sweep else "")
                         + (f" --profile {args.profile}" if args.profile else "") + "; see repro registry list")  # fmt: skip
    done = skipped = failed = 0
    for target in targets:
        where = ", ".join(target.where)
        dataset = guess_dataset(target.settings)
        if dataset and not args.recompute and recorded(target, dataset, grid, floors_dir):
            print(f"recorded already: {dataset} train_samples={target.settings.get('train_samples')} ({where})", file=out)
            continue
        if args.dry_run:
            print(f"would compute: {target.label} ({where})", file=out)
            continue
        try:
            dm = build_datamodule(target.settings)  # the data is here (else: skipped, one line)
        except Exception as e:  # noqa: BLE001 - a source that cannot be read here: said, not fatal
            skipped += 1
            print(f"skipped {target.label} ({where}): its data is not available here: {str(e).splitlines()[0]}", file=out)
            continue
        try:
            dataset, r = compute(target, dm, grid=grid, recompute=args.recompute, command=shlex.join(["repro", "registry", *args.argv]),
                                 floors_dir=floors_dir)  # fmt: skip
        except Exception as e:  # noqa: BLE001 - one line per failed floor, then the next
            failed += 1
            print(f"failed {target.label} ({where}): {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=out)
            continue
        done += 1
        print(f"{dataset} train_samples={target.settings.get('train_samples')}: C={r['C']:g}, val {100 * r['val_acc']:.2f}%, "
              f"test {100 * r['test_acc']:.2f}% ({r['n_train']:,} training images, {r['seconds']:.1f} s"
              f"{', from the cache' if r['cached'] else ''}) ({where})", file=out)  # fmt: skip
    print(f"{done} floors computed, {skipped} skipped (data not here), {failed} failed; in {floors_dir}", file=out)
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    p = argparse.ArgumentParser(prog="repro registry", description="The results registry (results/): one record per finished sweep run.",
                                allow_abbrev=False)  # fmt: skip
    p.add_argument("--registry", type=Path, default=REGISTRY_DIR, help="the registry folder (default: the repository's results/)")
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("add", help="record the finished sweep runs under each PATH", allow_abbrev=False)
    a.add_argument("path", nargs="+", help="a run directory, an experiment directory, or runs/")
    a.add_argument("--allow-changed", action="store_true",
                   help="record runs whose config differs from the sweep file's (the differences become the record's overrides)")
    a.add_argument("--dry-run", action="store_true", help="say what would be added; write nothing")
    for name, text in (("list", "what is recorded, per sweep, profile and variant"), ("wandb", "log the records as W&B runs")):
        s = sub.add_parser(name, help=text, allow_abbrev=False)
        s.add_argument("--sweep", default=None, help="only this sweep (vit/position)")
        s.add_argument("--profile", default=None, help="only this profile")
        if name == "wandb":
            s.add_argument("--project", default="attention-repro", help="W&B project")
            s.add_argument("--root", default="runs", help="where the offline W&B files go: <root>/registry/... (default runs)")
    c = sub.add_parser("check", help="validate every record", allow_abbrev=False)
    c.add_argument("--definitions", action="store_true", help="also check each record's sweep definition is unchanged (slower)")
    c.add_argument("--fix-plateaus", action="store_true",
                   help="write the plateau the rule reads from each record's curve now into the records made under an older rule")
    t = sub.add_parser("tables", help="regenerate the README tables from the registry", allow_abbrev=False)
    t.add_argument("--check", action="store_true", help="change nothing; exit 1 if a generated table is out of date")
    f = sub.add_parser("floors", help="compute the pixel floors of the image sweeps into results/floors/", allow_abbrev=False)
    f.add_argument("--sweep", default=None, help="only this sweep (vit/data_size)")
    f.add_argument("--profile", default=None, help="only this profile (smoke profiles only when named)")
    f.add_argument("--grid", type=float, nargs="+", default=None, metavar="C", help="the C values tried (default: 0.001 0.01 0.1 1 10 100)")
    f.add_argument("--recompute", action="store_true", help="compute again what is recorded or cached")
    f.add_argument("--dry-run", action="store_true", help="say what would be computed; compute nothing")
    for s in sub.choices.values():  # --registry after the subcommand too (repro registry add --registry DIR PATH)
        s.add_argument("--registry", type=Path, default=argparse.SUPPRESS, help="the registry folder (default: the repository's results/)")
    argv = list(sys.argv[1:] if argv is None else argv)
    args, rest = p.parse_known_args(argv)
    if rest and args.command != "floors":
        p.error(f"unrecognized arguments: {' '.join(rest)}")
    args.data, args.argv = rest, argv
    if args.command == "floors" and args.grid is None:
        from datamodules.images.floor import DEFAULT_GRID

        args.grid = list(DEFAULT_GRID)
    commands = {"add": cmd_add, "list": cmd_list, "check": cmd_check, "tables": cmd_tables, "wandb": cmd_wandb,
                "floors": cmd_floors}
    try:
        return commands[args.command](args, out)
    except RecordError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

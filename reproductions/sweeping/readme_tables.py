"""The README tables, generated from the results registry (``repro registry tables``).

A Markdown file holds generated blocks between two HTML comments; everything between them is
rewritten from the registry's records, so no number in a results table is one the registry
does not hold:

    <!-- registry-table: vit/patch_size cpu -->
    ... one sweep profile's table (the report's: variant, mean ± std over the recorded seeds,
        the paper's values, params, FLOPs, throughput, time per run), with the command that
        made the runs, the records' count, seeds and hardware ...
    <!-- /registry-table -->

    <!-- registry-claims -->
    ... every claim with a record, one row per claim: its verdict at each scale from the
        smallest to the largest (the claims page's numbers, docs/claims.md) ...
    <!-- /registry-claims -->

``update_docs(registry)`` rewrites the blocks of README.md and reproductions/*/README.md (``check``:
writes nothing, returns the files that would change). A block naming a sweep or profile that
does not exist is an error naming the file and line.

Layer: above ``report`` and ``claims_page`` (imports plan, collect, tables, claims_page).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from reproductions.run.results import hardware_summary
from reproductions.sweeping.checks import verdict_counts
from reproductions.sweeping.claims_page import gather, scale_labels
from reproductions.sweeping.records import is_smoke
from reproductions.sweeping.collect import collect
from reproductions.sweeping.picks import picks, picks_markdown, usages
from reproductions.sweeping.plan import make_plan
from reproductions.sweeping.spec import REPO_ROOT, SweepError, profiles_by_sweep
from reproductions.sweeping.tables import markdown_table, table
from utils.atomic import atomic_write_text

#: the files whose blocks are generated
DOC_FILES = ("README.md", "reproductions/vit/README.md", "reproductions/bst/README.md")
_BLOCK = re.compile(r"(<!-- registry-(table): ([^ ]+) ([^ ]+) -->\n)(.*?)(<!-- /registry-table -->)"
                    r"|(<!-- registry-(claims) -->\n)(.*?)(<!-- /registry-claims -->)", re.S)  # fmt: skip
GENERATED_BY = "generated from `results/` by `repro registry tables`"


def profile_block(sweep_id: str, profile: str, registry: str | os.PathLike) -> str:
    """One profile's table from the registry alone, with where its numbers come from."""
    plan = make_plan(sweep_id, profile)
    collected = collect(plan, registry=registry, local=False)
    records = [r for vr in collected for r in vr.results]
    if not records:
        return (f"No records of `{sweep_id}` at `{profile}` in `results/` yet: `{plan.sweep_command()}`, then "
                f"`repro registry add runs/{plan.experiment}` ({GENERATED_BY}).\n")  # fmt: skip
    seeds = sorted({int(r["seed"]) for r in records})
    hardware = hardware_summary(records)
    dates = sorted(str(r.get("finished_at", ""))[:10] for r in records)
    when = dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}"
    header, rows = table(plan, collected)
    head = (f"`{plan.sweep_command()}`: {len(records)} runs (seeds {', '.join(map(str, seeds))}), {when}, {hardware}; "
            f"{GENERATED_BY}.")  # fmt: skip
    found = picks(plan, collected)
    chosen = "\n".join(picks_markdown(plan, found, usages(plan, found), heading=False))
    return f"{head}\n\n{markdown_table(header, rows)}\n" + (f"\n{chosen}" if chosen else "")


def claims_block(registry: str | os.PathLike) -> str:
    """Every claim with records: its verdict at each scale, smallest first."""
    gathered = gather(list(profiles_by_sweep()), "runs", registry=registry, local=False)
    rows, at_two, comparisons = [], 0, []
    for sc in gathered:
        for claim, measured in sc.claims().items():
            cells = []
            comparisons += [c for _, c in measured]
            for (m, c), label in zip(measured, scale_labels([m.profile for m, _ in measured])):
                number = f", {c.delta_text()}" if c.difference is not None else ""
                number += " (one seed)" if c.difference is not None and c.se is None else ""
                cells.append(f"{label}: **{c.verdict}**{number}")
            at_two += len([1 for _, c in measured if c.difference is not None]) >= 2
            rows.append([f"`{sc.sweep.id}`", claim, "<br>".join(cells)])
    if not rows:
        return f"No claim has records in `results/` yet ({GENERATED_BY}).\n"
    head = (f"{len(rows)} claims with records, {at_two} of them at two or more scales; each verdict with a - b ± its "
            f"standard error over the seeds, smallest scale first ({GENERATED_BY}; the figures, every row and what "
            "each verdict means: [docs/claims.md](docs/claims.md)). Verdicts, a claim at a scale each: "
            f"{verdict_counts(comparisons)}; **under-trained** means a side was below its pixel floor or still "
            "improving when its runs ended, so the verdict measures the budget, not the models.")  # fmt: skip
    return f"{head}\n\n{markdown_table(['sweep', 'claim (a > b)', 'verdict by scale'], rows, numbers=False)}\n"


def render_file(text: str, where: str, registry: str | os.PathLike) -> str:
    profiles = profiles_by_sweep()

    def block(match: re.Match) -> str:
        if match.group(2) == "table":
            sweep_id, profile = match.group(3), match.group(4)
            if profile not in profiles.get(sweep_id, []) or is_smoke(profile):
                line = text[: match.start()].count("\n") + 1
                raise SweepError(f"{where}:{line}: the block names {sweep_id} {profile}, which is no sweep profile; "
                                 f"sweeps and profiles: repro sweep --help")  # fmt: skip
            return match.group(1) + profile_block(sweep_id, profile, registry) + match.group(6)
        return match.group(7) + claims_block(registry) + match.group(10)

    return _BLOCK.sub(block, text)


def update_docs(registry: str | os.PathLike, *, check: bool = False, files: tuple[str, ...] = DOC_FILES) -> list[Path]:
    """Regenerate every block of ``files`` (under the repository root) from the registry; the
    files that changed (with ``check``: that would change; nothing is written)."""
    changed = []
    for name in files:
        path = REPO_ROOT / name
        text = path.read_text()
        new = render_file(text, name, registry)
        if new != text:
            changed.append(path)
            if not check:
                atomic_write_text(path, new)
    return changed

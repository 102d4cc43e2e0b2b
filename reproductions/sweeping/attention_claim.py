"""The attention-distance claim on the claims page: the paper's reading of Fig. 7 (right) and
Fig. 11 (some heads of the lowest layers attend locally; the distance grows with depth), checked
on every finished ViT run under the root that wrote ``analysis/attention_distance.json`` (the
``AttentionDistanceCallback`` at the end of every ViT fit).

``distance_groups(root)`` pools each experiment and variant over its seeds (the per-head
distances averaged, head by head; heads are not matched across seeds, so the pooled first layer
shows the mean of each head slot, and the per-seed verdicts are listed beside it);
``distance_section`` makes the page's section: one row per group, in order of tokens then
training samples, with its training budget, the first layer's range against uniform attention,
the first and last layers' means, the local heads and the verdict
(``analysis.distance.locality``); and the figure of the longest-trained group, copied from its
run directory.

Layer: beside ``claims_page`` (imports results, collect and analysis.distance).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from analysis.distance import LOCAL_FRACTION, locality, summarize
from reproductions.run.results import results_state
from reproductions.sweeping.collect import same_run

#: where a run keeps its attention distances
DISTANCE_FILE = Path("analysis") / "attention_distance.json"


@dataclass
class DistanceGroup:
    """One experiment and variant: its seeds' attention distances and results."""

    experiment: str
    variant: str
    runs: list[tuple[dict, dict, Path | None]] = field(default_factory=list)  # (distance json, results, run dir or None)

    @property
    def label(self) -> str:
        return self.experiment if self.variant in ("", "default") else f"{self.experiment} {self.variant}"

    def layers(self) -> list[dict]:
        """``analysis.distance.summarize``'s rows of the distances averaged over the seeds, head by head."""
        per_run = torch.tensor([[row["heads"] for row in d["attention_distance"]] for d, _, _ in self.runs],
                               dtype=torch.float64)  # fmt: skip
        return summarize(per_run.mean(dim=0))

    def budget(self) -> tuple[int | None, int | None, int | None]:
        """(epochs, steps, samples seen) of the first seed's training."""
        training = self.runs[0][1].get("training") or {}
        return training.get("epochs"), training.get("steps"), training.get("samples_seen")


def _config_grid(run_dir: Path) -> tuple[int, int] | None:
    """The patch grid of a plain ViT from the run's config.yaml (img_size / patch_size), for
    distance files written before they recorded their grid."""
    try:
        import yaml

        net = yaml.safe_load((run_dir / "config.yaml").read_text())["model"]["init_args"]["net"]["init_args"]
        side = int(net["img_size"]) // int(net["patch_size"])
    except (OSError, ValueError, KeyError, TypeError, ImportError):
        return None
    return side, side


def _grid_tokens(group: DistanceGroup) -> int | None:
    grids = {tuple(d["grid_size"]) if d.get("grid_size") else (_config_grid(run_dir) if run_dir is not None else None)
             for d, _, run_dir in group.runs}
    if len(grids) != 1 or None in grids:
        return None
    rows, cols = next(iter(grids))
    return int(rows) * int(cols)


def _local_distances(root: str | os.PathLike):
    """(distance json, results, run dir) of every finished run under ``root`` that has one."""
    for path in sorted(Path(root).rglob(str(DISTANCE_FILE))):
        run_dir = path.parent.parent
        state, results = results_state(run_dir)
        if state != "finished" or results is None:
            continue
        try:
            distances = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        yield distances, {**results, "source": "local"}, run_dir


def distance_groups(root: str | os.PathLike | None, *, smoke: bool = False, records: Sequence = ()) -> list[DistanceGroup]:
    """Every finished run under ``root`` (None: none) and every registry record (``records``)
    with attention distances, grouped by experiment and variant (runs of a ``-smoke`` experiment
    only with ``smoke``; a record of a run also found locally counts once, as the record), in order of tokens then
    samples seen. Groups whose seeds disagree on the layers or heads keep only the first shape's seeds."""
    recorded = [(rec.data["attention_distance"], rec.results(), None) for rec in records if "attention_distance" in rec.data]
    local = list(_local_distances(root)) if root is not None else []
    found = [x for x in local if not any(same_run(x[1], r) for _, r, _ in recorded)] + recorded  # a record counts once
    groups: dict[tuple[str, str], DistanceGroup] = {}
    for distances, results, run_dir in found:
        experiment, variant = str(results.get("experiment", "")), str(results.get("variant", ""))
        if experiment.endswith("-smoke") and not smoke:
            continue
        try:
            shape = [len(r["heads"]) for r in distances["attention_distance"]]
        except (KeyError, TypeError):
            continue
        group = groups.setdefault((experiment, variant), DistanceGroup(experiment, variant))
        if group.runs and shape != [len(r["heads"]) for r in group.runs[0][0]["attention_distance"]]:
            continue
        group.runs.append((distances, results, run_dir))

    def key(g: DistanceGroup) -> tuple:
        tokens, samples = _grid_tokens(g), g.budget()[2]
        return (tokens is None, tokens or 0, samples or 0, g.label)

    return sorted(groups.values(), key=key)


def _draw(label: str, distances: dict) -> bytes:
    """The figure the fit drew (per layer and head, uniform attention dashed), from a record's data."""
    from analysis.figures import attention_distance_figure
    from reproductions.sweeping.figures import png_bytes

    heads = torch.tensor([row["heads"] for row in distances["attention_distance"]], dtype=torch.float64)
    return png_bytes(attention_distance_figure({label: heads}, references={label: float(distances["uniform_attention_distance"])}))


def _px(value: float) -> str:
    return f"{value:.2f}"


def distance_section(groups: list[DistanceGroup], page_dir: Path, figure_dir: Path,
                     figures: dict[Path, bytes]) -> list[str]:  # fmt: skip
    """The page's section (Markdown lines); the longest-trained group's figure goes into ``figures``."""
    lines = [
        "## Attention distance (Fig. 7 right, Fig. 11)",
        "",
        "- Paper: in the lowest layers some heads attend to most of the image while others attend locally "
        "(small mean attention distance), and the attention distance grows with depth (ViT-L/16 pre-trained "
        "on JFT-300M).",
        "- Checked here on every finished ViT run that wrote `analysis/attention_distance.json` (the analysis "
        "at the end of every ViT fit, on the first validation images). A head is *local* when its mean "
        f"distance is below {LOCAL_FRACTION:g} x that of uniform attention over the patches; **holds**: the "
        "first layer has a local head and the last layer's mean distance is above the first's; **partly**: "
        "one of the two; **does not hold**: neither. Seeds are pooled head slot by head slot; the per-seed "
        "verdicts follow.",
        "",
    ]
    if not groups:
        return lines + ["No run here has attention distances yet (`repro fit` of any ViT config writes them).", ""]
    lines += ["| run | tokens | training | seeds | uniform (px) | layer 1 heads (px) | layer 1 -> last mean (px) "
              "| local heads in layer 1 | verdict (per seed) |",
              "|---|---:|---|---:|---:|---|---|---:|---|"]  # fmt: skip
    for g in groups:
        layers = g.layers()
        uniform = float(g.runs[0][0]["uniform_attention_distance"])
        pooled = locality(layers, uniform)
        per_seed = ", ".join(locality(d["attention_distance"], uniform)["verdict"] for d, _, _ in g.runs)
        epochs, steps, samples = g.budget()
        training = f"{epochs} epochs, {steps} steps" + (f", {samples:,} samples" if samples else "")
        tokens = _grid_tokens(g)
        lines.append(
            f"| {g.label} | {tokens if tokens is not None else '?'} | {training} | {len(g.runs)} | {_px(uniform)} | "
            f"{_px(layers[0]['min'])} - {_px(layers[0]['max'])} | {_px(layers[0]['mean'])} -> {_px(layers[-1]['mean'])} "
            f"| {pooled['local_heads']} of {pooled['heads']} | **{pooled['verdict']}** ({per_seed}) |"
        )
    lines.append("")
    longest = max(groups, key=lambda g: (g.budget()[2] or 0, _grid_tokens(g) or 0))
    distances, _, run_dir = longest.runs[0]
    source = run_dir / "analysis" / "attention_distance.png" if run_dir is not None else None
    if source is None or source.is_file():
        name = f"attention-distance-{longest.experiment.replace('/', '-')}-{longest.variant}.png".replace("=", "-")
        target = figure_dir / name
        figures[target] = source.read_bytes() if source is not None else _draw(longest.label, distances)
        link = Path(os.path.relpath(target, page_dir)).as_posix()
        epochs, steps, _ = longest.budget()
        lines += [f"The longest-trained run, {longest.label} (seed {longest.runs[0][1].get('seed', '?')}, {epochs} epochs): "
                  "mean attention distance per layer and head, the dashed line uniform attention.", "",
                  f"![attention distance of {longest.label}]({link})", ""]  # fmt: skip
    return lines

"""A run's validation curve and whether its validation metric reached a plateau.

The curve is every validation row of the run's ``metrics.csv``: step, epoch, fit time and the
``val/`` metrics (``read_curve``; the registry keeps it in each record). ``plateau`` reads it:

    gain = best value of the monitored metric in the last fifth of training (validations at step
           >= 0.8 x the last validation's step) - best value before that
    reached = the gain is at most the threshold, or early stopping ended the fit
    threshold = ``PLATEAU_THRESHOLD`` in the metric's own units (0.002: 0.2 points of accuracy, 0.002
                AUC); for an accuracy with a known validation size n, at least two binomial standard
                errors of the best value p, 2 sqrt(p (1 - p) / n) (0.9 points at 86% on 6,000
                images, 2.8 at 97% on 144), so a gain the validation set cannot tell from noise is not
                "still rising"

``mode`` follows the metric: a loss improves downwards, everything else upwards. A curve with
fewer than ``MIN_VALIDATIONS`` validations, or none on one side of the cut, cannot tell:
``reached`` is None. results.json records ``plateau`` at the end of a fit; for an older run or
record the same function reads its curve. A verdict whose side was still rising reads
"under-trained" (reproductions/sweeping/checks.py): a longer run could change it.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

CURVE_FIXED = ("step", "epoch", "time/fit_elapsed_s")
#: the largest gain over the last fifth that still counts as a plateau, in the metric's units
PLATEAU_THRESHOLD = 0.002
#: the fewest validations a curve needs to tell a plateau: with three (a 3-epoch run validated each
#: epoch) the last validation is the last fifth and the two before it the rest
MIN_VALIDATIONS = 3
#: the part of training (by steps) whose gain decides
LAST_PART = 0.2


def finite_or_none(value: Any) -> Any:
    return value if not isinstance(value, float) or math.isfinite(value) else None


def read_curve(metrics_csv: Path) -> dict[str, Any]:
    """Every validation row of a run's metrics.csv: step, epoch, fit time and the ``val/`` metrics."""
    columns: list[str] = list(CURVE_FIXED)
    rows: list[dict[str, float]] = []
    if Path(metrics_csv).is_file():
        with open(metrics_csv, newline="") as f:
            reader = csv.DictReader(f)
            val = sorted(k for k in (reader.fieldnames or []) if k.startswith("val/"))
            columns += val
            for row in reader:
                if not any(row.get(k) not in (None, "") for k in val):
                    continue
                values = {}
                for k in columns:
                    try:
                        values[k] = finite_or_none(float(row[k])) if row.get(k) not in (None, "") else None
                    except ValueError:
                        values[k] = None
                rows.append(values)
    used = [c for c in columns if c in CURVE_FIXED or any(r.get(c) is not None for r in rows)]
    return {"columns": used, "rows": [[r.get(c) for c in used] for r in rows]}


def metric_mode(metric: str) -> str:
    """``min`` for a loss, ``max`` for everything else (accuracy, AUC)."""
    return "min" if "loss" in metric.rsplit("/", 1)[-1] else "max"


def plateau(curve: dict[str, Any] | None, monitor: str | None, *, stopped_early: bool | None = None,
            val_size: int | None = None) -> dict[str, Any]:  # fmt: skip
    """Whether ``monitor`` stopped improving over the last fifth of ``curve`` (see the module docstring);
    ``val_size``: the validation images, for an accuracy's noise."""
    threshold = PLATEAU_THRESHOLD
    out: dict[str, Any] = {
        "metric": monitor, "mode": metric_mode(monitor or ""), "threshold": threshold, "last_part": LAST_PART,
        "gain": None, "validations": 0, "stopped_early": stopped_early, "reached": None,
    }  # fmt: skip
    columns = (curve or {}).get("columns") or []
    if not monitor or monitor not in columns or "step" not in columns:
        return {**out, "reached": True if stopped_early else None}
    i, s = columns.index(monitor), columns.index("step")
    points = [(row[s], row[i]) for row in curve.get("rows") or [] if row[s] is not None and row[i] is not None]
    out["validations"] = len(points)
    if len(points) < MIN_VALIDATIONS:
        return {**out, "reached": True if stopped_early else None}
    cut = (1 - LAST_PART) * max(step for step, _ in points)
    before = [v for step, v in points if step < cut]
    last = [v for step, v in points if step >= cut]
    if not before or not last:
        return {**out, "reached": True if stopped_early else None}
    sign = 1.0 if out["mode"] == "max" else -1.0
    best = (max if sign > 0 else min)
    gain = sign * (best(last) - best(before))
    if monitor.endswith("acc") and val_size and 0 <= best(last) <= 1:
        p = best(last)
        threshold = max(threshold, 2 * math.sqrt(p * (1 - p) / val_size))
    out.update(gain=round(gain, 6), threshold=round(threshold, 6), reached=bool(stopped_early) or gain <= threshold)
    return out


def run_plateau(results: dict[str, Any], *, reread: bool = False) -> dict[str, Any] | None:
    """A run's (or record's) plateau: as recorded, else read from its curve (older runs); None when
    neither says (a results.json without either). ``reread``: what the rule reads from the curve today,
    with the early stopping the run recorded, even where a plateau is recorded (one made under an older
    rule differs)."""
    recorded = results.get("plateau")
    if isinstance(recorded, dict) and not reread:
        return recorded
    curve = results.get("curve")
    if not isinstance(curve, dict):
        if not reread:
            return None
        curve = None  # the rule reads "cannot tell"
    stopped_early = recorded.get("stopped_early") if isinstance(recorded, dict) else None
    return plateau(curve, (results.get("best") or {}).get("monitor"), stopped_early=stopped_early,
                   val_size=(results.get("data") or {}).get("val_size"))


def still_rising(results: dict[str, Any]) -> bool:
    """The run's validation metric was still improving when it ended (``reached`` is False)."""
    found = run_plateau(results)
    return found is not None and found.get("reached") is False

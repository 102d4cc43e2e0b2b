"""The validation curve and the plateau rule (reproductions/run/curve.py), and the verdict rule built on it
and on the pixel floors (reproductions/sweeping/checks.py): a side below its floor or still rising reads
under-trained; a plateaued pair above its floors keeps holds / within noise / does not hold."""

from __future__ import annotations

import pytest

from reproductions.run.curve import PLATEAU_THRESHOLD, plateau, read_curve, run_plateau, still_rising
from reproductions.sweeping.checks import VERDICTS, Comparison, verdict_counts
from reproductions.sweeping.collect import Stat, VariantResults
from reproductions.sweeping.spec import Metric, Variant

ACC = Metric(key="test/acc", label="test acc.", scale=100, digits=2, unit="points")


def curve(values, monitor="val/acc", every=100):
    return {"columns": ["step", "epoch", monitor], "rows": [[every * (i + 1), i, v] for i, v in enumerate(values)]}


def test_a_curve_that_stopped_improving_has_reached_its_plateau():
    p = plateau(curve([0.5, 0.7, 0.8, 0.84, 0.85, 0.85, 0.849, 0.851, 0.850, 0.851]), "val/acc")
    assert p["reached"] is True and p["gain"] == pytest.approx(0.001) and p["threshold"] == PLATEAU_THRESHOLD
    assert p["validations"] == 10 and p["mode"] == "max"


def test_a_curve_still_rising_over_its_last_fifth_has_not():
    p = plateau(curve([0.5, 0.6, 0.65, 0.7, 0.72, 0.74, 0.76, 0.78, 0.79, 0.81]), "val/acc")
    assert p["reached"] is False and p["gain"] == pytest.approx(0.05)  # 0.81 (last fifth: steps >= 800) vs 0.76
    # early stopping ended it: patience checks without improvement are a plateau by that rule
    assert plateau(curve([0.5, 0.6, 0.65, 0.7, 0.8]), "val/acc", stopped_early=True)["reached"] is True


def test_a_loss_improves_downwards():
    falling = curve([2.0, 1.5, 1.2, 1.0, 0.9, 0.8], monitor="val/loss")
    assert plateau(falling, "val/loss")["mode"] == "min" and plateau(falling, "val/loss")["reached"] is False
    flat = curve([2.0, 1.5, 1.2, 1.0, 1.0, 1.0005], monitor="val/loss")
    assert plateau(flat, "val/loss")["reached"] is True


def test_an_accuracy_gain_within_the_validation_sets_noise_is_not_rising():
    values = [0.9, 0.95, 0.96, 0.965, 0.97]  # +0.5 points over the last fifth
    assert plateau(curve(values), "val/acc")["reached"] is False  # on an unknown validation set
    small = plateau(curve(values), "val/acc", val_size=144)  # 2 s.e. at 97% on 144 images: 2.8 points
    assert small["reached"] is True and small["threshold"] == pytest.approx(0.0284, abs=1e-4)
    assert plateau(curve(values), "val/acc", val_size=100_000)["reached"] is False


@pytest.mark.parametrize("values", [[0.5, 0.6], [0.5, 0.6, 0.7], [0.5, 0.6, 0.7, 0.8]])
def test_too_short_a_curve_or_another_metric_cannot_tell(values):
    assert plateau(curve(values), "val/acc")["reached"] is (None if len(values) < 3 else False)
    assert plateau(curve(values, monitor="val/auc"), "val/acc")["reached"] is None  # not in the curve


def test_three_validations_judge_the_last_against_the_two_before():
    """A 3-epoch run validated each epoch: its last validation is its last fifth."""
    rising = plateau(curve([0.65, 0.77, 0.84]), "val/acc", val_size=6000)
    assert rising["reached"] is False and rising["gain"] == pytest.approx(0.07)
    flat = plateau(curve([0.80, 0.86, 0.861]), "val/acc", val_size=6000)
    assert flat["reached"] is True and flat["gain"] == pytest.approx(0.001)


def test_read_curve_keeps_the_validation_rows(tmp_path):
    csv = tmp_path / "metrics.csv"
    csv.write_text("epoch,step,train/loss,val/acc,time/fit_elapsed_s\n0,10,1.0,,\n0,19,,0.5,3.0\n1,39,,0.7,6.0\n")
    got = read_curve(csv)
    assert got["columns"] == ["step", "epoch", "time/fit_elapsed_s", "val/acc"]
    assert got["rows"] == [[19.0, 0.0, 3.0, 0.5], [39.0, 1.0, 6.0, 0.7]]


def test_a_run_reads_its_recorded_plateau_or_its_records_curve():
    rising = {"best": {"monitor": "val/acc"}, "curve": curve([0.5, 0.6, 0.7, 0.8, 0.9])}
    assert still_rising(rising) and run_plateau(rising)["gain"] == pytest.approx(0.2)  # steps >= 400 vs before
    assert not still_rising({**rising, "plateau": {"reached": True}})  # what the run recorded wins
    assert run_plateau({"test": {}}) is None and not still_rising({"test": {}})


# --------------------------------------------------------------------------- the verdict rule


def side(mean, std=0.5, n=3, rising=0, floor=None) -> Stat:
    return Stat(mean, std, n, rising=rising, floor=floor)


@pytest.mark.parametrize("a, b, verdict", [
    (side(85.0), side(80.0), "holds"),
    (side(80.0), side(85.0), "does not hold"),
    (side(80.2), side(80.0), "within noise"),
])  # fmt: skip
def test_a_plateaued_pair_above_its_floors_keeps_its_verdict(a, b, verdict):
    c = Comparison("A", "B", a, b, ACC)
    assert c.verdict == verdict and c.under_trained == []


@pytest.mark.parametrize("a, b, reason", [
    (side(70.0, floor=80.36), side(85.0, floor=80.36), "A 70.00 is below its pixel floor 80.36"),
    (side(85.0), side(80.0, rising=2), "B still rising at the end in 2 of 3 runs"),
    (side(60.0, floor=80.0, rising=3), side(62.0, floor=80.0), "A 60.00 is below its pixel floor 80.00"),
])  # fmt: skip
def test_a_side_below_its_floor_or_still_rising_reads_under_trained(a, b, reason):
    c = Comparison("A", "B", a, b, ACC)
    assert c.verdict == "under-trained" and reason in c.verdict_text and reason in c.note
    assert "does not hold" not in c.verdict_text and "holds" not in c.verdict_text


def test_verdicts_are_counted_apart():
    cs = [Comparison("A", "B", side(85.0), side(80.0), ACC), Comparison("A", "B", side(85.0, rising=1), side(80.0), ACC),
          Comparison("A", "B", side(80.1), side(80.0), ACC), Comparison("A", "B", side(None, n=0), side(80.0), ACC)]
    assert verdict_counts(cs) == "1 holds, 1 within noise, 1 under-trained"
    assert "under-trained" in VERDICTS


def test_a_variants_column_counts_its_rising_runs():
    runs = [{"seed": 0, "test": {"test/acc": 0.8}, "best": {"monitor": "val/acc"}, "curve": curve([0.5, 0.6, 0.7, 0.8, 0.9])},
            {"seed": 1, "test": {"test/acc": 0.82}, "plateau": {"reached": True}}]
    stat = VariantResults(Variant("v", {}, {}), results=runs).column(ACC)
    assert stat.n == 2 and stat.rising == 1 and stat.mean == pytest.approx(81.0)

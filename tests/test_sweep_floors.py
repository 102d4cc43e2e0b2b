"""The pixel floors in the registry (reproductions/sweeping/floors.py, floor_targets.py, the report's rows and
marks, ``repro registry floors``)."""

from __future__ import annotations

import io

import pytest

from reproductions.commands.registry import main as registry_main
from reproductions.sweeping.collect import collect
from reproductions.sweeping.floors import floor_for, floor_of, record_floor, run_dataset, run_floor
from reproductions.sweeping.plan import make_plan
from reproductions.sweeping.records import read_registry
from reproductions.sweeping.tables import BELOW_FLOOR, table
from tests.report_helpers import position_sweep, put
from tests.sweep_helpers import write_sweep

SPLIT = {"split_seed": 0, "val_fraction": 0.1, "test_fraction": 0.2, "input_shape": [1, 8, 8], "test_size": 359}


def _result(c: float, test_acc: float, n_train: int) -> dict:
    return {"C": c, "val_acc": test_acc + 0.01, "test_acc": test_acc, "val_by_C": {f"{c:g}": test_acc + 0.01},
            "n_train": n_train, "n_val": 144, "n_test": 359, "seconds": 0.1, "grid": [0.1, 1.0], "max_iter": 300,
            "tol": 1e-4, "identity": {"source": "digits", "origin": "/home/me/digits.csv.gz", **SPLIT},
            "versions": {"scikit-learn": "1.x"}, "cpu": "a CPU"}  # fmt: skip


def _run_data(train_samples=None, **changes) -> dict:
    data = {"source": "digits", "train_samples": train_samples, "split_seed": 0, "val_fraction": 0.1,
            "input_shape": [1, 8, 8], "test_size": 359}  # fmt: skip
    return {"data": {**data, **changes}}


def test_floor_for_reads_what_was_recorded(tmp_path):
    record_floor("digits", None, _result(10.0, 0.96, 1294), command="repro registry floors", floors_dir=tmp_path)
    path = record_floor("digits", 300, _result(1.0, 0.90, 300), command="repro registry floors", floors_dir=tmp_path)
    assert path == tmp_path / "digits.json" and '/home/me' not in path.read_text()  # no local path kept
    whole, sub = floor_for("digits", None, floors_dir=tmp_path), floor_for("digits", 300, floors_dir=tmp_path)
    assert (whole["C"], whole["test_acc"], whole["val_acc"]) == (10.0, 0.96, pytest.approx(0.97))
    assert (sub["C"], sub["test_acc"], sub["train_samples"]) == (1.0, 0.90, 300)
    assert floor_for("digits", 1294, floors_dir=tmp_path)["C"] == 10.0  # a subset as large as the split is it
    assert floor_for("digits", 500, floors_dir=tmp_path) is None and floor_for("cifar10", None, floors_dir=tmp_path) is None
    assert run_dataset(_run_data(300)) == ("digits", 300)
    assert run_dataset({"data": {"source": "folder", "origin": ".../cifar10", "input_shape": [3, 32, 32]}}) == \
        ("folder-cifar10", None)  # fmt: skip
    assert run_dataset({"data": {"source": "movielens", "splits": {}}}) is None  # not images
    assert run_floor(_run_data(300), floors_dir=tmp_path)["test_acc"] == 0.90
    for other in ({"split_seed": 1}, {"val_fraction": 0.2}, {"input_shape": [1, 16, 16]}, {"split_seed": None}):
        assert run_floor(_run_data(300, **other), floors_dir=tmp_path) is None, other  # another split: not its floor
    assert floor_of([_run_data(300), _run_data(None)], floors_dir=tmp_path) is None  # two training sets: no one floor


def test_a_rewritten_floors_file_is_read_again(tmp_path):
    record_floor("digits", 300, _result(1.0, 0.90, 300), command="repro registry floors", floors_dir=tmp_path)
    assert floor_for("digits", 300, floors_dir=tmp_path)["test_acc"] == 0.90
    record_floor("digits", 300, _result(0.1, 0.80, 300), command="repro registry floors", floors_dir=tmp_path)
    assert floor_for("digits", 300, floors_dir=tmp_path)["test_acc"] == 0.80  # not the first read's, kept
    (tmp_path / "digits.json").unlink()
    assert floor_for("digits", 300, floors_dir=tmp_path) is None


def test_floor_files_are_not_read_as_run_records(tmp_path):
    record_floor("digits", None, _result(10.0, 0.96, 1294), command="repro registry floors", floors_dir=tmp_path / "floors")
    assert read_registry(tmp_path) == []


def test_the_report_table_has_the_floor_row_and_marks_a_model_below_it(tmp_path):
    sweep = position_sweep(tmp_path)
    root = tmp_path / "runs"
    for seed in range(2):
        for variant, acc in (("none", 0.80), ("learned", 0.95)):
            put(root, "pos-smoke", variant, seed, acc=acc)
            path = root / "pos-smoke" / variant / f"seed{seed}" / "results.json"
            path.write_text(path.read_text().replace('"source": "digits"', '"source": "digits", "split_seed": 0, '
                                                     '"val_fraction": 0.1, "train_samples": null'))  # fmt: skip
    floors = tmp_path / "floors"
    record_floor("digits", None, _result(10.0, 0.9, 1294), command="repro registry floors", floors_dir=floors)
    plan = make_plan(sweep, "smoke", root=root)
    header, rows = table(plan, collect(plan, floors_dir=floors))
    by_name = {r[0]: r for r in rows}
    assert by_name["none"][1] == f"80.00 ± 0.00 {BELOW_FLOOR}" and by_name["learned"][1] == "95.00 ± 0.00"
    floor_row = rows[-1]
    assert floor_row[0] == "pixel logistic regression (C=10, chosen on validation)" and floor_row[1] == "90.00"
    assert len(floor_row) == len(header)
    _, without = table(plan, collect(plan, floors_dir=tmp_path / "none"))
    assert len(without) == len(rows) - 1 and BELOW_FLOOR not in without[0][1]  # no floor recorded: no row, no mark
    # the floors a verdict reads are the registry's it was collected with (repro claims --registry), not the repository's
    record_floor("digits", None, _result(10.0, 0.9, 1294), command="repro registry floors", floors_dir=tmp_path / "reg" / "floors")
    from_registry = collect(plan, registry=tmp_path / "reg")
    assert from_registry[0].floors_dir == tmp_path / "reg" / "floors"
    assert from_registry[0].column(plan.sweep.metric).floor == pytest.approx(90.0)
    assert collect(plan, registry=tmp_path / "empty")[0].column(plan.sweep.metric).floor is None


def test_registry_floors_computes_once_then_skips(tmp_path):
    sweep = write_sweep(tmp_path / "tiny.yaml", variants=[{"name": "a", "overrides": {}}],
                        overrides={"data.init_args.train_samples": 200})  # fmt: skip
    args = ["--registry", str(tmp_path / "reg"), "floors", "--sweep", str(sweep), "--profile", "smoke", "--grid", "0.1", "1",
            f"--data.cache_dir={tmp_path / 'cache'}"]  # fmt: skip
    out = io.StringIO()
    assert registry_main(args, out=out) == 0
    assert "1 floors computed, 0 skipped" in out.getvalue()
    floor = floor_for("digits", 200, floors_dir=tmp_path / "reg" / "floors")
    assert floor["n_train"] == 200 and floor["C"] in (0.1, 1.0) and 0.5 < floor["test_acc"] <= 1.0
    again = io.StringIO()
    assert registry_main(args, out=again) == 0
    assert "recorded already: digits train_samples=200" in again.getvalue() and "0 floors computed" in again.getvalue()

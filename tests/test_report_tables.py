"""The report's numbers (reproductions/sweeping/collect.py, tables.py): mean and sample std,
number formats, which results count, the table's shape, RelaImpr."""

from __future__ import annotations

import pytest

from reproductions.run.results import RESULTS_FILE, atomic_write_json
from reproductions.sweeping.collect import collect, mean_std
from reproductions.sweeping.plan import make_plan
from reproductions.sweeping.tables import fmt_si, relaimpr, table
from tests.report_helpers import bst_result, position_sweep, put, result


def test_mean_and_sample_std_known_answer():
    s = mean_std([0.90, 0.92, 0.94])
    assert s.n == 3 and s.mean == pytest.approx(0.92) and s.std == pytest.approx(0.02)  # ddof = 1
    one = mean_std([0.5])
    assert one.mean == 0.5 and one.std is None and one.n == 1
    assert mean_std([]).mean is None and mean_std([1.0, float("nan"), 3.0]).mean == 2.0
    assert fmt_si(136138) == "136k" and fmt_si(7.3e11, "FLOP") == "730 GFLOP" and fmt_si(86.57e6) == "86.6M"



def test_collect_reads_only_finished_results(tmp_path):
    sweep = position_sweep(tmp_path)
    root = tmp_path / "runs"
    put(root, "pos-smoke", "none", 0, acc=0.5)
    d = root / "pos-smoke" / "none" / "seed1"
    d.mkdir(parents=True)
    (d / RESULTS_FILE).write_text('{"status": "running"}')  # not finished: not a result
    (root / "pos-smoke" / "none" / "seed2").mkdir()
    (root / "pos-smoke" / "none" / "seed2" / RESULTS_FILE).write_text('{"status": "finis')  # torn: not a result
    plan = make_plan(sweep, "smoke", root=root)
    none = collect(plan)[0]
    assert [r["seed"] for r in none.results] == [0]
    assert [s for s, _ in none.missing] == [1, 2]
    header, rows = table(plan, collect(plan))
    assert rows[0][1:3] == ["50.00", "1"] and len(rows) == 4 and len(header) == len(rows[0])



def test_collect_leaves_out_results_that_are_not_the_runs_own(tmp_path):
    """A finished results.json of another experiment, variant or seed, or without the sweep's
    metric, is named with the reason and left out of the results (so of the table's means,
    FLOPs and throughput); one that does not record its names is taken as the run's."""
    sweep = position_sweep(tmp_path)
    root, exp = tmp_path / "runs", "pos-smoke"
    for seed in (0, 1):
        put(root, exp, "learned", seed, acc=0.90 + 0.02 * seed, flops=4.76e6, speed=150.0)
    atomic_write_json(root / exp / "learned" / "seed2" / RESULTS_FILE, bst_result())  # a BST run copied in
    atomic_write_json(root / exp / "learned" / "seed5" / RESULTS_FILE, bst_result(5))  # an unplanned seed too
    put(root, exp, "none", 1, acc=0.80)
    atomic_write_json(root / exp / "none" / "seed0" / RESULTS_FILE,  # another variant's run, moved here
                      result("learned", 0, 0.99, experiment=exp))  # fmt: skip
    no_metric = result("relative", 0, 0.5, experiment=exp)
    no_metric["test"] = {"test/loss": 0.5}
    atomic_write_json(root / exp / "relative" / "seed0" / RESULTS_FILE, no_metric)
    atomic_write_json(root / exp / "sincos" / "seed0" / RESULTS_FILE, result("sincos", 0, 0.7))  # no experiment recorded
    plan = make_plan(sweep, "smoke", root=root)
    none, learned, relative, sincos = collect(plan)
    assert [r["seed"] for r in learned.results] == [0, 1] and [s for s, _ in learned.rejected] == [2, 5]
    why = dict(learned.rejected)[2]
    assert why.startswith("results.json does not belong to this sweep's run (its experiment is 'bst/position-smoke', "
                          "not 'pos-smoke'; its variant is 'position=index', not 'learned'; its seed is 0, not 2; "
                          "it has no test/acc (the sweep's metric)): left out of the table, the means and the ratios")
    assert (2, why) in learned.missing and 5 in dict(learned.missing)
    assert none.results[0]["seed"] == 1 and dict(none.rejected)[0].startswith(
        "results.json does not belong to this sweep's run (its variant is 'learned', not 'none'):")
    assert relative.results == [] and "(it has no test/acc (the sweep's metric))" in dict(relative.rejected)[0]
    assert [r["seed"] for r in sincos.results] == [0] and sincos.rejected == []
    header, rows = table(plan, [none, learned, relative, sincos])
    cells = dict(zip(header, rows[1]))
    assert cells["ours: test acc. (%), mean ± std"] == "91.00 ± 1.41" and cells["n"] == "2"
    assert cells["params"] == "136k" and cells["GFLOPs/image"] == "0.00476" and cells["train images/s"] == "150 ± 0"
    assert dict(zip(header, rows[0]))["ours: test acc. (%), mean ± std"] == "80.00"


def test_relaimpr_is_the_papers_formula():
    """The report's RelaImpr is the training code's (``lightning_modules.metrics.rela_impr``, tested in
    tests/test_ctr_module.py), and None where it is undefined."""
    assert relaimpr(0.7894, 0.7734) == pytest.approx(5.8522, abs=1e-4)  # 0.2894 / 0.2734 - 1
    assert relaimpr(0.8, 0.5) is None and relaimpr(None, 0.7) is None and relaimpr(0.8, None) is None

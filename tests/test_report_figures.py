"""The report's figure (reproductions/sweeping/figures.py): the dispatcher and one drawing per plot
kind on hand-made results (what each draws is checked on the figure's axes, not its pixels)."""

from __future__ import annotations

import pytest

from reproductions.run.results import RESULTS_FILE, atomic_write_json
from reproductions.sweeping.collect import collect
from reproductions.sweeping.figures import PLOTS, PLOTTERS, figure, pyplot
from reproductions.sweeping.plan import make_plan
from reproductions.sweeping.spec import SweepError
from tests.report_helpers import PNG, position_sweep, put, result, write_report_sweep


def grid_sweep(tmp_path, report: dict, **spec):
    """A 2 x 2 grid (model x n) with a 5-shot column, results for every run, and its plan."""
    path = write_report_sweep(
        tmp_path / "grid.yaml", axis="grid", aliases={"n": "data.init_args.train_samples"},
        variants=[{"name": "ViT", "axes": {"model": "ViT"}}, {"name": "ResNet", "axes": {"model": "ResNet"}}],
        product={"n": [1000, 10000]}, columns=[{"key": "test/fewshot_5", "label": "5-shot (%)", "scale": 100}],
        report=report, **spec,
    )  # fmt: skip
    root = tmp_path / "runs"
    plan = make_plan(path, "smoke", root=root, seeds=2)
    for v in plan.variants:
        for seed in plan.seeds:
            r = result(v.name, seed, 0.8 + 0.01 * seed)
            r["test"]["test/fewshot_5"] = 0.5
            run_dir = plan.experiment_dir / v.name / f"seed{seed}"
            atomic_write_json(run_dir / RESULTS_FILE, r)
            (run_dir / "metrics.csv").write_text("time/fit_elapsed_s,val/acc\n10,0.5\n20,0.8\n")
    return plan


@pytest.mark.parametrize(
    "report, panels",
    [
        ({"plot": "bars"}, 1),
        ({"plot": "bars", "speed": True, "panels": ["test/fewshot_5"]}, 3),
        ({"plot": "grouped_bars", "x": "n", "hue": "model"}, 1),
        ({"plot": "accuracy_vs_flops"}, 2),
        ({"plot": "lines", "x": "n", "hue": "model", "panels": ["test/fewshot_5"]}, 2),
        ({"plot": "curves", "target": 0.9, "budget_s": 15}, 1),
    ],
)
def test_each_plot_kind_draws_its_panels(tmp_path, report, panels):
    plan = grid_sweep(tmp_path, report)
    collected = collect(plan)
    have = [vr for vr in collected if vr.metric(plan).mean is not None]
    fig = PLOTTERS[report["plot"]](plan, collected, have)
    try:
        assert len(fig.axes) == panels
        assert any(ax.lines or ax.patches or ax.collections for ax in fig.axes)  # something drawn
    finally:
        pyplot().close(fig)
    path = figure(plan, collected, tmp_path / "out" / "grid.png")
    assert path.read_bytes()[:8] == PNG


def test_the_dispatcher_checks_the_kind_and_draws_nothing_without_results(tmp_path):
    assert set(PLOTS) == set(PLOTTERS) == {"bars", "grouped_bars", "accuracy_vs_flops", "lines", "curves"}
    plan = make_plan(position_sweep(tmp_path), "smoke", root=tmp_path / "runs")
    assert figure(plan, collect(plan), tmp_path / "none.png") is None  # no finished run: no figure
    assert not (tmp_path / "none.png").exists()
    put(tmp_path / "runs", "pos-smoke", "none", 0, acc=0.5)
    path = figure(plan, collect(plan), tmp_path / "one.png")
    assert path == tmp_path / "one.png" and path.read_bytes()[:8] == PNG
    plan.sweep.report["plot"] = "pie"
    with pytest.raises(SweepError, match=r"report.plot='pie' is not one of \['bars', 'grouped_bars'"):
        figure(plan, collect(plan), tmp_path / "pie.png")


def test_lines_need_an_x_and_a_hue(tmp_path):
    plan = grid_sweep(tmp_path, {"plot": "lines", "x": "n"})
    with pytest.raises(SweepError, match="report.plot=lines needs report.x"):
        figure(plan, collect(plan), tmp_path / "grid.png")

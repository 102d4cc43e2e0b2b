"""A tuning sweep's picks (reproductions/sweeping/picks.py): the best point of each group, its grid edges, and
whether the sweeps that take the picks run at them (the report's table, ``repro registry check --definitions``)."""

from __future__ import annotations

import io

import pytest

from reproductions.commands.registry import main as registry_main
from reproductions.sweeping.collect import collect
from reproductions.sweeping.picks import disagreements, picks, picks_markdown, registry_disagreements, usages
from reproductions.sweeping.plan import make_plan
from reproductions.sweeping.records import read_registry
from reproductions.sweeping.spec import SweepError, load_sweep
from reproductions.sweeping.sweep_report import render
from tests.report_helpers import put
from tests.sweep_helpers import write_sweep

ALIASES = {"lr": "model.init_args.lr", "wd": "model.init_args.weight_decay"}


def _sweeps(tmp_path, *, target_b=(0.004, 0.0), into_extra=None):
    target = write_sweep(tmp_path / "target.yaml", aliases=ALIASES, variants=[
        {"name": "A", "overrides": {"lr": 0.002, "wd": 0.1}},
        {"name": "B", "overrides": {"lr": target_b[0], "wd": target_b[1]}},
    ])  # fmt: skip
    into = [{"sweep": str(target), "profile": "smoke", "name_is": "model"}, *(into_extra or [])]
    tune = write_sweep(tmp_path / "tune.yaml", axis="lr", aliases=ALIASES,
                       variants=[{"name": "A", "axes": {"model": "A"}}, {"name": "B", "axes": {"model": "B"}}],
                       product={"lr": [0.001, 0.002, 0.004], "wd": [0.0, 0.1]},
                       report={"plot": "bars", "picks": {"by": ["model"], "into": into}})  # fmt: skip
    return tune, target


def _fill(root, plan, scores, skip=()):
    for v in plan.variants:
        if v.name not in skip:
            put(root, plan.experiment, v.name, 0, acc=scores(v.axes))


def _score(axes):
    if axes["model"] == "A":  # best at lr 0.002 (inside the grid), weight decay 0.1 (the grid's largest)
        return 0.9 - abs(axes["lr"] - 0.002) * 10 + axes["wd"] * 0.1
    return 0.8 + axes["lr"] * 10 - axes["wd"] * 0.1  # B: the largest lr, no weight decay


def test_each_group_gets_its_best_point_and_its_edges(tmp_path):
    tune, _ = _sweeps(tmp_path)
    plan = make_plan(tune, "smoke", root=tmp_path / "runs")
    _fill(tmp_path / "runs", plan, _score)
    found = {dict(p.group)["model"]: p for p in picks(plan, collect(plan))}
    a, b = found["A"], found["B"]
    assert (a.values, a.done, a.total, a.complete) == ({"lr": 0.002, "wd": 0.1}, 6, 6, True)
    assert a.edges == ["wd 0.1 is the largest tried"]
    assert b.values == {"lr": 0.004, "wd": 0.0}
    assert b.edges == ["lr 0.004 is the largest tried"]  # no weight decay is not an edge: it cannot go lower
    assert a.score == pytest.approx(91.0)


def test_edges_are_each_groups_own_grid_where_the_product_is_several_grids(tmp_path):
    """B's grid is widened to lr 0.008: its pick at 0.004 is inside its own grid, no longer at an edge,
    while A's 0.004 is still the largest A tried."""
    tune = write_sweep(tmp_path / "tune.yaml", axis="lr", aliases=ALIASES,
                       product=[{"model": ["A"], "lr": [0.001, 0.002, 0.004]},
                                {"model": ["B"], "lr": [0.001, 0.002, 0.004, 0.008]}],
                       report={"plot": "bars", "picks": {"by": ["model"], "into": []}})  # fmt: skip
    plan = make_plan(tune, "smoke", root=tmp_path / "runs")
    _fill(tmp_path / "runs", plan, lambda axes: 0.9 - abs(axes["lr"] - 0.004))
    found = {dict(p.group)["model"]: p for p in picks(plan, collect(plan))}
    assert found["A"].values == found["B"].values == {"lr": 0.004}
    assert found["A"].edges == ["lr 0.004 is the largest tried"] and found["B"].edges == []
    assert (found["A"].total, found["B"].total) == (3, 4)
    # until B's lr 0.008 has run, its 0.004 is the largest value tried: an edge of what ran, not of the plan
    (tmp_path / "runs" / plan.experiment / "model=B,lr=0.008" / "seed0" / "results.json").unlink()
    found = {dict(p.group)["model"]: p for p in picks(plan, collect(plan))}
    assert found["B"].edges == ["lr 0.004 is the largest tried"] and (found["B"].done, found["B"].complete) == (3, False)


def test_a_target_at_the_picks_agrees_and_one_off_them_is_named(tmp_path):
    tune, _ = _sweeps(tmp_path, target_b=(0.001, 0.0))
    plan = make_plan(tune, "smoke", root=tmp_path / "runs")
    _fill(tmp_path / "runs", plan, _score)
    used = usages(plan, picks(plan, collect(plan)))
    by = {u.variant: u for u in used}
    assert by["A"].status == "the pick" and not by["A"].differs
    assert by["B"].differs == ["lr 0.001 (the pick: 0.004)"]
    assert disagreements(used) == [f"{by['B'].target} B: differs from the pick: lr 0.001 (the pick: 0.004)"]
    text = "\n".join(picks_markdown(plan, picks(plan, collect(plan)), used))
    assert "| A | 0.002 | 0.1 | 91.00 | 6 of 6 | wd 0.1 is the largest tried |" in text
    assert "1 of 2 variants run at their group's complete pick" in text
    assert f"- `B` (`{by['B'].target}`): differs from the pick: lr 0.001 (the pick: 0.004)" in text


def test_a_variant_off_its_pick_in_two_profiles_is_one_line_naming_both(tmp_path):
    """Profiles that take the picks (the same variants, values shared) list a variant off its pick once: naming
    the profiles where it is off, or saying it is off in every one."""
    other = write_sweep(tmp_path / "other.yaml", aliases=ALIASES, variants=[
        {"name": "A", "overrides": {"lr": 0.002, "wd": 0.1}}, {"name": "B", "overrides": {"lr": 0.001, "wd": 0.0}},
    ])  # fmt: skip
    third = write_sweep(tmp_path / "third.yaml", aliases=ALIASES, variants=[  # B at its pick here
        {"name": "A", "overrides": {"lr": 0.002, "wd": 0.1}}, {"name": "B", "overrides": {"lr": 0.004, "wd": 0.0}},
    ])  # fmt: skip
    into = [{"sweep": str(other), "profile": "smoke", "name_is": "model"}]
    for extra, off in ((into, "both"), (into + [{"sweep": str(third), "profile": "smoke", "name_is": "model"}], None)):
        tune, _ = _sweeps(tmp_path, target_b=(0.001, 0.0), into_extra=extra)
        plan = make_plan(tune, "smoke", root=tmp_path / "runs")
        _fill(tmp_path / "runs", plan, _score)
        used = usages(plan, picks(plan, collect(plan)))
        first, second = [u.target for u in used if u.variant == "B" and not u.at_pick]  # in report.picks.into's order
        text = picks_markdown(plan, picks(plan, collect(plan)), used)
        assert [ln for ln in text if ln.startswith("- ")] == [
            f"- `B` ({off or f'`{first}`, `{second}`'}): differs from the pick: lr 0.001 (the pick: 0.004)"]
        assert f"{len(used) - 2} of {len(used)} variants run at their group's complete pick" in "\n".join(text)


def test_a_provisional_pick_is_shown_but_not_held_against_the_sweep_file(tmp_path):
    tune, _ = _sweeps(tmp_path, target_b=(0.001, 0.0))
    plan = make_plan(tune, "smoke", root=tmp_path / "runs")
    best_b = next(v.name for v in plan.variants if v.axes == {"model": "B", "lr": 0.004, "wd": 0.0})
    _fill(tmp_path / "runs", plan, _score, skip=(best_b,))
    found = {dict(p.group)["model"]: p for p in picks(plan, collect(plan))}
    assert (found["B"].done, found["B"].complete, found["B"].values["lr"]) == (5, False, 0.004)  # lr 0.004 at wd 0.1
    used = usages(plan, list(found.values()))
    b = next(u for u in used if u.variant == "B")
    assert b.differs and disagreements(used) == []
    assert b.status == f"differs from the provisional pick (5 of {found['B'].total} runs): lr 0.001 (the pick: 0.004); wd 0.0 (the pick: 0.1)"


def test_map_and_set_send_untuned_values_to_a_tuned_group(tmp_path):
    other = write_sweep(tmp_path / "other.yaml", aliases=ALIASES, variants=[
        {"name": "x", "axes": {"size": 3}, "overrides": {"lr": 0.002, "wd": 0.1}},
        {"name": "y", "axes": {"size": 9}, "overrides": {"lr": 0.002, "wd": 0.0}},
    ])  # fmt: skip
    tune, _ = _sweeps(tmp_path, into_extra=[{"sweep": str(other), "profile": "smoke", "set": {"model": "A"}}])
    plan = make_plan(tune, "smoke", root=tmp_path / "runs")
    _fill(tmp_path / "runs", plan, _score)
    by = {u.variant: u for u in usages(plan, picks(plan, collect(plan)))}
    assert by["x"].status == "the pick" and by["y"].differs == ["wd 0.0 (the pick: 0.1)"]
    bad = write_sweep(tmp_path / "bad.yaml", aliases=ALIASES, variants=[{"name": "z", "overrides": {"lr": 0.002}}])
    tune2, _ = _sweeps(tmp_path, into_extra=[{"sweep": str(bad), "profile": "smoke"}])
    plan2 = make_plan(tune2, "smoke", root=tmp_path / "runs")
    with pytest.raises(SweepError, match="variant 'z' has no axis 'model'; give it with set"):
        usages(plan2, picks(plan2, collect(plan2)))


def test_the_report_has_the_picks_table(tmp_path):
    tune, _ = _sweeps(tmp_path)
    plan = make_plan(tune, "smoke", root=tmp_path / "runs")
    _fill(tmp_path / "runs", plan, _score)
    report = render(plan, tmp_path / "fig", registry=None)
    assert "## Picks: the best point of each model (" in report.markdown
    assert "every variant runs at its group's complete pick" in report.markdown


def test_the_committed_sweep_files_run_at_the_recorded_picks():
    """bst/table and bst/position at bst/tune's picks, vit/data_size cpu at vit/tune data_size's: a sweep file
    changed without its tuning (or a tuning recorded without the sweep file) fails here."""
    assert registry_disagreements(read_registry()) == []


def test_registry_check_definitions_names_a_variant_off_its_pick(tmp_path, monkeypatch):
    import reproductions.sweeping.picks as picks_module

    monkeypatch.setattr(picks_module, "registry_disagreements", lambda records, registry: ["bst/tune --profile x picks: a"])
    monkeypatch.setattr("reproductions.commands.registry.stale_records", lambda records: iter(()), raising=False)
    out = io.StringIO()
    assert registry_main(["--registry", str(tmp_path), "check", "--definitions"], out=out) == 1
    assert "not at its tuned point: bst/tune --profile x picks: a" in out.getvalue()
    assert "1 swept variants not at the pick" in out.getvalue()


def test_only_and_except_give_a_targets_variants_to_two_tunings(tmp_path):
    """One profile whose variants two tunings share (vit/data_size cpu-crop-flip): ``only`` takes the variants
    matching every listed axis, ``except`` the others; a malformed part is an error naming the target."""
    tune, target = _sweeps(tmp_path)
    spec = load_sweep(tune)
    plan = make_plan(tune, "smoke", root=tmp_path / "runs")
    _fill(tmp_path / "runs", plan, _score)
    found = picks(plan, collect(plan))
    base = {"sweep": str(target), "profile": "smoke", "name_is": "model"}
    for part, names in ((None, ["A", "B"]), ({"only": {"model": ["B"]}}, ["B"]), ({"except": {"model": ["B"]}}, ["A"]),
                        ({"only": {"model": ["A", "B"], "size": [1]}}, [])):  # fmt: skip
        spec.report["picks"]["into"] = [{**base, **(part or {})}]
        assert [u.variant for u in usages(make_plan(spec, "smoke", root=tmp_path / "runs"), found)] == names, part
    spec.report["picks"]["into"] = [{**base, "only": {"model": "B"}}]
    with pytest.raises(SweepError, match=r"report.picks.into .*target.yaml smoke: only=\{'model': 'B'\}: expected axis: \[values"):
        usages(make_plan(spec, "smoke", root=tmp_path / "runs"), found)

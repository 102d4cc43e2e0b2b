"""The results registry (reproductions/sweeping/records.py, ``repro registry``): records made from
real and hand-made runs, round trips, refusals (unfinished, failed, smoke, foreign, changed
definition, duplicates), schema errors naming the file and the field, stale definitions, the
reference beside a rerun, and the committed registry against the committed pages."""

from __future__ import annotations

import copy
import errno
import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from reproductions.commands.claims import main as claims_main
from reproductions.commands.registry import main as registry_main
from reproductions.run.results import RESULTS_FILE, atomic_write_json, read_results
from reproductions.sweeping.plan import make_plan
from reproductions.sweeping.records import (
    REGISTRY_DIR,
    RecordError,
    add_runs,
    config_digest,
    definition_config,
    make_record,
    read_record,
    read_registry,
    record_path,
    stale_plateaus,
    stale_records,
)
from reproductions.sweeping.reuse import run_config
from reproductions.sweeping.sweep_report import render
from tests.report_helpers import result

REPO = Path(__file__).resolve().parents[1]
CPU = {"device": "cpu", "cpu": "Test CPU 9000 (family 25, model 1)", "cpu_capability": "AVX2"}
OTHER_CPU = {"device": "cpu", "cpu": "Other CPU (family 6, model 2)", "cpu_capability": "AVX512"}
TINY = ["--trainer.max_epochs", "2", "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "2",
        "--trainer.limit_test_batches", "2", "--model.net.init_args.depth", "1", "--trainer.callbacks=[]"]  # fmt: skip


def finished(variant: str, seed: int, acc: float, experiment: str, hardware=CPU, at="2026-12-01T10:00:00+00:00") -> dict:
    return {**result(variant, seed, acc, experiment=experiment), "hardware": hardware, "finished_at": at,
            "best": {"monitor": "val/acc", "score": acc, "path": "/somewhere/best.ckpt"}, "final": {"val/acc": acc}}  # fmt: skip


def put_record(registry: Path, sweep: str, profile: str, variant: str, seed: int, acc: float, **kw) -> Path:
    """A valid record made by the real code from a hand-made results.json (no config, no curve)."""
    res = finished(variant, seed, acc, f"{sweep}-{profile}", **kw)
    rec = make_record(registry, res, {"seed_everything": seed}, sweep, profile, {"seed_everything": seed})
    path = record_path(registry, rec)
    atomic_write_json(path, rec)
    return path


def fake_run(root: Path, sweep: str, profile: str, variant: str, seed: int, *, status="finished", config=None) -> Path:
    """A run directory whose config.yaml is what the sweep file defines now (or ``config``)."""
    run_dir = root / f"{sweep}-{profile}" / variant / f"seed{seed}"
    run_dir.mkdir(parents=True)
    cfg = config if config is not None else definition_config(sweep, profile, variant, seed)
    (run_dir / "config.yaml").write_text(json.dumps(cfg))  # JSON is YAML
    res = {**finished(variant, seed, 0.9, f"{sweep}-{profile}"), "status": status}
    (run_dir / RESULTS_FILE).write_text(json.dumps(res))
    (run_dir / "metrics.csv").write_text("epoch,step,time/fit_elapsed_s,train/loss,val/acc,val/loss\n"
                                         "0,9,,0.9,,\n0,9,1.5,,0.5,1.2\n1,19,3.0,,0.8,0.7\n")  # fmt: skip
    return run_dir


@pytest.fixture(scope="module")
def patch4_cpu():
    return definition_config("vit/patch_size", "cpu", "patch_size=4", 0)


def test_a_real_run_whose_config_differs_is_refused_then_recorded_with_its_overrides(tmp_path, capsys):
    """A fit of vit/patch_size's cpu profile made shorter by extra overrides: refused by default
    (naming the keys), recorded with --allow-changed, its numbers, curve and overrides kept."""
    from reproductions.run.cli import main as cli_main

    plan = make_plan("vit/patch_size", "cpu", seeds=1, root=tmp_path / "runs")
    run = next(r for r in plan.runs if r.variant.name == "patch_size=4")
    cli_main([*run.args, *TINY])
    registry = tmp_path / "results"
    assert registry_main(["--registry", str(registry), "add", str(tmp_path / "runs")]) == 1
    out = capsys.readouterr().out
    assert "refused" in out and "differs from what vit/patch_size profile cpu defines now" in out
    assert "trainer.max_epochs: 2 in the run, 40 in the sweep file" in out and "--allow-changed" in out
    assert registry_main(["--registry", str(registry), "add", "--allow-changed", str(tmp_path / "runs")]) == 0
    (path,) = registry.rglob("*.json")
    rec = read_record(path).data
    res = read_results(run.run_dir)
    assert path.relative_to(registry).parts[:4] == ("vit", "patch_size", "cpu", "patch_size=4")
    assert rec["test"] == res["test"] and rec["final"] == res["final"] and rec["best"]["score"] == res["best"]["score"]
    assert rec["training"] == res["training"] and rec["model"] == res["model"] and rec["hardware"] == res["hardware"]
    assert rec["overrides"]["trainer.max_epochs"] == {"run": 2, "definition": 40}
    assert rec["overrides"]["model.init_args.net.init_args.depth"] == {"run": 1, "definition": 4}
    assert "trainer.limit_train_batches" in rec["overrides"] and "data.init_args.data_dir" not in rec["overrides"]
    cols, rows = rec["curve"]["columns"], rec["curve"]["rows"]
    assert cols[:3] == ["step", "epoch", "time/fit_elapsed_s"] and "val/acc" in cols and len(rows) == 2  # one per epoch
    assert rows[-1][cols.index("val/acc")] == pytest.approx(res["final"]["val/acc"])
    text = path.read_text()
    assert path.stat().st_size < 16000 and str(tmp_path) not in text  # compact; no local path
    assert sys.prefix not in text and ".../digits.csv.gz" in text  # not inside a string either (the data's origin)
    # the same run again: skipped, not written twice
    assert registry_main(["--registry", str(registry), "add", "--allow-changed", str(run.run_dir)]) == 0
    assert "already in the registry" in capsys.readouterr().out and len(list(registry.rglob("*.json"))) == 1


def test_finished_runs_of_the_definition_are_added_and_the_rest_refused_one_line_each(tmp_path, patch4_cpu):
    runs, registry = tmp_path / "runs", tmp_path / "results"
    good = fake_run(runs, "vit/patch_size", "cpu", "patch_size=4", 0, config=patch4_cpu)
    fake_run(runs, "vit/patch_size", "cpu", "patch_size=4", 1, status="failed", config=patch4_cpu)
    unfinished = runs / "vit/patch_size-cpu" / "patch_size=2" / "seed0"
    unfinished.mkdir(parents=True)
    (unfinished / "config.yaml").write_text("seed_everything: 0\n")
    corrupt = fake_run(runs, "vit/patch_size", "cpu", "patch_size=1", 0, config={})
    (corrupt / RESULTS_FILE).write_text('{"status": "finish')
    fake_run(runs, "vit/patch_size", "smoke", "patch_size=4", 0, config={})
    fake_run(runs, "vit/tune", "smoke-data_size", "ViT", 0, config={})  # any smoke-<name> profile
    fake_run(runs, "mine", "x", "a", 0, config={})
    outcomes = {o.run_dir: o for o in add_runs(runs, registry)}
    assert outcomes[good].added is not None and len(list(registry.rglob("*.json"))) == 1
    why = {str(d.relative_to(runs)): o.refused for d, o in outcomes.items() if o.refused}
    assert why == {
        "vit/patch_size-cpu/patch_size=4/seed1": "not finished: status failed",
        "vit/patch_size-cpu/patch_size=2/seed0": "not finished: no results.json (unfinished or still running)",
        "vit/patch_size-cpu/patch_size=1/seed0": "not finished: its results.json is corrupt",
        "vit/patch_size-smoke/patch_size=4/seed0": "a 'smoke' run (seconds, for tests): not a result",
        "vit/tune-smoke-data_size/ViT/seed0": "a 'smoke-data_size' run (seconds, for tests): not a result",
        "mine-x/a/seed0": "experiment 'mine-x' is not a sweep profile's (<sweep>-<profile>, as repro sweep names it)",
    }
    rec = read_record(outcomes[good].added).data
    assert "reused_from" not in rec
    copied = fake_run(runs, "vit/patch_size", "cpu", "patch_size=4", 2)
    res = json.loads((copied / RESULTS_FILE).read_text())
    res["reused_from"] = {"run_dir": str(runs / "vit/position-cpu/learned_1d-stem/seed2"), "command": "python -m ..."}
    (copied / RESULTS_FILE).write_text(json.dumps(res))
    (o,) = add_runs(copied, registry)
    assert read_record(o.added).data["reused_from"] == "vit/position-cpu/learned_1d-stem/seed2"
    assert rec["overrides"] == {} and rec["config_digest"] == config_digest(patch4_cpu)
    assert rec["config"]["trainer.max_epochs"] == 40 and "data.init_args.data_dir" not in rec["config"]
    assert rec["curve"]["rows"] == [[9.0, 0.0, 1.5, 0.5, 1.2], [19.0, 1.0, 3.0, 0.8, 0.7]]
    assert rec["best"] == {"monitor": "val/acc", "score": 0.9}  # the checkpoint's path is not kept


def test_a_run_resumed_from_its_own_checkpoint_is_the_uninterrupted_run(tmp_path, patch4_cpu):
    """An interrupted run resumed with --ckpt_path <its dir>/checkpoints/last.ckpt resumes exactly:
    recorded with no overrides and the definition's digest. A run started from another run's
    checkpoint computed something else: refused, naming ckpt_path."""
    runs, registry = tmp_path / "runs", tmp_path / "results"
    own = runs / "vit/patch_size-cpu" / "patch_size=4" / "seed0" / "checkpoints" / "last.ckpt"
    resumed = fake_run(runs, "vit/patch_size", "cpu", "patch_size=4", 0, config={**patch4_cpu, "ckpt_path": str(own)})
    assert own.parent.parent == resumed
    other = str(own)  # seed 0's checkpoint, given to seed 1: another run's
    started = fake_run(runs, "vit/patch_size", "cpu", "patch_size=4", 1, config={**patch4_cpu, "ckpt_path": other})
    outcomes = {o.run_dir: o for o in add_runs(runs, registry)}
    rec = read_record(outcomes[resumed].added).data
    assert rec["overrides"] == {} and rec["config_digest"] == config_digest(patch4_cpu)
    assert outcomes[started].added is None and "ckpt_path: " + repr(other) + " in the run, None" in outcomes[started].refused
    moved = tmp_path / "moved" / "seed0"  # the resumed run moved elsewhere: still its own checkpoint (results.json's run_dir)
    shutil.move(resumed, moved)
    (moved / RESULTS_FILE).write_text(json.dumps({**read_results(moved), "run_dir": str(resumed)}))
    assert run_config(moved)["ckpt_path"] is None and run_config(started)["ckpt_path"] == other


@pytest.mark.parametrize("field, value, message", [
    ("schema", 99, "field 'schema' is 99, this code reads schema 1"),
    ("seed", -1, "field 'seed' is -1, not a seed (integer >= 0)"),
    ("test", {"test/acc": "high"}, "field 'test' is {\"test/acc\": \"high\"}, not an object of metric -> number"),
    ("curve", {"columns": ["step"], "rows": [[1, 2]]}, "field 'curve'"),
    ("hardware", None, "field 'hardware' is null, not an object with a device"),
    ("colour", "red", "unknown field 'colour'"),
    ("variant", ..., "field 'variant' is missing"),
])  # fmt: skip
def test_a_bad_record_is_one_error_line_naming_the_file_and_the_field(tmp_path, capsys, field, value, message):
    path = put_record(tmp_path, "vit/pooling", "cpu", "pool=cls,lr=0.002", 0, 0.95)
    data = json.loads(path.read_text())
    if value is ...:
        del data[field]
    else:
        data[field] = value
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError, match=re.escape(message)):
        read_registry(tmp_path)
    assert registry_main(["--registry", str(tmp_path), "check"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {path}: ") and message in err[0]
    path.write_text("{not json")
    with pytest.raises(RecordError, match="not valid JSON"):
        read_record(path)


def test_a_bad_record_is_bad_input_to_report_claims_and_check_alike(tmp_path, capsys):
    from reproductions.__main__ import main

    registry = tmp_path / "results"
    path = put_record(registry, "vit/pooling", "cpu", "pool=cls,lr=0.002", 0, 0.95)
    path.write_text(json.dumps({**json.loads(path.read_text()), "seed": -1}))
    runs, out = str(tmp_path / "runs"), ["--out", str(tmp_path / "claims.md"), "--figures", str(tmp_path / "figures")]
    for argv in (["report", "vit/pooling", "--profile", "cpu", "--root", runs, "--registry", str(registry)],
                 ["claims", "--root", runs, "--registry", str(registry), *out], ["registry", "check", "--registry", str(registry)]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"error: {path}: field 'seed' is -1, not a seed (integer >= 0) (schema 1); fix it or add the run again"]
    assert not (tmp_path / "claims.md").exists()


@pytest.mark.parametrize("fault, code", [("under a file", 2), ("read-only", 2), ("full disk", 1)])
def test_add_into_a_registry_that_cannot_take_the_record_is_one_line_naming_the_folder(tmp_path, capsys, monkeypatch,
                                                                                        patch4_cpu, fault, code):
    """The registry folder lies under a file, on a read-only file system (as root, chmod would not stop the write:
    the temporary file's creation fails as it would there) or on a full disk: one line naming the folder and what to
    do, exit 2 (1 for the full disk), nothing written; --registry goes before or after the subcommand."""
    from reproductions.__main__ import main

    run = fake_run(tmp_path / "runs", "vit/patch_size", "cpu", "patch_size=4", 0, config=patch4_cpu)
    registry = tmp_path / "results"
    if fault == "under a file":
        (tmp_path / "results").write_text("a file, not a folder\n")
        registry = tmp_path / "results" / "registry"
    else:
        err = errno.EROFS if fault == "read-only" else errno.ENOSPC

        def refuse(*args, dir=None, **kwargs):
            raise OSError(err, os.strerror(err), os.path.join(str(dir), ".seed0-x.json.abc.tmp"))

        monkeypatch.setattr("utils.atomic.tempfile.mkstemp", refuse)
    argv = ["registry", "add", str(run), "--registry", str(registry)] if code == 2 else \
        ["registry", "--registry", str(registry), "add", str(run)]
    assert main(argv) == code
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("error: ") and f"the registry folder {registry} " in last and ".tmp" not in last, last
    assert ("record into a folder you can write to (repro registry add --registry DIR PATH)" in last) == (code == 2)
    assert not list(tmp_path.rglob("*.json.*")) and not (registry.is_dir() and list(registry.rglob("*.json")))


def test_a_record_round_trips_and_reads_as_results(tmp_path):
    path = put_record(tmp_path, "vit/pooling", "cpu", "pool=gap,lr=0.002", 2, 0.9573)
    rec = read_record(path)
    again = copy.deepcopy(rec.data)
    assert json.loads(path.read_text()) == again and rec.key == ("vit/pooling", "cpu", "pool=gap,lr=0.002", 2)
    res = rec.results()
    assert res["status"] == "finished" and res["source"] == "registry" and res["test"]["test/acc"] == 0.9573
    assert res["training"]["fit_time_s"] == 30.0 and res["hardware"] == CPU


def test_a_record_whose_sweep_definition_changed_is_stale(tmp_path, patch4_cpu):
    runs, registry = tmp_path / "runs", tmp_path / "results"
    fake_run(runs, "vit/patch_size", "cpu", "patch_size=4", 0, config=patch4_cpu)
    (added,) = [o.added for o in add_runs(runs, registry)]
    assert list(stale_records(read_registry(registry))) == []
    data = json.loads(added.read_text())
    data["config"]["trainer.max_epochs"] = 30  # as if the sweep file had said 30 when the run was made
    data["config"]["data.init_args.an_option_removed_since"] = 1  # one-sided keys are not changes
    added.write_text(json.dumps(data))
    ((rec, why),) = stale_records(read_registry(registry))
    assert rec.path == added and "changed since it was added: trainer.max_epochs (recorded 30, now 40)" in why
    data["overrides"] = {"trainer.max_epochs": {"run": 30, "definition": 40}}  # a recorded difference is not a change
    added.write_text(json.dumps(data))
    assert list(stale_records(read_registry(registry))) == []


def test_a_rerun_beside_the_reference_reproduced_differs_and_exact(tmp_path):
    """Three variants of vit/pooling's cpu profile in a registry, a user's runs of them: one within
    the noise, one 10 standard errors lower, one the same seeds on the same hardware (exact)."""
    registry, root = tmp_path / "results", tmp_path / "runs"
    ref = {"pool=cls,lr=0.0005": [0.86, 0.87, 0.88], "pool=cls,lr=0.002": [0.95, 0.96, 0.97], "pool=cls,lr=0.008": [0.95, 0.955, 0.96]}
    for variant, accs in ref.items():
        for seed, acc in enumerate(accs):
            put_record(registry, "vit/pooling", "cpu", variant, seed, acc, hardware=OTHER_CPU if variant != "pool=cls,lr=0.008" else CPU)
    mine = {"pool=cls,lr=0.0005": [0.875, 0.865], "pool=cls,lr=0.002": [0.86, 0.861], "pool=cls,lr=0.008": [0.95, 0.955, 0.96]}
    for variant, accs in mine.items():
        for seed, acc in enumerate(accs):
            res = finished(variant, seed, acc, "vit/pooling-cpu", at=f"2026-12-02T0{seed}:00:00+00:00")
            atomic_write_json(root / "vit/pooling-cpu" / variant / f"seed{seed}" / RESULTS_FILE, res)
    put_record(registry, "vit/pooling", "cpu", "pool=gap,lr=0.002", 0, 0.95, at="2026-12-03T00:00:00+00:00")
    same = finished("pool=gap,lr=0.002", 0, 0.95, "vit/pooling-cpu", at="2026-12-03T00:00:00+00:00")  # the record's own run
    atomic_write_json(root / "vit/pooling-cpu" / "pool=gap,lr=0.002" / "seed0" / RESULTS_FILE, same)
    report = render(make_plan("vit/pooling", "cpu", root=root), tmp_path / "fig", registry=registry)
    header, rows = report.reference
    by = {row[0]: dict(zip(header, row)) for row in rows}
    assert by["pool=cls,lr=0.0005"]["verdict"].startswith("reproduced (within the reference's noise")
    assert by["pool=cls,lr=0.0005"]["reference: test acc. (%)"] == "87.00 ± 1.00" and by["pool=cls,lr=0.0005"]["ref. n"] == "3"
    # 86.05 vs 96.00: -9.95 points, s.e. sqrt(1/3 + 0.0707^2/2) = 0.580: 17.2 s.e.
    assert by["pool=cls,lr=0.002"]["yours - reference"] == "-9.95 ± 0.58"
    assert by["pool=cls,lr=0.002"]["verdict"] == "differs by 17.2 s.e. (lower)"
    assert by["pool=cls,lr=0.008"]["verdict"] == "reproduced exactly (same hardware, same seeds)"
    assert "Other CPU" in by["pool=cls,lr=0.002"]["reference hardware"]
    assert by["pool=gap,lr=0.002"]["verdict"] == "the reference's own 1 run: nothing to compare"
    for variant in [v for v in by if v.startswith("pool=gap") and v != "pool=gap,lr=0.002"]:
        assert by[variant]["verdict"] == "no reference record"
    assert "## Beside the reference" in report.markdown and report.source == "local"
    # no runs of the user's: the report is the reference's own, said so
    alone = render(make_plan("vit/pooling", "cpu", root=tmp_path / "empty"), tmp_path / "fig2", registry=registry)
    assert alone.source == "registry" and alone.reference is None
    assert "No runs of yours under" in alone.markdown and "this is the reference, the 10 records" in alone.markdown


# --------------------------------------------------------------------------- the committed registry


def test_a_tuning_grids_variants_share_one_resolution_and_get_what_the_cli_resolves(monkeypatch):
    """vit/tune data_size: its points that differ only in lr, weight decay and name are resolved once;
    each derived config is the one the CLI resolves for that point, and a derived value that the CLI
    would put elsewhere (here: a resolution whose lr is not the argument) is resolved instead."""
    from reproductions.sweeping import records, reuse

    plan = make_plan("vit/tune", "data_size", seeds=None)
    vit_1k = [r for r in plan.runs if r.variant.name.startswith("ViT,train_samples=1000,")]
    assert len(vit_1k) >= 3 and len({tuple(r.args) for r in vit_1k}) == len(vit_1k)
    truth = {r.variant.name: {**reuse.load_config(reuse.resolve_config(r.args)), "seed_everything": 1} for r in vit_1k[:3]}
    for cache in ("_DEFINITIONS", "_PLANS", "_SHAPES"):
        monkeypatch.setattr(records, cache, {})
    calls = []
    real = reuse.resolve_config
    monkeypatch.setattr(reuse, "resolve_config", lambda args: calls.append(args) or real(args))
    got = {name: definition_config("vit/tune", "data_size", name, 1) for name in truth}
    assert got == truth and len(calls) == 1

    monkeypatch.setattr(records, "_DEFINITIONS", {})
    monkeypatch.setattr(records, "_SHAPES", {})
    calls.clear()
    load = reuse.load_config

    def doubled_lr(text):  # a resolution whose lr is not the argument's
        config = load(text)
        config["model"]["init_args"]["lr"] *= 2
        return config

    monkeypatch.setattr(reuse, "load_config", doubled_lr)
    for name in truth:
        definition_config("vit/tune", "data_size", name, 1)
    assert len(calls) == 3  # nothing derived from a resolution the arguments do not reproduce


def test_every_committed_record_is_valid_and_matches_its_sweep_file():
    records = read_registry(REGISTRY_DIR)
    assert all(r.path == record_path(REGISTRY_DIR, r.data) for r in records)  # each where its identity says
    assert [f"{r.path}: {why}" for r, why in stale_records(records)] == []
    assert [str(r.path) for r, _ in stale_plateaus(records)] == []  # each plateau the rule's reading of its curve


def test_check_fails_on_a_plateau_recorded_under_an_older_rule_and_fixes_it(tmp_path):
    """A record whose plateau says "cannot tell" where the rule now reads its 3-validation curve as still
    rising: `check` names it and exits 1; `--fix-plateaus` writes the rule's reading and nothing else."""
    import io

    path = put_record(tmp_path, "vit/patch_size", "cpu", "patch_size=4", 0, 0.84)
    data = json.loads(path.read_text())
    data["curve"] = {"columns": ["step", "epoch", "val/acc"], "rows": [[100, 0, 0.65], [200, 1, 0.77], [300, 2, 0.84]]}
    data["plateau"] = {"metric": "val/acc", "mode": "max", "threshold": 0.002, "last_part": 0.2, "gain": None,
                       "validations": 3, "stopped_early": None, "reached": None}  # fmt: skip
    atomic_write_json(path, data)
    out = io.StringIO()
    assert registry_main(["--registry", str(tmp_path), "check"], out=out) == 1
    assert f"{path}: plateau reached None (gain None) -> False (gain 0.07)" in out.getvalue()
    assert "1 of 1 records hold a plateau" in out.getvalue() and "--fix-plateaus" in out.getvalue()
    assert registry_main(["--registry", str(tmp_path), "check", "--fix-plateaus"], out=io.StringIO()) == 0
    fixed = json.loads(path.read_text())
    assert fixed["plateau"]["reached"] is False and fixed["plateau"]["gain"] == pytest.approx(0.07)
    assert {k: v for k, v in fixed.items() if k != "plateau"} == {k: v for k, v in data.items() if k != "plateau"}
    out = io.StringIO()
    assert registry_main(["--registry", str(tmp_path), "check"], out=out) == 0
    assert "every recorded plateau is the rule's reading of its curve" in out.getvalue()


def test_the_committed_claims_page_is_the_registrys_page(tmp_path, capsys, monkeypatch):
    """docs/claims.md and its figures are what `repro claims` makes on a clone without runs/ (run
    here from an empty directory), from results/ alone."""
    monkeypatch.chdir(tmp_path)
    argv = ["--check", "--out", str(REPO / "docs/claims.md"), "--figures", str(REPO / "docs/figures/claims")]
    code = claims_main(argv)
    assert code == 0, capsys.readouterr().out


def test_the_readme_tables_are_the_registrys(capsys):
    assert registry_main(["tables", "--check"]) == 0, capsys.readouterr().out


def test_the_records_as_wandb_reference_runs_offline(tmp_path, monkeypatch):
    """``repro registry wandb``: each record a run of job type reference in its sweep's group,
    its curve as history at its steps, its results as the summary, a fixed id; sync finds it."""
    from reproductions.commands.sync import find_offline_runs
    from tests.helpers import wandb_records, wandb_summary

    monkeypatch.setenv("WANDB_MODE", "offline")
    registry = tmp_path / "results"
    runs = tmp_path / "runs"
    fake_run(runs, "vit/patch_size", "cpu", "patch_size=4", 0, config={"seed_everything": 0})
    (added,) = [o.added for o in add_runs(runs, registry, allow_changed=True)]
    rec = read_record(added)
    assert registry_main(["--registry", str(registry), "wandb", "--root", str(tmp_path / "wb")]) == 0
    (found,) = find_offline_runs(tmp_path / "wb" / "registry")
    assert found.run_id == "ref" + rec.data["id"]
    assert found.owner == tmp_path / "wb/registry/vit/patch_size/cpu/patch_size=4/seed0"
    (path,) = found.folder.glob("run-*.wandb")
    records = wandb_records(path)
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert run.run_group == "vit/patch_size-cpu" and run.job_type == "reference"
    assert run.display_name == "vit/patch_size-cpu/patch_size=4/seed0/reference"
    assert set(run.tags) >= {"reference", "patch_size=4", "cpu", "seed0"}
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["run"]["variant"] == "patch_size=4" and config["record"] == rec.data["id"]
    steps = [r.history.step.num for r in records if r.WhichOneof("record_type") == "history"]
    assert steps == [9, 19]  # the record's two validations at their steps
    summary = wandb_summary(path)
    assert summary["test/acc"] == 0.9 and summary["val/acc"] == 0.8 and summary["results/fit_time_s"] == 30.0


def test_skip_recorded_trains_only_the_runs_the_registry_does_not_hold_with_this_config(tmp_path, monkeypatch, patch4_cpu):
    """A campaign on a machine without its run directories: --skip-recorded skips a run whose record has the
    config the sweep resolves to now (same variant and seed), and runs the one recorded with another config,
    the one not recorded, and every run when extra overrides change what they compute."""
    import io

    import reproductions.sweeping.records as records
    from reproductions.commands.sweep import main as sweep_main
    from tests.sweep_helpers import fake_runner

    registry = tmp_path / "results"
    monkeypatch.setattr(records, "REGISTRY_DIR", registry)
    now = make_record(tmp_path, finished("patch_size=4", 0, 0.9, "vit/patch_size-cpu"), patch4_cpu,
                      "vit/patch_size", "cpu", patch4_cpu)  # fmt: skip
    atomic_write_json(record_path(registry, now), now)
    older = {**patch4_cpu, "seed_everything": 1, "model": {**patch4_cpu["model"], "init_args": {
        **patch4_cpu["model"]["init_args"], "lr": 0.5}}}  # recorded with another learning rate
    stale = make_record(tmp_path, finished("patch_size=4", 1, 0.8, "vit/patch_size-cpu"), older, "vit/patch_size", "cpu", older)
    atomic_write_json(record_path(registry, stale), stale)

    argv = ["vit/patch_size", "--profile", "cpu", "--variant", "patch_size=4", "--seeds", "3",
            "--root", str(tmp_path / "runs"), "--no-report", "--skip-recorded"]  # fmt: skip
    out, calls = io.StringIO(), []
    from reproductions.sweeping import reuse

    monkeypatch.setattr(records, "_SHAPES", {})
    resolutions, real = [], reuse.resolve_config
    monkeypatch.setattr(reuse, "resolve_config", lambda args: resolutions.append(args) or real(args))
    assert sweep_main([*argv, "--dry-run"], runner=fake_runner(calls=calls), out=out) == 0
    assert len(resolutions) == 1  # the two recorded seeds share one resolution of the CLI
    assert f"patch_size=4 seed0 (recorded, skip: {record_path(registry, now).name})" in out.getvalue()
    assert "--skip-recorded: 1 of the runs to run are in the registry with this config (skipped): patch_size=4 seed0; 2 to run" in out.getvalue()
    assert calls == []
    out = io.StringIO()
    assert sweep_main(argv, runner=fake_runner(calls=calls), out=out) == 0
    assert sorted(calls) == ["patch_size=4 seed1", "patch_size=4 seed2"], out.getvalue()
    assert "1 skipped (recorded)" in out.getvalue()
    out = io.StringIO()  # another budget: the record is not this run's
    assert sweep_main([*argv, "--dry-run", "--", "--trainer.max_epochs", "1"], out=out) == 0
    assert "--skip-recorded: 0 of the runs" in out.getvalue() and "recorded, skip" not in out.getvalue()
    out = io.StringIO()  # without the option the run directories alone decide: the recorded run trains again
    shutil.rmtree(tmp_path / "runs")
    assert sweep_main([*argv[:-1], "--dry-run"], out=out) == 0
    assert "patch_size=4 seed0 (run)" in out.getvalue() and "recorded, skip" not in out.getvalue()
